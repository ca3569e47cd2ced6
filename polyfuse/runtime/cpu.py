"""Running definitions as native CPU code: schedule, JIT, call through the native runtime.

Code for a CPU this process cannot run (aarch64 on x86) is compiled to an object and
run through :mod:`polyfuse.runtime.cross` instead.

Compiled kernels are cached in this process (by key) and on disk (see
:mod:`polyfuse.runtime.cache`), so the same definition, sizes, target and options
compile once per machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from polyfuse.errors import BoundsError, IRVerificationError, TargetError
from polyfuse.ir.comprehension import Definition
from polyfuse.ir.loops import touched
from polyfuse.ir.types import DType
from polyfuse.runtime import cache, native
from polyfuse.runtime.arguments import abi_scalar
from polyfuse.runtime.program import Layout
from polyfuse.scheduler.heuristics import default_options
from polyfuse.scheduler.model import zero_filled_outputs
from polyfuse.scheduler.options import MappingOptions
from polyfuse.scheduler.pipeline import Usage, schedule_definition, symbolic_signature
from polyfuse.targets import Target
from polyfuse.targets.cpu import (JitKernel, assembly, compile_kernel, compile_object, emit_llvm, load_object,
                                  machine, missing_features, native_tiles, runs_natively, target_description)

_COMPILED: cache.Resident[Any] = cache.Resident()
STATS = {"compiled": 0, "disk": 0, "memory": 0}  # where build() found its kernels


class CpuExecutable:
    """A compiled kernel and its layout; calling it allocates the outputs and runs it."""

    def __init__(self, jit: JitKernel, layout: Layout, target: Target, key: str | None = None) -> None:
        self.jit = jit
        self.layout = layout
        self.key = key   # its entry in the disk cache
        self.stages = jit.stages
        self._outputs = [(n, s, DType(dt).numpy, z) for n, s, dt, z in layout.outputs]
        missing = missing_features(target)
        # code for a CPU this one is not (compiled ahead of time): refused when called
        self.refusal = None if not missing else (
            f"kernel '{layout.name}' was compiled for {target}, which needs {', '.join(missing)}; this "
            f"CPU lacks {'it' if len(missing) == 1 else 'them'}. Compile for target='host' to run it "
            "here (code for another CPU can still be bundled or saved)")

    def __call__(self, values: Mapping[str, object],
                 shapes: Sequence[tuple[int, ...]] | None = None) -> dict[str, np.ndarray]:
        """The outputs; an output named in ``values`` (a checked, writable, C-contiguous
        array: ``out=``) is updated in place from its contents, never zeroed. ``shapes``:
        the outputs' shapes at this call, which a kernel for symbolic sizes needs (with
        its sizes in ``values``)."""
        if self.refusal:
            raise TargetError(self.refusal)
        layout = self.layout
        if shapes is None and layout.symbolic:
            raise IRVerificationError(f"kernel '{layout.name}' was compiled for symbolic sizes: its caller "
                                      "gives the outputs' shapes of each call")
        # aligned, and reused from freed outputs of the same size (no page faults)
        given = layout.given_outputs(values)
        outs = {n: native.empty_aligned(s if shapes is None else shapes[k], dt, 64, z)
                if n not in given else _aligned(given[n]) for k, (n, s, dt, z) in enumerate(self._outputs)}
        args: list[object] = list(layout.arguments(values))
        args += outs.values()
        error = np.zeros(1, np.int64)
        if layout.checks_indices:
            args.append(error)
        args += [abi_scalar(values[n]) for n in layout.scalars]
        native.call(self.jit.address, args)
        if error[0]:
            raise BoundsError.in_kernel(layout.name)
        for n, array in outs.items():
            if n in given and given[n] is not array:   # an unaligned given output
                np.copyto(given[n], array)
                outs[n] = given[n]
        return outs


def _aligned(array: np.ndarray) -> np.ndarray:
    """A given output as the kernel takes it: 64-byte aligned (its code may assume so),
    else an aligned copy of its contents, copied back after the call."""
    if array.ctypes.data % 64 == 0:
        return array
    copy = native.empty_aligned(array.shape, array.dtype, 64, False)
    np.copyto(copy, array)
    return copy


def build(d: Definition, sizes: Mapping[str, int], target: Target,
          options: MappingOptions | None, stages: dict[str, str],
          usage: Usage = Usage(), symbolic: frozenset[str] = frozenset()) -> Any:
    """The executable for ``d`` at ``sizes``: from this process, the disk, or compiled;
    a :class:`CpuExecutable`, or a :class:`~polyfuse.runtime.cross.CrossExecutable`
    for code this process cannot run. ``usage``: what the caller promises (weights that
    the kernel may read packed ahead of time, outputs it need not store). Sizes named in
    ``symbolic`` are the kernel's int64 scalars (the caller passes them with the arrays):
    one kernel serves every value of them with the same
    :func:`~polyfuse.scheduler.pipeline.symbolic_signature` (and ``options``, which the
    caller then fixes: the heuristic's choice depends on the sizes)."""
    sizes = dict(sizes)
    with cache.SCHEDULING:
        options = options or default_options(d, sizes, machine(target))
        shape = symbolic_signature(d, sizes, symbolic) if symbolic else repr(sorted(sizes.items()))
    key = cache.kernel_key(str(d), shape, str(target),
                           target_description(target), repr(options), usage.key(),
                           repr(sorted(native_tiles(target))))
    exe = cache.fetch(
        key, _COMPILED, STATS, Layout,
        lambda obj, layout, stages: executable(obj, layout, stages, target, key),
        lambda: _compile(d, sizes, target, options, key, usage, symbolic))
    staged(exe, stages, target)
    return exe


def saved_executable(key: str, target: Target) -> Any:
    """The kernel stored under ``key`` (a :class:`CpuExecutable`'s ``key``), from this
    process or the disk; None where neither has it."""
    return cache.fetch(key, _COMPILED, STATS, Layout,
                       lambda obj, layout, stages: executable(obj, layout, stages, target, key), None)


def staged(exe: Any, stages: dict[str, str], target: Target) -> None:
    """``exe``'s stages (its LLVM IR, ...) added to ``stages``, its assembly printed
    when first read."""
    stages.update(exe.stages)
    if "asm" not in stages and "llvm_opt" in stages and hasattr(stages, "later"):
        stages.later("asm", lambda: _assembly(stages["llvm_opt"], target))


def _assembly(llvm_opt: str, target: Target) -> str:
    with cache.CODEGEN:
        return assembly(llvm_opt, target)


def executable(obj: bytes, layout: Layout, stages: dict[str, str], target: Target, key: str | None = None) -> Any:
    """The kernel in object code ``obj`` (the disk cache's entry ``key``) loaded for
    ``target``: into this process where its code runs here, else to run under the emulator."""
    if runs_natively(target):
        with cache.CODEGEN:
            native_tiles(target)   # asks Linux for AMX's tiles, which the code may use (a saved artifact's too)
            jit = load_object(layout.name, obj, stages, parallel_for=native.parallel_for_threads_address())
        return CpuExecutable(jit, layout, target, key)
    from polyfuse.runtime.cross import CrossExecutable
    return CrossExecutable(layout, stages, obj, target)


def _compile(d: Definition, sizes: dict[str, int], target: Target, options: MappingOptions,
             key: str, usage: Usage, symbolic: frozenset[str] = frozenset()) -> Any:
    """Schedule ``d`` and write its LLVM IR (under :data:`cache.SCHEDULING`), then make
    its machine code (under :data:`cache.CODEGEN`): another thread may schedule the next
    kernel meanwhile."""
    stages = {"options": repr(options)}
    initialized: set[str] = set()
    with cache.SCHEDULING:
        kernel = schedule_definition(d, sizes, options, stages, initialized, usage, native_tiles(target),
                                     machine(target), symbolic)
        layout = Layout.of(kernel, zero_filled_outputs(d, sizes) - initialized - (usage.discarded - touched(kernel)))
        text = emit_llvm(kernel, target, options.num_threads)
    if runs_natively(target):
        with cache.CODEGEN:
            jit = compile_kernel(text, target, parallel_for=native.parallel_for_threads_address(),
                                 unroll=not symbolic)
        jit.stages.update(stages)
        cache.store(key, jit.object, layout, jit.stages)
        return CpuExecutable(jit, layout, target, key)
    with cache.CODEGEN:
        obj, code_stages = compile_object(text, target, not symbolic)
    stages.update(code_stages)
    cache.store(key, obj, layout, stages)
    return executable(obj, layout, stages, target)
