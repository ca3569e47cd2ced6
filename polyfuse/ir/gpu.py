"""GPU loop IR: a loop kernel mapped onto CUDA launches.

A :class:`GpuKernel` has the buffers and scalars of its loop kernel and a sequence of
:class:`Launch` es that run in order on one stream. A launch's body is loop IR plus
the statements below:

* :class:`BlockLoops`: perfectly nested loops with constant bounds whose iteration
  combinations are spread over the grid (one combination per block at a time; blocks
  stride over the rest, so any grid size is correct);
* :class:`ThreadFor`: a loop spread over the block's threads along one axis (thread
  ``t`` runs iterations ``t, t + blockDim, ...``);
* :class:`SingleThread`: statements run by thread (0, 0, 0) of the block only;
* :class:`CopyToShared`: every thread of the block copies part of a box of a global
  buffer into a shared-memory tile (zeros outside the buffer), at once or
  asynchronously (``cp.async``: :class:`AsyncCommit` closes a group of such copies,
  :class:`AsyncWait` waits until at most so many groups are in flight);
* :class:`Barrier`: ``__syncthreads()``;
* :class:`WarpReduce`: a local combined over neighbouring threads of a warp by shuffles;
* :class:`Threads`: every thread of the block runs the body, each with its own values of
  the statement's variables (its corner of a register tile) and its own
  :class:`Registers` arrays, which live through the body.

Everything outside thread loops and single-thread statements is *uniform*: every
thread of a block runs it alike, which is where barriers may stand. In a
:class:`Threads` body the loops and conditions that do not depend on its variables are
uniform too (copies and barriers may stand there, so the thread's registers live across
them); the rest of the body is the thread's own. A read of a shared tile or of
registers is a ``Read`` of its name, indexed within it.

``str(kernel)`` prints it, e.g.::

    gpu kernel mm(in float32(64, 64) A, in float32(64, 64) B, out float32(64, 64) C) {
      launch mm_0 grid 4 block 32x8 shared A_s0 float32(32, 32), B_s1 float32(32, 32) {
        blocks c0 in 0:64 step 32, c1 in 0:64 step 32 {
          for c2 in 0:64 step 32 {
            copy A_s0 <- A(c0, c2)
            ...
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from polyfuse.errors import IRVerificationError
from polyfuse.ir.comprehension import Binary, Expr, IndexVar, Literal, Read, ReduceOp, ScalarDecl, map_expr
from polyfuse.ir.loops import (Buffer, For, Stmt, Store, TileProduct, format_body, format_loop_expr, map_body_exprs, stmt_bodies,
                               stmt_nodes, walk_stmts)
from polyfuse.ir.types import DType

ExprMap = Callable[[Expr], Expr]

AXES = "xyz"
LANES = 32               # threads of a warp
TILE_M, TILE_N = 16, 8   # the outputs of one matrix-unit product (m16n8)
MMA_DEPTH = {"mma_tf32": 8, "mma_bf16": 16, "mma_f16": 16}   # its depth (k), by operand type


@dataclass(frozen=True, slots=True)
class LoopRange:
    """One loop of a :class:`BlockLoops`: ``var`` runs ``lo, lo + step, ...`` ``trips`` times."""

    var: str
    lo: int
    step: int
    trips: int


@dataclass(frozen=True, slots=True)
class BlockLoops(Stmt):
    """Loops run by blocks; the last loop varies fastest across consecutive blocks."""

    loops: tuple[LoopRange, ...]
    body: tuple[Stmt, ...]

    @property
    def trips(self) -> int:
        return math.prod(r.trips for r in self.loops)

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        """Each loop variable's first and last value."""
        return {r.var: (r.lo, r.lo + (r.trips - 1) * r.step) for r in self.loops}

    def map_exprs(self, fn: ExprMap) -> BlockLoops:
        return replace(self, body=map_body_exprs(self.body, fn))

    def exprs(self) -> tuple[Expr, ...]:
        return ()

    def format_lines(self, indent: str) -> list[str]:
        ranges = ", ".join(f"{r.var} in {r.lo}:{r.lo + r.trips * r.step}"
                           + (f" step {r.step}" if r.step != 1 else "") for r in self.loops)
        return [f"{indent}blocks {ranges} {{", *format_body(self.body, indent + "  "), f"{indent}}}"]


