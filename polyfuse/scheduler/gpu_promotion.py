"""Shared-memory promotion: copy reused boxes of input buffers into shared tiles.

For each thread region, the reads of an input buffer are affine in the region's loop
variables and in *uniform* ones (block loops, serial loops around the region). Every
region loop ``w`` runs ``lo_w + step * d`` for ``d`` in ``[0, trips_w)`` with ``lo_w``
affine in outer variables and ``trips_w`` bounded by a constant (point loops of a tile),
so along each dimension the reads cover a box ``offset + [0, extent)`` whose offset is
uniform and whose extent is a constant. When the region reads at least twice as many
elements as the box holds (reads of one index expression counted once: threads share elements: ``A(m, k)`` of a matmul is read by
every thread along ``n``) and the box fits in what is left of the budget, the block
copies it to shared memory right before the region, and the region reads the tile.
Boxes with the most reuse are promoted first.

In a :class:`~polyfuse.ir.gpu.Threads` region (a register tile) the copies go inside:
the region's variables range over its threads, and a box is copied at the start of the
outermost uniform loop body (or of the region's body) where it has the reuse and fits,
so a contraction copies the operands' boxes of each reduction step in its reduction
loop, while the thread's accumulators stay in registers around it. Rows of these tiles
start on 16-byte boundaries, so the unrolled micro-tile reads them 128 bits at a time;
those of thread regions are padded by one element instead (threads reading down a
column then hit different banks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from polyfuse.ir.comprehension import Expr, Read
from polyfuse.ir.gpu import CopyToShared, GpuKernel, Launch, SharedTile, ThreadFor, Threads
from polyfuse.ir.affine import Affine, affine, combine, max_trips, to_expr, variables
from polyfuse.ir.comprehension import IndexVar
from polyfuse.ir.loops import (ERROR_BUFFER, BufferRole, For, LoopRewriter, Scope, Stmt, constant_trips, map_body_exprs,
                               stmt_nodes, walk_scoped, walk_stmts)
from polyfuse.scheduler.gpu_registers import speculate

MIN_REUSE = 2  # reads per element of the box before a copy pays off
ROW_ALIGN = 16  # bytes: a register tile's shared rows start on these boundaries


@dataclass(frozen=True, slots=True)
class _Loop:
    lo: Expr
    step: int
    trips: int | None


@dataclass(frozen=True, slots=True)
class _Box:
    """What a region reads of one buffer: uniform offsets, extents, reads counted."""

    buffer: str
    offsets: tuple[Affine, ...]
    extents: tuple[int, ...]
    reads: int

    @property
    def size(self) -> int:
        return math.prod(self.extents)


def promote_to_shared(kernel: GpuKernel, budget: int) -> GpuKernel:
    """Every launch with its reused input boxes in shared memory, ``budget`` bytes each."""
    return replace(kernel, launches=tuple(_Promoter(kernel, budget).launch(launch)
                                          for launch in kernel.launches))


class _Promoter(LoopRewriter):
    def __init__(self, kernel: GpuKernel, budget: int) -> None:
        self.kernel = kernel
        self.budget = budget
        self.inputs = {b.name for b in kernel.buffers
                       if b.role is BufferRole.IN and b.name != ERROR_BUFFER and b.shape}
        self.tiles: list[SharedTile] = []

    def launch(self, launch: Launch) -> Launch:
        self.tiles = list(launch.shared)  # the mapping's arrays count against the budget
        body = self.body(launch.body, Scope())
        return replace(launch, body=body, shared=tuple(self.tiles))

    def nested(self, s: Stmt, scope: Scope) -> Stmt | tuple[Stmt, ...]:
        if isinstance(s, ThreadFor):
            copies, s = self.region(s)
            return (*copies, s)
        if isinstance(s, Threads):
            ranges = {r.var: _Loop(r.lo, r.step, r.threads) for r in s.ranges}
            body = self.site(s.body, ranges, s.vars, 0)
            return speculate(replace(s, body=body), {t.name for t in self.tiles})
        return super().nested(s, scope)

    def tile_name(self, buffer: str) -> str:
        """``<buffer>_s<k>``, a name no buffer of the kernel has."""
        taken = {b.name for b in self.kernel.buffers} | {t.name for t in self.tiles}
        k = len(self.tiles)
        while f"{buffer}_s{k}" in taken:
            k += 1
        return f"{buffer}_s{k}"

    def region(self, region: ThreadFor) -> tuple[list[Stmt], ThreadFor]:
        copies, body = self.promote((region,), {}, _column_pad)
        return copies, body[0]  # type: ignore[return-value]

    def site(self, body: tuple[Stmt, ...], ranges: dict[str, _Loop], private: frozenset[str],
             least: int) -> tuple[Stmt, ...]:
        """A register tile's ``body`` with the boxes it reuses copied at its start, unless
        a uniform loop in it reads all of a box with as much reuse per element, each
        thread still copies an element or more there and a loop not unrolled whole runs
        inside it (then the copy goes in that loop: less shared memory, short copies, and
        a barrier per step of a loop, not per unrolled product), or the box does not fit
        (then further in, where ``least``, the block's threads, is the smallest box worth
        a copy)."""
        threads = math.prod(r.trips or 1 for r in ranges.values())
        loops = [s for s in body if isinstance(s, For) and not private & _index_vars(s) and _rolled(s.body)]
        everywhere = _reads(body, ranges)

        def deeper(name: str, box: _Box) -> bool:
            for loop in loops:
                uses = _reads(loop.body, ranges).get(name, [])
                if len(uses) == len(everywhere[name]):
                    inner = _box(name, uses)
                    return inner is not None and inner.size >= threads and inner.reads * box.size >= box.reads * inner.size
            return False
        copies, body = self.promote(body, ranges, _aligned_pad, least, deeper)
        inner = tuple(replace(s, body=self.site(s.body, ranges, private, threads))
                      if isinstance(s, For) and not private & _index_vars(s) else s for s in body)
        return (*copies, *inner)

    def promote(self, body: tuple[Stmt, ...], ranges: dict[str, _Loop], pad,  # type: ignore[no-untyped-def]
                least: int = 0, deeper=lambda name, box: False) -> tuple[list[Stmt], tuple[Stmt, ...]]:
        """Copies of the boxes ``body`` reuses enough that fit what is left of the budget
        (of ``least`` elements or more, and not left to a loop further in: ``deeper``),
        and ``body`` reading them (``ranges``: the loops of the threads' own variables)."""
        boxes = [box for name, uses in _reads(body, ranges).items() if name in self.inputs
                 if (box := _box(name, uses)) is not None and box.reads >= MIN_REUSE * box.size
                 and box.size >= least and not deeper(name, box)]
        copies: list[Stmt] = []
        for box in sorted(boxes, key=lambda b: -b.reads / b.size):
            dtype = self.kernel.buffer(box.buffer).dtype
            tile = SharedTile(self.tile_name(box.buffer), box.buffer, dtype, box.extents,
                              pad(box.extents, dtype.numpy.itemsize))
            used = sum(t.bytes for t in self.tiles)
            if used + tile.bytes > self.budget:
                continue
            self.tiles.append(tile)
            copies.append(CopyToShared(tile.name, box.buffer, tuple(map(to_expr, box.offsets))))
            body = map_body_exprs(body, _reader(tile, box))
        return copies, body


def _rolled(body: tuple[Stmt, ...]) -> bool:
    """Whether a loop in ``body`` stays a loop (is not unrolled whole)."""
    return any(isinstance(s, For) and s.unroll < (constant_trips(s) or s.unroll + 1) for s in walk_stmts(body))


def _column_pad(shape: tuple[int, ...], itemsize: int) -> int:
    """One element after an even row, so threads reading down a column (``B(n, k)``
    along ``n``) hit different memory banks."""
    return 1 if len(shape) > 1 and shape[-1] % 2 == 0 else 0


def _aligned_pad(shape: tuple[int, ...], itemsize: int) -> int:
    """Rows that start on ``ROW_ALIGN`` bytes, then one more such step (the rows of
    neighbouring threads' micro-tiles then start in different banks)."""
    if len(shape) < 2 or ROW_ALIGN % itemsize:
        return 0
    words = ROW_ALIGN // itemsize
    return -shape[-1] % words + words


def _index_vars(s: Stmt) -> frozenset[str]:
    return frozenset(e.name for e in stmt_nodes(s) if isinstance(e, IndexVar))


def _reader(tile: SharedTile, box: _Box):  # type: ignore[no-untyped-def]
    """Reads of the box's buffer -> reads of the tile (indices less the offsets)."""
    def swap(e: Expr) -> Expr:
        if isinstance(e, Read) and e.tensor == box.buffer:
            local = (to_expr(combine(affine(i) or {}, off, -1)) for i, off in zip(e.indices, box.offsets))
            return Read(tile.name, tuple(local), e.dtype)
        return e
    return swap


@dataclass(frozen=True, slots=True)
class _Use:
    """One read in a region: how often it runs and the loops around it, by variable."""

    read: Read
    times: int
    loops: dict[str, _Loop]


def _reads(body: tuple[Stmt, ...], ranges: dict[str, _Loop]) -> dict[str, list[_Use]]:
    """Reads of each buffer in ``body``, a region or a register tile's part, whose
    threads' variables run over ``ranges`` (loops of sibling nests may share a variable
    name, so each read keeps the loops that enclose it)."""
    out: dict[str, list[_Use]] = {}
    described: dict[int, _Loop] = {}   # each loop's, worked out once

    def described_loop(lp: Stmt) -> _Loop:
        if id(lp) not in described:
            described[id(lp)] = _Loop(lp.lo, lp.step, max_trips(lp.lo, lp.hi, lp.step))  # type: ignore[attr-defined]
        return described[id(lp)]

    for s, scope in walk_scoped(body):
        loops = ranges | {lp.var: described_loop(lp) for lp in scope.loops}  # type: ignore[attr-defined]
        times = math.prod(lp.trips or 1 for lp in loops.values())
        for r in (r for r in stmt_nodes(s) if isinstance(r, Read)):
            out.setdefault(r.tensor, []).append(_Use(r, times, loops))
    return out


def _box(buffer: str, uses: list[_Use]) -> _Box | None:
    """The box the reads cover, or None when one is not affine or not bounded."""
    lows: list[list[Affine]] = []
    highs: list[list[Affine]] = []
    for use in uses:
        if use.read.checked:  # the copy would read 0 where the read must flag an error
            return None
        dims = [_range(i, use.loops) for i in use.read.indices]
        if any(d is None for d in dims):
            return None
        lows.append([d[0] for d in dims])  # type: ignore[index]
        highs.append([d[1] for d in dims])  # type: ignore[index]
    offsets, extents = [], []
    for k in range(len(lows[0])):
        base = {v: c for v, c in lows[0][k].items() if v}
        if any({v: c for v, c in f.items() if v} != base for f in [*(lo[k] for lo in lows),
                                                                  *(hi[k] for hi in highs)]):
            return None  # the reads' offsets differ by more than constants
        low = min(lo[k].get("", 0) for lo in lows)
        high = max(hi[k].get("", 0) for hi in highs)
        offsets.append(base | ({"": low} if low else {}))
        extents.append(high - low + 1)
    runs: dict[tuple[Expr, ...], int] = {}  # a repeated read of one element costs once
    for use in uses:
        runs[use.read.indices] = max(runs.get(use.read.indices, 0), use.times)
    return _Box(buffer, tuple(offsets), tuple(extents), sum(runs.values()))


def _range(index: Expr, loops: dict[str, _Loop]) -> tuple[Affine, Affine] | None:
    """The least and greatest value of ``index`` over the region's loops, as affine
    forms of the uniform variables."""
    form = affine(index)
    if form is None:
        return None
    low = high = 0  # how far the index reaches below and above its uniform base
    while inner := [v for v in variables(form) if v in loops]:
        var = inner[0]
        loop, c = loops[var], form[var]
        start = affine(loop.lo)
        if start is None or loop.trips is None:
            return None
        form = combine({v: x for v, x in form.items() if v != var}, start, c)
        reach = c * loop.step * max(0, loop.trips - 1)
        low, high = low + min(0, reach), high + max(0, reach)
    return combine(form, {"": low}), combine(form, {"": high})
