"""The backend registry: what polyfuse does with the code of each target name.

One :class:`Backend` per name a target spec starts with (``reference``, ``x86``,
``aarch64``, ``cuda``; ``host`` is x86 or aarch64). Code asks a target's backend
(:attr:`polyfuse.targets.Target.backend`) what to do instead of comparing names: which
code generator builds its kernels, where its tensors live, whether it takes a CPU and
features, runs a model as one program, saves bundles.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Codegen(enum.Enum):
    """What builds a kernel (the keys of the runtime's builders)."""

    INTERPRETER = "interpreter"   # the numpy interpreter of the comprehension IR
    LLVM = "llvm"                 # LLVM IR -> machine code for a CPU (JIT or object)
    CUDA = "cuda"                 # GPU mapping -> CUDA C -> NVRTC -> cubin


class Device(enum.Enum):
    """Where a kernel's tensors live while it runs."""

    HOST = "host"   # this process's memory (or an emulated process fed through files)
    GPU = "gpu"     # GPU memory: numpy arrays are copied, GPU arrays used in place


@dataclass(frozen=True, slots=True)
class Backend:
    """One backend: how code for the targets of one name is made and run.

    ``cpus``: a CPU backend (machine code through LLVM), which takes ``:CPU`` and
    ``+FEATURE``, runs natively where this machine's CPU is of its architecture and
    under qemu-user elsewhere, and runs a model's kernels as one native program.
    ``default_cpu`` is the CPU a spec without one means (empty: this machine's), and
    ``feature_cpus`` the CPU that a feature picks when no CPU is named; ``features``
    are always on (they are left out of the spec). ``archs``: a GPU backend's
    architectures, which ``:ARCH`` names (``cuda:sm_80``; without one, the GPU's).
    """

    name: str
    codegen: Codegen
    device: Device = Device.HOST
    triple: str = ""                # LLVM target triple
    cpus: bool = False
    bundles: bool = False           # saves models as ahead-of-time bundles (NAME.o, NAME.h, ...)
    default_cpu: str = ""
    feature_cpus: tuple[tuple[str, str], ...] = ()
    features: tuple[str, ...] = ()
    archs: tuple[str, ...] = ()

    def cpu_for(self, features: tuple[str, ...]) -> str:
        """The CPU a spec naming ``features`` and no CPU means."""
        return next((cpu for f, cpu in self.feature_cpus if f in features), self.default_cpu)


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("reference", Codegen.INTERPRETER),
    Backend("x86", Codegen.LLVM, triple="x86_64-unknown-linux-gnu", cpus=True, bundles=True),
    Backend("aarch64", Codegen.LLVM, triple="aarch64-unknown-linux-gnu", cpus=True, bundles=True,
            default_cpu="neoverse-n1", feature_cpus=(("sve", "a64fx"),), features=("neon",)),
    Backend("cuda", Codegen.CUDA, Device.GPU, triple="nvptx64-nvidia-cuda",
            archs=("sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_100", "sm_120")),
)}
