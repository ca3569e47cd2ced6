"""CPU code generation: LLVM IR -> optimized module -> JIT function or object file.

Generated code calls the runtime's parallel-for (``PARALLEL_FOR``); the runtime gives its
address to :func:`compile_kernel` and :func:`load_object` (targets do not import the runtime).
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import platform
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

import llvmlite.binding as llvm

from polyfuse.errors import CodegenError, TargetError
from polyfuse.ir.loops import LoopKernel
from polyfuse.ir.machine import GENERIC_AARCH64, GENERIC_X86, MACHINES, Machine
from polyfuse.targets.diagnostics import caught_stderr, quiet_remarks
from polyfuse.targets.llvm_dot import ISAS, Isa, inline_dot_products
from polyfuse.targets.llvm_kernel import PARALLEL_FOR, emit_module
from polyfuse.targets.llvm_tiles import PERMISSION, TILES, link_tile_products

if TYPE_CHECKING:   # only a type here: targets.target imports this module (through backends)
    from polyfuse.targets.target import Target


@functools.cache
def _initialize() -> None:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    # LICM keeps a loop's accumulators in registers only while the loop has at most this
    # many memory accesses (250 by default): a register block over an unrolled 3x3 window
    # has more, and then loaded and stored every accumulator on every step
    llvm.set_option("", "-licm-mssa-max-acc-promotion=4000")
    # The loop unroller's budget (O3's is 300). The register blocks come unrolled already;
    # at 300 LLVM also unrolled window loops around them (a 5x5 depthwise convolution's
    # taps, each a guarded block of vector FMAs) and then spent seconds on the copies:
    # at 150 (O2's) MobileNetV3-Small compiles in 10 s instead of 17 and EfficientNet-B0
    # in 15 instead of 24, and both run as fast (benchmarks/LOG.md). Like the option
    # above, it holds for every llvmlite compilation in the process.
    llvm.set_option("", "-unroll-threshold=150")


def target_machine(target: Target) -> llvm.TargetMachine:
    """A new LLVM target machine (a JIT engine takes ownership of the one it is given)
    emitting position-independent code for the target's CPU and features; for ``x86``
    without a CPU named, this machine's CPU and features (AVX-512 here)."""
    _initialize()
    cpu, features = _cpu_and_features(target)
    triple = target.triple or llvm.get_default_triple()
    if target.cpu or target.features:
        _check_names(triple, cpu, features, str(target))
    return llvm.Target.from_triple(triple).create_target_machine(
        cpu=cpu, features=features, opt=3, reloc="pic", codemodel="default")


@functools.cache
def _check_names(triple: str, cpu: str, features: str, spec: str) -> None:
    """Refuse a CPU or feature LLVM does not know: it would say so on stderr, ignore
    it, and may then abort the process. LLVM has no API that lists them, so a target
    machine is made once with stderr caught to see what LLVM says."""
    with caught_stderr() as caught:
        llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features)
    said = caught[0]
    unknown = sorted(set(re.findall(r"'([^']*)' is not a recognized (?:processor|feature)", said)))
    if unknown:
        raise TargetError(f"target '{spec}': LLVM does not know {', '.join(map(repr, unknown))} "
                          f"for {triple.split('-')[0]}; name a CPU such as 'x86:skylake' or "
                          "'aarch64:neoverse-n1' and features such as '+avx2' or '+sve', or use "
                          "'host' for this machine")


@functools.cache
def _cpu_and_features(target: Target) -> tuple[str, str]:
    if not target.cpu:   # this machine's CPU (x86, or "host" on an ARM machine)
        return llvm.get_host_cpu_name(), ",".join(
            filter(None, [llvm.get_host_cpu_features().flatten(), target.llvm_features]))
    return target.cpu, target.llvm_features


@functools.cache
def runs_natively(target: Target) -> bool:
    """Whether code for ``target`` can run in this process: the host's architecture,
    and (on aarch64) every feature asked for present on this CPU."""
    arch = target.backend.triple.split("-")[0]
    if not target.backend.cpus or arch != llvm.get_process_triple().split("-")[0]:
        return False
    if arch == "x86_64":
        return True
    _initialize()
    present = llvm.get_host_cpu_features()
    return all(present.get(f, False) for f in target.features)


