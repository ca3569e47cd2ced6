"""Running definitions as native CPU code: schedule, JIT, call through the native runtime."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from polyfuse.errors import BoundsError
from polyfuse.ir.comprehension import Definition
from polyfuse.ir.loops import ERROR_BUFFER, BufferRole
from polyfuse.runtime import native
from polyfuse.scheduler.heuristics import default_options
from polyfuse.scheduler.options import MappingOptions
from polyfuse.scheduler.pipeline import schedule_definition
from polyfuse.targets import Target
from polyfuse.targets.cpu import compile_kernel, vector_bits


class CpuExecutable:
    """A JIT-compiled kernel with its buffers' shapes; calling it allocates the outputs."""

    def __init__(self, d: Definition, sizes: Mapping[str, int], target: Target,
                 options: MappingOptions | None, stages: dict[str, str]) -> None:
        self.options = options or default_options(d, dict(sizes), vector_bits(target))
        stages["options"] = repr(self.options)
        self.kernel = schedule_definition(d, dict(sizes), self.options, stages)
        self.jit = compile_kernel(self.kernel, target, self.options.num_threads)
        stages.update(self.jit.stages)
        self.inputs = [b.name for b in self.kernel.buffers if b.role is BufferRole.IN]
        self.outputs = [b for b in self.kernel.buffers if b.role is BufferRole.OUT]
        self.checks_indices = any(b.name == ERROR_BUFFER for b in self.kernel.buffers)
        self.scalars = [s.name for s in d.scalars]

    def __call__(self, values: Mapping[str, object]) -> dict[str, np.ndarray]:
        outs = {b.name: np.zeros(b.shape, b.dtype.numpy) for b in self.outputs}
        args: list[object] = [np.ascontiguousarray(values[n]) for n in self.inputs]
        args += outs.values()
        error = np.zeros(1, np.int64)
        if self.checks_indices:
            args.append(error)
        args += [np.asarray(values[n]).item() for n in self.scalars]
        native.call(self.jit.address, args)
        if error[0]:
            raise BoundsError(f"kernel '{self.kernel.name}' read a tensor out of bounds through an "
                              "index taken from another tensor (an index tensor holds a value "
                              "outside the dimension it indexes); no output was returned")
        return outs
