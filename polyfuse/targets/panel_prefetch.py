"""Prefetch of the next panel of a prepacked operand, spread over the blocks that share one.

A micro-kernel reads a panel of a constant operand (a model's weights, packed at compile
time) once per register block of rows: ``for h in 0:7 { for c, kh, kw { ... W(c0, c1 + c,
kh, kw, v) ... } }`` reads the same 9 KiB panel of ``W`` seven times, once per row ``h``, and
the next panel (``c1`` one step on) after the seventh. At batch 1 the weights come from
memory (the kernels between two runs evict them), and a core has few misses in flight:
prefetched all at once, a panel's lines queue behind each other while the FMA units wait.
Here each pass of the loop that shares the panel (``h``) prefetches its own slice of the
next panel, ``1/7`` of its lines, as it starts; the stream then runs during all seven
passes. Prefetching the stream a fixed distance ahead of every read instead issues the
whole next panel during the first pass (and again, to no effect, during the other six):
a 3x3 convolution of 512 channels on a 7x7 map, weights cold, ran slower so
(benchmarks/LOG.md).

A slice of more than :data:`SPREAD_LINES` lines (a product's panel of 768 steps by 64
columns, 120 lines or more per row block) would flood the core's miss queues if issued at
once; its pass streams it instead, one line every ``trips / lines`` iterations of its
reduction loop (``PanelPrefetch.over``): the first row block of each panel then no longer
waits on memory at the micro-kernel's pace (the transformers and CNNs of
benchmarks/real_models.py: benchmarks/LOG.md).

:func:`panel_prefetches` finds, for a loop, the panels its passes share; the emitter
(:mod:`.llvm_kernel`) issues the prefetches and leaves those reads out of its
fixed-distance prefetch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from polyfuse.ir.comprehension import Binary, BinaryOp, Expr, IndexVar, Literal, Read, map_expr, walk
from polyfuse.ir.loops import For, If, LoopKernel, Stmt, TileProduct, constant_trips, stmt_nodes, walk_scoped
from polyfuse.ir.types import DType
from polyfuse.ir.affine import ConstantLoop, affine, constant_loop, span

LINE = 64
# cache lines one pass prefetches at once as it starts, at most (of 16, 32, 64 and 256,
# 32 did best on ResNet-50 and 256 did worst: benchmarks/LOG.md); a larger slice (a
# product's panel, hundreds of lines per row block) streams through the pass's reduction
# loop instead
SPREAD_LINES = 32

_I64 = DType.INT64


@dataclass(frozen=True)
class PanelPrefetch:
    """Each pass of a loop prefetches ``lines`` cache lines of the next panel of ``tensor``,
    pass ``i`` from line ``i * lines`` of the panel that starts at element ``first``: all
    as the pass starts, or, with ``over`` (a loop of the pass's reduction, ``trips``
    iterations from ``lo`` by ``step``), ``lines / trips`` of them per iteration."""

    first: Read
    lines: int
    over: ConstantLoop | None = None

    @property
    def tensor(self) -> str:
        return self.first.tensor


def panel_prefetches(loop: For, enclosing: tuple[For, ...], kernel: LoopKernel) -> list[PanelPrefetch]:
    """The panels of prepacked operands that the passes of ``loop`` (inside the loops
    ``enclosing``, outermost first) share and that the next step of an enclosing loop moves
    to: per tensor, where ``loop`` is the innermost loop around its micro-kernel that its
    reads do not move with."""
    passes = constant_trips(loop)
    if not passes or passes < 2 or loop.vector > 1 or \
            not any(b.packing is not None for b in kernel.buffers):
        return []
    found: dict[str, PanelPrefetch] = {}
    for read, path in _packed_reads(loop.body, kernel):
        if read.tensor in found or any(read.is_checked(d) for d in range(len(read.indices))):
            continue
        got = _panel(loop, passes, read, path, enclosing, kernel)
        if got is not None:
            found[read.tensor] = got
    return list(found.values())


def _panel(loop: For, passes: int, read: Read, path: tuple[For, ...], enclosing: tuple[For, ...],
           kernel: LoopKernel) -> PanelPrefetch | None:
    moves = _index_vars(read)
    if loop.var in moves:
        return None
    steps = [lp for lp in path if lp.vector <= 1 and lp.var in moves]
    if not steps:   # no reduction inside the loop: the read is not a micro-kernel's
        return None
    # the innermost loop that shares the panel: no loop inside it, around the reduction's
    # last loop, runs several passes over the same panel
    if any(lp.vector <= 1 and lp.var not in moves and (constant_trips(lp) or 0) > 1
           and path.index(lp) < path.index(steps[-1]) for lp in path):
        return None
    tile = next((lp for lp in reversed(enclosing) if lp.var in moves), None)
    loops = [constant_loop(lp) for lp in path]
    if tile is None or None in loops:
        return None
    bytes_ = _panel_bytes(read, loops, kernel)   # type: ignore[arg-type]  # no None: ruled out above
    if bytes_ is None:
        return None
    lines = math.ceil(bytes_ / LINE / passes)
    over = loops[path.index(steps[0])] if lines > SPREAD_LINES else None
    at: dict[str, Expr] = {lp.var: Literal(lp.lo, _I64) for lp in loops}  # type: ignore[union-attr]  # no None
    at[tile.var] = Binary(BinaryOp.ADD, IndexVar(tile.var), Literal(tile.step, _I64), _I64)
    first = map_expr(read, lambda e: at.get(e.name, e) if isinstance(e, IndexVar) else e)
    assert isinstance(first, Read)
    return PanelPrefetch(first, lines, over)


def _packed_reads(body: tuple[Stmt, ...], kernel: LoopKernel) -> list[tuple[Read, tuple[For, ...]]]:
    """Reads of prepacked buffers in ``body``, each with the loops around it there; none
    under an ``if`` (a guarded read may not run) or in a tile product."""
    return [(r, scope.loops) for s, scope in walk_scoped(body)
            if not scope.guarded and not isinstance(s, (For, If, TileProduct))
            for r in stmt_nodes(s) if isinstance(r, Read) and kernel.buffer(r.tensor).packing is not None]


def _panel_bytes(read: Read, loops: list[ConstantLoop], kernel: LoopKernel) -> int | None:
    """Bytes from the first to past the last element ``read`` reaches as ``loops`` run (a
    panel); None unless they move it affinely."""
    buf = kernel.buffer(read.tensor)
    moving = {lp.var for lp in loops}
    reach = 0
    for index, stride in zip(read.indices, buf.strides):
        if not _index_vars(index) & moving:
            continue
        form = affine(index)
        if form is None:
            return None
        if not isinstance(stride, int):   # (a symbolic kernel's: the reach is unknown)
            return None
        lo, hi = span({v: c for v, c in form.items() if v in moving}, tuple(loops))
        reach += (hi - lo) * stride
    return (reach + 1) * np.dtype(buf.dtype.numpy).itemsize


def _index_vars(e: Read | Expr) -> set[str]:
    exprs = e.indices if isinstance(e, Read) else (e,)
    return {n.name for x in exprs for n in walk(x) if isinstance(n, IndexVar)}