@functools.cache
def missing_features(target: Target) -> tuple[str, ...]:
    """What code for ``target``, which this process runs natively, needs of the CPU that
    this one lacks: the vectors of a named x86 CPU (``avx512f`` for skylake-avx512 on an
    AVX2 machine) and the features the target adds. Such code stops at its first
    instruction of them (SIGILL), so it must not be called here."""
    if not runs_natively(target) or target.backend.triple.split("-")[0] != "x86_64" or not target.cpu:
        return ()
    present = {f for f, on in llvm.get_host_cpu_features().items() if on}
    needed = {512: ("avx512f",), 256: ("avx2",), 128: ()}[vector_bits(target)]
    return tuple(f for f in (*needed, *target.features) if f not in present)


def emulated(target: Target) -> bool:
    """Whether ``target``'s code runs on this machine only under an emulator (its times
    then say nothing of the real CPU)."""
    return target.backend.cpus and not runs_natively(target)


def _host_features(target: Target) -> Mapping[str, bool] | None:
    """This machine's CPU features where ``target`` is code for it (its architecture, no
    CPU named), else None."""
    _initialize()
    if target.cpu or llvm.get_default_triple().split("-")[0] != target.backend.triple.split("-")[0]:
        return None
    return llvm.get_host_cpu_features()


# the float vectors of named x86 CPUs (LLVM's names) that have more than SSE's 128 bits
X86_VECTOR_BITS = {
    **dict.fromkeys(("skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "icelake-client",
                     "icelake-server", "tigerlake", "rocketlake", "sapphirerapids", "emeraldrapids",
                     "graniterapids", "znver4", "znver5", "x86-64-v4"), 512),
    **dict.fromkeys(("sandybridge", "ivybridge", "haswell", "broadwell", "skylake", "alderlake",
                     "raptorlake", "meteorlake", "arrowlake", "znver1", "znver2", "znver3",
                     "bdver4", "x86-64-v3"), 256)}


@functools.cache
def vector_bits(target: Target) -> int:
    """The widest SIMD register the target machine uses for floats: on x86 the host's, or
    for a named CPU its own (:data:`X86_VECTOR_BITS`) or what its added features give."""
    if not target.backend.triple.startswith("x86_64"):
        return 128
    feats = _host_features(target)
    if feats is None:   # a named CPU
        feats = {f: True for f in target.features}
        named = X86_VECTOR_BITS.get(target.cpu or "", 128)
    else:
        named = 128
    if feats.get("avx512f"):
        return 512
    if feats.get("avx2") or feats.get("avx"):
        return max(named, 256)
    return named


def vector_registers(target: Target) -> int:
    """The SIMD registers the target machine has: 32 on AArch64 (NEON's and SVE's) and
    with AVX-512, 16 on other x86 CPUs."""
    if not target.backend.triple.startswith("x86_64"):
        return 32
    return 32 if vector_bits(target) >= 512 else 16


@functools.cache
def machine(target: Target) -> Machine:
    """The machine model of ``target`` (:mod:`polyfuse.ir.machine`): this processor's,
    read from Linux, where the target is code for it; else its named CPU's from
    :data:`~polyfuse.ir.machine.MACHINES` (a typical core of the architecture for a CPU
    the table lacks), with the vectors its features give."""
    x86 = target.backend.triple.startswith("x86_64")
    if _host_features(target) is not None:
        base = _host_machine(x86)
    else:
        base = MACHINES.get(target.cpu) or (GENERIC_X86 if x86 else GENERIC_AARCH64)
    return replace(base, vector_bits=vector_bits(target), vector_registers=vector_registers(target))


CACHES = Path("/sys/devices/system/cpu/cpu0/cache")


def _host_machine(x86: bool) -> Machine:
    """This processor: its caches from sysfs (a typical core's where Linux does not say),
    its FMA units from the table's entry for its CPU, the cores this process may run on."""
    _initialize()
    cpu = llvm.get_host_cpu_name()
    known = MACHINES.get(cpu) or (GENERIC_X86 if x86 else GENERIC_AARCH64)
    found: dict[tuple[int, str], tuple[int, int, int]] = {}
    for index in sorted(CACHES.glob("index*")):
        try:
            level, kind = int((index / "level").read_text()), (index / "type").read_text().strip()
            size = _bytes((index / "size").read_text().strip())
            ways = int((index / "ways_of_associativity").read_text())
            line = int((index / "coherency_line_size").read_text())
        except (OSError, ValueError):
            continue
        found[(level, kind)] = (size, ways, line)
    l1 = found.get((1, "Data")) or (known.l1d_bytes, known.l1d_ways, known.line_bytes)
    l2 = found.get((2, "Unified")) or (known.l2_bytes, 0, 0)
    l3 = found.get((3, "Unified")) or (known.l3_bytes, 0, 0)
    return Machine(f"host {cpu}", known.vector_bits, known.vector_registers, known.fma_units, l1[2] or 64,
                   l1[0], l1[1] or known.l1d_ways, l2[0], l3[0], len(os.sched_getaffinity(0)))