@dataclass(frozen=True, slots=True)
class ThreadFor(Stmt):
    """``for var in lo:hi step s`` with iteration k run by thread k mod blockDim[axis].

    ``idle`` lists the axes along which only thread 0 takes part (the outermost loop of
    a region that does not use every axis of the block's threads).

    With ``vector`` = w > 1 (step 1, axis x; the loop's iterations independent, any of
    them may run on any thread) a thread takes w consecutive iterations at a time: thread
    t runs ``lo + w t .. lo + w t + w - 1``, then those ``w blockDim.x`` further, up to
    the last whole group; the iterations past it (fewer than w) go one per thread. The
    code reads and writes the elements of a group that lie next to each other in a
    buffer as one word (128 bits for four float32) where their addresses allow."""

    var: str
    lo: Expr
    hi: Expr
    axis: int
    body: tuple[Stmt, ...]
    step: int = 1
    idle: tuple[int, ...] = ()
    vector: int = 1

    def map_exprs(self, fn: ExprMap) -> ThreadFor:
        return replace(self, lo=map_expr(self.lo, fn), hi=map_expr(self.hi, fn),
                       body=map_body_exprs(self.body, fn))

    def exprs(self) -> tuple[Expr, ...]:
        return (self.lo, self.hi)

    def format_lines(self, indent: str) -> list[str]:
        step = f" step {self.step}" if self.step != 1 else ""
        idle = f" where {' and '.join(f'{AXES[a]} = 0' for a in self.idle)}" if self.idle else ""
        vector = f" vector {self.vector}" if self.vector > 1 else ""
        head = f"{indent}thread.{AXES[self.axis]} for {self.var} in " \
               f"{format_loop_expr(self.lo)}:{format_loop_expr(self.hi)}{step}{vector}{idle} {{"
        return [head, *format_body(self.body, indent + "  "), f"{indent}}}"]


@dataclass(frozen=True, slots=True)
class SingleThread(Stmt):
    body: tuple[Stmt, ...]

    def map_exprs(self, fn: ExprMap) -> SingleThread:
        return replace(self, body=map_body_exprs(self.body, fn))

    def exprs(self) -> tuple[Expr, ...]:
        return ()

    def format_lines(self, indent: str) -> list[str]:
        return [f"{indent}single thread {{", *format_body(self.body, indent + "  "), f"{indent}}}"]


class _Exprless(Stmt):
    """A statement that holds no expression: mapping them leaves it as it is."""

    __slots__ = ()

    def map_exprs(self, fn: ExprMap) -> Stmt:
        return self

    def exprs(self) -> tuple[Expr, ...]:
        return ()


@dataclass(frozen=True, slots=True)
class Barrier(_Exprless):
    def format_lines(self, indent: str) -> list[str]:
        return [f"{indent}barrier"]


@dataclass(frozen=True, slots=True)
class WarpReduce(_Exprless):
    """Every thread's local ``var`` becomes ``op`` (+, *, max or min) over the ``lanes``
    threads of its group: the threads at ``x`` whose ``x // lanes`` is its own (``lanes`` a
    power of two up to 32 that divides the block's x). A butterfly of warp shuffles
    (``__shfl_xor_sync`` at offsets ``lanes / 2, ..., 1``: at each, a thread combines its
    value with that of the thread whose x differs in that bit), so every thread of the
    group ends with the same value, through no memory and no barrier. Every thread of the
    block reaches it alike, as a barrier."""

    var: str
    dtype: DType
    op: ReduceOp
    lanes: int

    def format_lines(self, indent: str) -> list[str]:
        return [f"{indent}warp reduce {self.op.value} {self.var} over {self.lanes} lanes"]


@dataclass(frozen=True, slots=True)
class SharedTile:
    """A block's copy of a box of ``buffer``, in the buffer's storage type; each row
    (the last dimension) is followed by ``pad`` unused elements (against bank conflicts
    where threads read down a column, or to keep rows 16-byte aligned for 128-bit reads).
    With ``stages`` > 1 it holds that many boxes one after another (a pipeline's
    buffers: copies of the next steps land in one while the block reads another); its
    reads and copies then name the stage first."""

    name: str
    buffer: str
    dtype: DType
    shape: tuple[int, ...]
    pad: int = 0
    stages: int = 1

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def strides(self) -> tuple[int, ...]:
        """Row-major element strides, rows ``pad`` elements longer than the last extent."""
        out, step = [], 1
        for k, extent in enumerate(reversed(self.shape)):
            out.append(step)
            step *= extent + (self.pad if k == 0 and len(self.shape) > 1 else 0)
        return tuple(reversed(out))

    @property
    def stage_size(self) -> int:
        """Elements of one stage, padding included."""
        return self.shape[0] * self.strides[0] if self.shape else 1

    @property
    def size(self) -> int:
        """Elements allocated, every stage and padding included."""
        return self.stages * self.stage_size

    @property
    def bytes(self) -> int:
        return self.size * self.dtype.numpy.itemsize

    def __str__(self) -> str:
        pad = f" pad {self.pad}" if self.pad else ""
        stages = f" x{self.stages}" if self.stages > 1 else ""
        return f"{self.name} {self.dtype}({', '.join(map(str, self.shape))}){pad}{stages}"


