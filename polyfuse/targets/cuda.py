"""CUDA compilation: GPU kernel -> CUDA C -> PTX and cubin with NVRTC.

NVRTC runs without a GPU, so every kernel is compiled (and checked) on any machine.
The architecture is the target's (``cuda:sm_80``), else the device's when one is
present, else ``sm_90``. A compiled
kernel keeps the text of each stage: ``cuda`` (the source), ``ptx`` and ``cubin`` (a
summary: the cubin itself is binary and kept in :attr:`CudaBinary.cubin`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

from polyfuse.errors import CodegenError, TargetError
from polyfuse.ir.gpu import GpuKernel
from polyfuse.targets.cuda_codegen import dynamic_shared, emit_cuda
from polyfuse.targets.target import Target

DEFAULT_ARCH = "sm_90"
# NVRTC's flags. The safe parts of fast math only: multiply-adds contract to FMA (--fmad,
# CUDA's default) and NVVM vectorizes device code more aggressively; what changes results
# (flush-to-zero, approximate division and square root, __expf-style intrinsics) stays off.
OPTIONS = ("-std=c++17", "--device-as-default-execution-space", "--fmad=true",
           "--extra-device-vectorization")


def with_arch(target: Target) -> Target:
    """``target``, a GPU target, with its architecture: the one it names, else this
    machine's GPU's, else :data:`DEFAULT_ARCH` (tuning records are kept per architecture)."""
    if not target.backend.archs or target.cpu:
        return target
    from polyfuse.targets.cuda_driver import available_device
    gpu = available_device()
    return replace(target, cpu=gpu.limits.arch if gpu is not None else DEFAULT_ARCH)


@dataclass(frozen=True, slots=True)
class LaunchInfo:
    """How the runtime launches one function of a cubin."""

    name: str
    grid: int
    block: tuple[int, int, int]
    shared: int = 0     # bytes of dynamic shared memory (tiles above 48 KiB in all)


@dataclass
class CudaBinary:
    name: str
    arch: str
    cubin: bytes = field(repr=False)
    launches: tuple[LaunchInfo, ...]
    stages: dict[str, str] = field(repr=False, default_factory=dict)


def _nvrtc():  # type: ignore[no-untyped-def]
    try:
        from cuda.bindings import nvrtc
    except ImportError as err:
        raise TargetError("the cuda target needs NVRTC: pip install 'cuda-python==13.0.3' "
                          f"'nvidia-cuda-nvrtc==13.0.88' ({err})") from None
    return nvrtc


def _check(nvrtc, result, what: str, log: str = "") -> None:  # type: ignore[no-untyped-def]
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(result)
        raise CodegenError(f"NVRTC {what} failed ({text.decode()})" + (f":\n{log}" if log else ""))


def nvrtc_compile(source: str, name: str, arch: str = DEFAULT_ARCH) -> tuple[str, bytes, str]:
    """PTX text, cubin and ptxas's resource report (registers, shared memory, spills per
    function: :func:`polyfuse.targets.cuda_sass.resources` reads it) of CUDA C ``source``
    for ``arch`` (``sm_XX``)."""
    nvrtc = _nvrtc()
    err, program = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    _check(nvrtc, err, "program creation")
    try:
        options = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in OPTIONS),
                   b"--ptxas-options=-v"]
        (result,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _check(nvrtc, result, f"compilation of kernel '{name}' for {arch}", _log(nvrtc, program))
        err, size = nvrtc.nvrtcGetPTXSize(program)
        _check(nvrtc, err, "PTX size")
        ptx = b" " * size
        (err,) = nvrtc.nvrtcGetPTX(program, ptx)
        _check(nvrtc, err, "PTX")
        err, size = nvrtc.nvrtcGetCUBINSize(program)
        _check(nvrtc, err, "cubin size")
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(program, cubin)
        _check(nvrtc, err, "cubin")
        report = "\n".join(line for line in _log(nvrtc, program).splitlines()
                           if line.startswith("ptxas") and "Compile time" not in line)
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    return ptx.rstrip(b"\0").decode(), cubin, report


def _log(nvrtc, program) -> str:  # type: ignore[no-untyped-def]
    _, size = nvrtc.nvrtcGetProgramLogSize(program)
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(program, log)
    return log.rstrip(b"\0").decode(errors="replace")


def cubin_summary(cubin: bytes, arch: str, functions: list[str]) -> str:
    """The text a cubin stands for in ``stages``: size, digest, architecture, functions."""
    digest = hashlib.sha256(cubin).hexdigest()[:16]
    return f"cubin {arch} {len(cubin)} bytes sha256:{digest} functions: {', '.join(functions)}"


def compile_gpu_kernel(kernel: GpuKernel, arch: str = DEFAULT_ARCH) -> CudaBinary:
    """CUDA C, PTX and cubin of every launch of ``kernel``."""
    source = emit_cuda(kernel)
    ptx, cubin, report = nvrtc_compile(source, kernel.name, arch)
    names = [launch.name for launch in kernel.launches]
    stages = {"cuda": source, "ptx": ptx, "cubin": cubin_summary(cubin, arch, names), "ptxas": report}
    launches = tuple(LaunchInfo(launch.name, launch.grid, launch.block, dynamic_shared(launch))
                     for launch in kernel.launches)
    return CudaBinary(kernel.name, arch, cubin, launches, stages)