def _bytes(text: str) -> int:
    """A sysfs cache size ("32K", "1024K", "32M") in bytes."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text.rstrip("KkMmGg")) * scale


@functools.cache
def native_dots(target: Target) -> Mapping[str, Isa]:
    """The dot-product builtins the target has instructions for, and which (the first
    of :data:`ISAS` whose feature it has): ``dot4`` with AVX512-VNNI, or NEON's I8MM or
    DotProd; ``bfdot2`` with AVX512-BF16. The features are this machine's where no CPU
    is named, else the spec's (``+avx512vnni``, ``+i8mm``, ``+dotprod``, ...)."""
    arch = target.backend.triple.split("-")[0]
    host = _host_features(target)
    present = set(target.features) if host is None else {f for f, on in host.items() if on}
    found: dict[str, Isa] = {}
    for isa in ISAS:
        if isa.arch == arch and isa.feature in present:
            found.setdefault(isa.builtin, isa)
    return MappingProxyType(found)


@functools.cache
def native_tiles(target: Target) -> frozenset[str]:
    """The dot products the target's matrix tiles sum: ``bfdot2`` with AMX-BF16, ``dot4``
    with AMX-INT8. Only this machine's CPU (x86 without a CPU named) and only where Linux
    lets this process use the tiles, which it is asked here, once (a process that has not
    asked dies of SIGILL at its first tile instruction); code for a named CPU
    (ahead-of-time bundles, run by programs that never asked) does without."""
    present = _host_features(target)
    if present is None or not target.backend.triple.startswith("x86_64"):
        return frozenset()
    found = frozenset(fn for fn, t in TILES.items() if present.get(t.feature) and present.get("amx-tile"))
    return found if found and _tiles_permitted() else frozenset()


@functools.cache
def _tiles_permitted() -> bool:
    """Whether Linux lets this process (every thread of it) use AMX's tile data."""
    if platform.system() != "Linux":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(*PERMISSION) == 0


def optimize(module: llvm.ModuleRef, tm: llvm.TargetMachine, unroll: bool = True) -> None:
    """LLVM's O3 pipeline (the unroll budget set in :func:`_initialize`); without
    ``unroll``, no loop unroller: a kernel for symbolic sizes has its register blocks and
    the pieces of its partial tiles jammed in the loop IR already, and the unroller only
    doubled its compile time (BERT's attention scores: 5.0 -> 2.2 s, the same speed;
    benchmarks/LOG.md)."""
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = unroll
    pto.loop_interleaving = True
    pb = llvm.create_pass_builder(tm, pto)
    with quiet_remarks():  # "loop not vectorized" where a vector width could not be used
        pb.getModulePassManager().run(module, pb)


@dataclass
class JitKernel:
    """A kernel compiled in memory; keep it alive as long as ``address`` is used.

    ``object`` is the machine code as a relocatable object, for the disk cache."""

    name: str
    address: int
    stages: dict[str, str]
    object: bytes = field(repr=False)
    library: llvm.ResourceTracker = field(repr=False)   # the code lives while this does


@functools.cache
def target_description(target: Target) -> str:
    """What the generated code depends on besides the kernel: triple, CPU, features, and
    the machine model the schedule was chosen for."""
    tm = target_machine(target)
    cpu, features = _cpu_and_features(target)
    return f"{tm.triple} {cpu} {features} {machine(target)}"


@functools.cache
def _jit() -> llvm.LLJIT:
    """The process's one ORC JIT, linking with JITLink: each kernel's object is laid out
    from its own sections and a failure comes back as an error. (MCJIT, used before,
    reserves memory from an estimate made beforehand, and llvmlite's LLVM has assertions
    on: a CI run died in its finalize_object.) A kernel's code is unloaded when its
    library is dropped; the JIT itself lives as long as the process."""
    _initialize()
    jit = llvm.create_lljit_compiler(use_jit_link=True)
    jit._owned = True   # never disposed, so no library outlives it
    return jit


_libraries = itertools.count()


class LlvmText(NamedTuple):
    """A loop kernel's LLVM IR (:func:`emit_llvm`)."""

    name: str
    text: str