@dataclass(frozen=True, slots=True)
class ThreadRange:
    """One variable of a :class:`Threads`: the thread at ``t`` along ``axis`` has
    ``var = lo + t * step``, for ``t`` in ``[0, threads)``; ``lo`` is uniform."""

    var: str
    lo: Expr
    step: int
    threads: int
    axis: int

    def __str__(self) -> str:
        span = self.step * self.threads
        lo = format_loop_expr(self.lo)
        hi = str(int(self.lo.value) + span) if isinstance(self.lo, Literal) else f"{lo} + {span}"
        return f"{self.var} in {lo}:{hi} step {self.step} on {AXES[self.axis]}"


@dataclass(frozen=True, slots=True)
class Registers:
    """An array each thread keeps for itself (in registers, its indices being constants
    once the loops over it are unrolled), in compute precision."""

    name: str
    dtype: DType
    shape: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.name} {self.dtype}({', '.join(map(str, self.shape))})"


@dataclass(frozen=True, slots=True)
class Threads(Stmt):
    """Every thread of the block runs ``body`` with its own value of each range's
    variable, and its own ``registers``: a register-tiled contraction, where a thread
    owns a micro-tile of outputs and keeps their accumulators through the whole
    reduction, the shared-memory copies and barriers of each step inside. The block has
    exactly ``threads`` threads along each range's axis and one along the others (no
    thread idles, none repeats another's work). Loops and conditions of the body that do
    not depend on the ranges' variables are uniform.

    With ``lanes`` = 32 it is a *warp region*: each range's ``threads`` are warps, the
    block has 32 threads along x (the lanes, which no range names), and a warp holds its
    ``registers`` together, each lane the elements the matrix units' fragment layout
    gives it (for ``m16n8``: lane ``l`` holds rows ``l / 4`` and ``l / 4 + 8`` and
    columns ``2 (l % 4)`` and ``2 (l % 4) + 1`` of each 16 x 8 tile). The body then reads
    and writes registers only in :class:`~polyfuse.ir.loops.TileProduct` s (products on
    the matrix units, ``mma_*``) and in *register loops*: two perfectly nested loops
    from 0 over the registers' two extents, whose statements touch the registers only at
    the loops' point (each lane runs the points it holds)."""

    ranges: tuple[ThreadRange, ...]
    registers: tuple[Registers, ...]
    body: tuple[Stmt, ...]
    lanes: int = 1

    @property
    def warps(self) -> bool:
        """Whether the ranges count warps: a *warp region*, ``lanes`` (32) threads along x
        each, which hold ``registers`` together (see the class docstring)."""
        return self.lanes > 1

    @property
    def vars(self) -> frozenset[str]:
        return frozenset(r.var for r in self.ranges)

    def map_exprs(self, fn: ExprMap) -> Threads:
        ranges = tuple(replace(r, lo=map_expr(r.lo, fn)) for r in self.ranges)
        return replace(self, ranges=ranges, body=map_body_exprs(self.body, fn))

    def exprs(self) -> tuple[Expr, ...]:
        return tuple(r.lo for r in self.ranges)

    def format_lines(self, indent: str) -> list[str]:
        registers = f" registers {', '.join(map(str, self.registers))}" if self.registers else ""
        kind = f"warps of {self.lanes}" if self.warps else "threads"
        head = f"{indent}{kind} {', '.join(map(str, self.ranges))}{registers} {{"
        return [head, *format_body(self.body, indent + "  "), f"{indent}}}"]


