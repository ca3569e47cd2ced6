"""Built kernels as values: what a build in one process hands to a run in another.

An :class:`Artifact` is a :class:`~polyfuse.runtime.kernel.SpecializedKernel` without
its executable: the definition, sizes and target, the stage texts, and the code that
was built, as bytes with the layout that calls it. It pickles, and :func:`load_kernel`
makes a kernel of it again in any process of a machine like the one that built it
(the same CPU features; the same GPU architecture), without compiling and without the
disk cache:

* CPU code (LLVM) is the relocatable object the JIT emitted, linked into a new JIT
  engine; code for a CPU this process cannot run becomes a cross executable (qemu).
* CUDA code is the cubin, loaded on the GPU at the kernel's first call.
* The reference interpreter compiles nothing: its artifact holds no code, and loading
  it makes the interpreter's executable again from the definition and sizes (the
  same executable, deterministically: there is nothing to rebuild but a closure).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from polyfuse.errors import ArgumentError
from polyfuse.ir.comprehension import Definition
from polyfuse.ir.comprehension_interpreter import interpret
from polyfuse.ir.serialize import decode, encode
from polyfuse.ir.sizes import bind_sizes
from polyfuse.runtime.kernel import Executable, SpecializedKernel
from polyfuse.targets import Codegen, Target


@dataclass(frozen=True)
class Artifact:
    """A built kernel's code and what calling it needs, ready to load elsewhere."""

    definition: Definition                  # as defined, before its sizes were bound
    sizes: tuple[tuple[str, int], ...]
    target: Target
    code: bytes = field(repr=False)         # object file, cubin, or b"" (interpreter)
    layout: Mapping[str, Any] = field(repr=False, hash=False)  # the layout's JSON
    stages: Mapping[str, str] = field(repr=False, hash=False)  # stage name -> text


# (code, layout JSON) of an executable; and the executable again from an artifact
Saver = Callable[[Any], tuple[bytes, dict[str, Any]]]
Loader = Callable[[Artifact], Executable]


def save_kernel(kernel: SpecializedKernel) -> Artifact:
    """The artifact of a built kernel (its executable is left behind)."""
    if kernel.unbound is None:
        raise ArgumentError(f"kernel '{kernel.definition.name}' does not keep the definition it "
                            "was built from; save kernels that Kernel.specialize returned")
    save, _ = CODECS[kernel.target.backend.codegen]
    code, layout = save(kernel.run)
    return Artifact(kernel.unbound, tuple(sorted(kernel.sizes.items())), kernel.target, code,
                    layout, dict(kernel.stages))


def load_kernel(artifact: Artifact) -> SpecializedKernel:
    """The kernel of ``artifact``, callable in this process."""
    _, load = CODECS[artifact.target.backend.codegen]
    sizes = dict(artifact.sizes)
    return SpecializedKernel(bind_sizes(artifact.definition, sizes), sizes, artifact.target,
                             dict(artifact.stages), load(artifact), artifact.definition)


def _save_nothing(executable: Any) -> tuple[bytes, dict[str, Any]]:
    return b"", {}


def _interpreter(artifact: Artifact) -> Executable:
    d, sizes = artifact.definition, dict(artifact.sizes)
    return lambda values: interpret(d, values, sizes)


def _save_cpu(executable: Any) -> tuple[bytes, dict[str, Any]]:
    # a CpuExecutable keeps its object with the JIT, a CrossExecutable itself
    jit = getattr(executable, "jit", executable)
    return jit.object, {"layout": encode(executable.layout)}


def _load_cpu(artifact: Artifact) -> Executable:
    from polyfuse.runtime.cpu import executable   # loads LLVM
    from polyfuse.runtime.program import Layout
    return executable(artifact.code, decode(Layout, artifact.layout["layout"]),
                      dict(artifact.stages), artifact.target)


def _save_cuda(executable: Any) -> tuple[bytes, dict[str, Any]]:
    return executable.binary.cubin, {"layout": encode(executable.layout),
                                     "arch": executable.binary.arch}


def _load_cuda(artifact: Artifact) -> Executable:
    from polyfuse.runtime.cuda import CudaExecutable, CudaLayout   # loads NVRTC
    from polyfuse.targets.cuda import CudaBinary
    layout = decode(CudaLayout, artifact.layout["layout"])
    binary = CudaBinary(layout.name, artifact.layout["arch"], artifact.code, layout.launches,
                        dict(artifact.stages))
    return CudaExecutable(binary, layout)


# how the executables of each code generator become bytes and back
CODECS: dict[Codegen, tuple[Saver, Loader]] = {
    Codegen.INTERPRETER: (_save_nothing, _interpreter),
    Codegen.LLVM: (_save_cpu, _load_cpu),
    Codegen.CUDA: (_save_cuda, _load_cuda),
}
