"""The machine model: what the scheduling heuristics know of the CPU a kernel is for.

A :class:`Machine` holds the properties of a processor that decide how loops should be
tiled and blocked: its vectors and vector registers, its vector FMA units, its caches
(size, associativity, line) and its cores. The heuristics derive every size that stands
for a property of the machine from it (:mod:`polyfuse.scheduler.heuristics`: the boxes
L2 keeps, a register block's accumulators), so one heuristic serves an AVX2 laptop, an
AVX-512 server and an AArch64 core. ``polyfuse.targets.cpu.machine`` makes the model of
a target: read from this processor where the target is the host, else from
:data:`MACHINES`, a table of named CPUs (LLVM's names).

Caches are per core except the last level (``l3_bytes``, shared by ``cores``).
"""

from __future__ import annotations

from dataclasses import dataclass

KiB = 1 << 10
MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class Machine:
    """One processor as the heuristics see it (see the module docstring)."""

    name: str
    vector_bits: int           # the widest float vector the code uses
    vector_registers: int      # architectural SIMD registers
    fma_units: int             # vector FMAs issued per cycle per core
    line_bytes: int            # cache line
    l1d_bytes: int             # L1 data cache per core
    l1d_ways: int
    l2_bytes: int              # L2 per core
    l3_bytes: int              # last-level cache, shared (0: none)
    cores: int                 # cores the runtime's threads run on (the host's), or typical

    def __str__(self) -> str:
        l3 = f", L3 {self.l3_bytes // MiB} MiB" if self.l3_bytes else ""
        return (f"{self.name}: {self.vector_bits}-bit vectors x {self.vector_registers} registers, "
                f"{self.fma_units} FMA/cycle, L1d {self.l1d_bytes // KiB} KiB {self.l1d_ways}-way, "
                f"L2 {self.l2_bytes // KiB} KiB{l3}, {self.line_bytes}-byte lines, {self.cores} cores")


def _x86(cpu: str, bits: int, fma: int, l1: int, ways: int, l2: int, l3: int, cores: int = 2) -> Machine:
    return Machine(f"x86:{cpu}", bits, 32 if bits >= 512 else 16, fma, 64, l1, ways, l2, l3, cores)


def _arm(cpu: str, bits: int, fma: int, l1: int, ways: int, l2: int, l3: int, cores: int = 2) -> Machine:
    return Machine(f"aarch64:{cpu}", bits, 32, fma, 64 if cpu != "a64fx" else 256, l1, ways, l2, l3, cores)


# named CPUs (LLVM's names) for code built for another machine; ``cores`` is what the
# schedule balances its tiles for there, two unless the CPU is known to run alone
MACHINES: dict[str, Machine] = {m.name.partition(":")[2]: m for m in (
    _x86("haswell", 256, 2, 32 * KiB, 8, 256 * KiB, 8 * MiB),
    _x86("skylake", 256, 2, 32 * KiB, 8, 256 * KiB, 8 * MiB),
    _x86("skylake-avx512", 512, 2, 32 * KiB, 8, 1 * MiB, 32 * MiB),
    _x86("icelake-server", 512, 2, 48 * KiB, 12, 1280 * KiB, 48 * MiB),
    _x86("sapphirerapids", 512, 2, 48 * KiB, 12, 2 * MiB, 105 * MiB),
    _x86("znver3", 256, 2, 32 * KiB, 8, 512 * KiB, 32 * MiB),
    _x86("znver4", 512, 2, 32 * KiB, 8, 1 * MiB, 32 * MiB),
    _x86("znver5", 512, 2, 48 * KiB, 12, 1 * MiB, 32 * MiB),
    _x86("x86-64", 128, 2, 32 * KiB, 8, 256 * KiB, 8 * MiB),
    _arm("neoverse-n1", 128, 2, 64 * KiB, 4, 1 * MiB, 32 * MiB),
    _arm("neoverse-v1", 256, 2, 64 * KiB, 4, 1 * MiB, 32 * MiB),
    _arm("neoverse-v2", 128, 4, 64 * KiB, 4, 2 * MiB, 64 * MiB),
    _arm("cortex-a72", 128, 1, 32 * KiB, 2, 512 * KiB, 0),
    _arm("a64fx", 512, 2, 64 * KiB, 4, 8 * MiB, 0),
)}

# a CPU the table does not name: a typical core of its architecture and vector width
GENERIC_X86 = _x86("generic", 256, 2, 32 * KiB, 8, 1 * MiB, 32 * MiB)
GENERIC_AARCH64 = _arm("generic", 128, 2, 64 * KiB, 4, 1 * MiB, 32 * MiB)

# what a schedule assumes where no machine is named (tests of the scheduler; the runtime
# always gives its target's): an AVX-512 server core
DEFAULT_MACHINE = MACHINES["sapphirerapids"]