@dataclass(frozen=True, slots=True)
class CopyToShared(Stmt):
    """Tile element ``t`` (of stage ``stage`` of a staged tile) becomes
    ``buffer(offsets + t)``, or 0 outside the buffer. An ``asynchronous`` copy only starts
    then (``cp.async``, sm_80 and later): its elements arrive once an :class:`AsyncWait`
    after the :class:`AsyncCommit` that closes its group has returned, and a barrier
    after that shows them to the other threads."""

    tile: str
    buffer: str
    offsets: tuple[Expr, ...]
    stage: Expr | None = None
    asynchronous: bool = False

    def map_exprs(self, fn: ExprMap) -> CopyToShared:
        stage = map_expr(self.stage, fn) if self.stage is not None else None
        return replace(self, offsets=tuple(map_expr(o, fn) for o in self.offsets), stage=stage)

    def exprs(self) -> tuple[Expr, ...]:
        return self.offsets + ((self.stage,) if self.stage is not None else ())

    def format_lines(self, indent: str) -> list[str]:
        stage = f"[{format_loop_expr(self.stage)}]" if self.stage is not None else ""
        kind = "copy async" if self.asynchronous else "copy"
        return [f"{indent}{kind} {self.tile}{stage} <- {self.buffer}"
                f"({', '.join(format_loop_expr(o) for o in self.offsets)})"]


@dataclass(frozen=True, slots=True)
class AsyncCommit(_Exprless):
    """Close the group of the asynchronous copies this thread started since the last one."""

    def format_lines(self, indent: str) -> list[str]:
        return [f"{indent}commit copies"]


@dataclass(frozen=True, slots=True)
class AsyncWait(_Exprless):
    """Wait until at most ``pending`` of this thread's closed groups of asynchronous
    copies are still in flight (the older ones have landed)."""

    pending: int

    def format_lines(self, indent: str) -> list[str]:
        return [f"{indent}wait copies ({self.pending} in flight)"]


@dataclass(frozen=True, slots=True)
class Launch:
    """One ``__global__`` function and how it is launched: ``grid`` blocks (along x) of
    ``block`` threads (x, y, z)."""

    name: str
    body: tuple[Stmt, ...]
    grid: int
    block: tuple[int, int, int]
    shared: tuple[SharedTile, ...] = ()

    @property
    def threads(self) -> int:
        return math.prod(self.block)

    @property
    def shared_bytes(self) -> int:
        return sum(t.bytes for t in self.shared)

    def tile(self, name: str) -> SharedTile | None:
        return next((t for t in self.shared if t.name == name), None)

    def __str__(self) -> str:
        shared = f" shared {', '.join(map(str, self.shared))}" if self.shared else ""
        head = f"launch {self.name} grid {self.grid} block {'x'.join(map(str, self.block))}{shared} {{"
        return "\n".join([head, *format_body(self.body, "  "), "}"])


@dataclass(frozen=True, slots=True)
class GpuKernel:
    name: str
    buffers: tuple[Buffer, ...]
    scalars: tuple[ScalarDecl, ...]
    launches: tuple[Launch, ...]

    def buffer(self, name: str) -> Buffer:
        return next(b for b in self.buffers if b.name == name)

    def __str__(self) -> str:
        params = [str(b) for b in self.buffers] + [f"{s.dtype} {s.name}" for s in self.scalars]
        launches = [("  " + line) for launch in self.launches for line in str(launch).splitlines()]
        return "\n".join([f"gpu kernel {self.name}({', '.join(params)}) {{", *launches, "}"])


@dataclass(frozen=True, slots=True)
class MmaNest:
    """What a matrix-unit :class:`~polyfuse.ir.loops.TileProduct`'s nest says: its loop
    variables and the operands ``x`` (read at ``r, k``) and ``y`` (at ``k, c``) of
    ``acc(r, c) = acc(r, c) + x * y``."""

    r: str
    c: str
    k: str
    x: Expr
    y: Expr

    @staticmethod
    def of(tile: TileProduct) -> MmaNest:
        if tile.builtin not in MMA_DEPTH:
            raise IRVerificationError(f"tile {tile.builtin} is not a product of the GPU's matrix units")
        loops: list[For] = []
        body = tile.nest
        while len(body) == 1 and isinstance(body[0], For):
            loops.append(body[0])
            body = body[0].body
        if len(loops) != 3 or len(body) != 1 or not isinstance(body[0], Store) \
                or not isinstance(body[0].value, Binary) or not isinstance(body[0].value.rhs, Binary):
            raise IRVerificationError(f"tile {tile.builtin}: its nest is not three loops around acc += x * y")
        product = body[0].value.rhs
        return MmaNest(loops[0].var, loops[1].var, loops[2].var, product.lhs, product.rhs)