def compile_kernel(llvm_ir: LlvmText, target: Target, *, parallel_for: int, unroll: bool = True) -> JitKernel:
    """JIT-compile a loop kernel's LLVM IR (:func:`emit_llvm`) for this machine; stages get
    "llvm" and "llvm_opt" (:func:`assembly` prints "asm" from the latter when it is asked
    for). ``parallel_for`` is the address of the runtime's ``PARALLEL_FOR``
    (``polyfuse.runtime.native.parallel_for_threads_address()``); ``unroll`` as
    :func:`optimize` takes it."""
    obj, stages = compile_object(llvm_ir, target, unroll)
    return load_object(llvm_ir.name, obj, stages, parallel_for=parallel_for)


def emit_llvm(kernel: LoopKernel, target: Target, num_threads: int = 0) -> LlvmText:
    """The LLVM IR text of a loop kernel for ``target``. Pure Python: it touches no LLVM
    state, so it may run beside another kernel's compilation."""
    triple, data_layout = _module_frame(target)
    return LlvmText(kernel.name, emit_module(kernel, triple, data_layout, num_threads,
                                             "sve" in target.features, vector_bits(target) == 512,
                                             native_dots(target), native_tiles(target)))


@functools.cache
def _module_frame(target: Target) -> tuple[str, str]:
    """The triple and data layout of ``target``'s modules, asked of LLVM once: LLVM's
    calls take one lock, which another thread's optimization holds for long."""
    tm = _compiling_machine(target)
    return tm.triple, str(tm.target_data)


@functools.cache
def _compiling_machine(target: Target) -> llvm.TargetMachine:
    """The target machine that optimizes and emits ``target``'s kernels, made once (the
    calls that make one each wait for the GIL while another thread schedules)."""
    return target_machine(target)


def compile_object(llvm_ir: LlvmText, target: Target, unroll: bool = True) -> tuple[bytes, dict[str, str]]:
    """Compile a loop kernel's LLVM IR (:func:`emit_llvm`) to a relocatable object for any
    CPU target (no JIT): the object and the stages "llvm" and "llvm_opt"."""
    tm = _compiling_machine(target)
    mod = parse_module(llvm_ir.text, f"kernel '{llvm_ir.name}'")
    optimize(mod, tm, unroll)
    inline_dot_products(mod, tm, native_dots(target))
    link_tile_products(mod)
    return tm.emit_object(mod), {"llvm": llvm_ir.text, "llvm_opt": str(mod)}


def assembly(llvm_opt: str, target: Target) -> str:
    """The assembly of an optimized module's text for ``target`` (printed on demand: for
    every kernel of a model it took an eighth of the compile time)."""
    return target_machine(target).emit_assembly(parse_module(llvm_opt, "the assembly stage"))


def parse_module(text: str, what: str) -> llvm.ModuleRef:
    """LLVM IR text parsed and verified; LLVM's complaint becomes a ``CodegenError``."""
    try:
        mod = llvm.parse_assembly(text)
        mod.verify()
    except RuntimeError as err:
        raise CodegenError(f"LLVM rejected the code for {what}: {err}") from None
    return mod


def load_object(name: str, obj: bytes, stages: dict[str, str], *, parallel_for: int) -> JitKernel:
    """Link an object (compiled here or cached) into the process's JIT; ``parallel_for``
    as for :func:`compile_kernel`."""
    if not parallel_for:
        raise CodegenError(f"no address for {PARALLEL_FOR}, which generated code calls")
    address, library = link_object(obj, name, {PARALLEL_FOR: parallel_for})
    return JitKernel(name, address, stages, obj, library)


def link_object(obj: bytes, name: str, imports: dict[str, int] | None = None
                ) -> tuple[int, llvm.ResourceTracker]:
    """The address of function ``name`` in object code ``obj`` linked into the process's
    JIT, and the library that keeps it loaded. Symbols resolve from ``imports``, then
    from the process (libm's functions)."""
    builder = llvm.JITLibraryBuilder().add_object_img(obj).add_current_process().export_symbol(name)
    for symbol, address in (imports or {}).items():
        builder.import_symbol(symbol, address)
    try:
        library = builder.link(_jit(), f"{name}.{next(_libraries)}")
    except RuntimeError as err:
        raise CodegenError(f"the JIT could not link kernel '{name}': {err}") from None
    if not library[name]:
        raise CodegenError(f"the JIT did not produce kernel '{name}'")
    return library[name], library