def register_loops(s: For, registers: Registers) -> tuple[str, str] | None:
    """The variables (row, column) of ``s`` and its one inner loop where they are loops
    over the whole of a two-dimensional register tile (either order, from 0, step 1) whose
    statements touch the registers only at their point; else None."""
    if len(registers.shape) != 2 or len(s.body) != 1 or not isinstance(s.body[0], For):
        return None
    inner = s.body[0]
    walked = tuple(walk_stmts(inner.body))
    points = {e.indices for st in walked for e in stmt_nodes(st) if isinstance(e, Read) and e.tensor == registers.name}
    points |= {st.indices for st in walked if isinstance(st, Store) and st.buffer == registers.name}
    if len(points) != 1 or not all(isinstance(i, IndexVar) for i in next(iter(points))):
        return None
    r, c = (i.name for i in next(iter(points)) if isinstance(i, IndexVar))
    extents = {r: registers.shape[0], c: registers.shape[1]}
    if {s.var, inner.var} != {r, c} or any(
            lp.lo != Literal(0, DType.INT64) or lp.hi != Literal(extents[lp.var], DType.INT64) or lp.step != 1
            for lp in (s, inner)):
        return None
    return r, c


def verify_gpu_kernel(kernel: GpuKernel) -> None:
    """Raise an IRVerificationError where a launch breaks the rules above: a barrier,
    copy or warp reduction that not every thread of the block reaches alike (inside a thread loop, a
    single-thread statement, or a loop or condition of a :class:`Threads` body that
    depends on the thread's variables), a :class:`Threads` whose ranges do not match the
    block's shape, or one nested in another thread region."""
    for launch in kernel.launches:
        _verify_body(launch, launch.body, frozenset(), None)


def _verify_body(launch: Launch, body: tuple[Stmt, ...], private: frozenset[str], region: str | None) -> None:
    """``private``: the variables that differ between threads here; ``region``: what
    makes this code one thread's (None where it is uniform)."""
    where = f"launch {launch.name}"
    for s in body:
        if isinstance(s, ThreadFor) and s.vector > 1 and (s.vector & (s.vector - 1) or s.step != 1 or s.axis):
            raise IRVerificationError(f"{where}: {s.format_lines('')[0]} a vector of {s.vector} must be a power "
                                      "of two on a loop of step 1 along x")
        if isinstance(s, WarpReduce) and (s.lanes not in (1, 2, 4, 8, 16, 32) or launch.block[0] % s.lanes):
            raise IRVerificationError(f"{where}: {s.format_lines('')[0]}: lanes must be a power of two up to "
                                      f"32 that divides the block's {launch.block[0]} threads along x")
        if isinstance(s, (Barrier, CopyToShared, WarpReduce, AsyncCommit, AsyncWait)) \
                and (region or private & _vars_of(s)):
            raise IRVerificationError(f"{where}: {s.format_lines('')[0]} in {region or 'code'} "
                                      "that not every thread of the block reaches alike")
        if isinstance(s, Threads):
            if region is not None or private:
                raise IRVerificationError(f"{where}: threads region inside {region or 'another'}")
            shape = [s.lanes, 1, 1]
            for r in s.ranges:
                if s.warps and r.axis == 0:
                    raise IRVerificationError(f"{where}: a warp region's range {r.var} on x, its lanes' axis")
                shape[r.axis] = r.threads
            if tuple(shape) != launch.block:
                raise IRVerificationError(f"{where}: threads region of {'x'.join(map(str, shape))} "
                                          f"threads in a block of {'x'.join(map(str, launch.block))}")
            _verify_body(launch, s.body, s.vars, None)
        elif isinstance(s, (ThreadFor, SingleThread)):
            _verify_body(launch, s.body, private, region or type(s).__name__)
        else:
            depends = bool(private & _vars_of(s))
            inner = private | {s.var} if depends and isinstance(s, For) else private
            for part in stmt_bodies(s):
                _verify_body(launch, part, inner, region or ("a thread's own code" if depends else None))


def _vars_of(s: Stmt) -> frozenset[str]:
    """The index variables the expressions of ``s`` itself use."""
    return frozenset(e.name for e in stmt_nodes(s) if isinstance(e, IndexVar))


def walk_gpu(body: tuple[Stmt, ...]) -> Iterator[Stmt]:
    """Every statement of a launch body, outer before inner (:func:`walk_stmts`, which
    walks into the GPU IR's statements that hold a body)."""
    return walk_stmts(body)
