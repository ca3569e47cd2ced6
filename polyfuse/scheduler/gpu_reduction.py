"""Reductions across the threads of a block: strided partials, then warp shuffles.

A statement's reduction in register form (after ``promote_accumulators``) reads::

    let acc = out(i)
    for k in lo:hi { let acc = acc op value }    (op: +, *, max or min)
    out(i) = acc

With ``block_reduction`` on, the mapping spreads it over the block's threads along x
(:func:`spread`): every thread starts from the identity and accumulates iterations
``k = lo + t, lo + t + blockDim.x, ...``; after the block shape is known,
:func:`expand_trees` adds the combination, in the compute type (float32 for 16-bit
floats, 64-bit for integers, as the registers hold them):

* up to 32 threads along x, a power of two: one warp reduction (shuffles, no memory);
* a multiple of 32: a warp reduction in each warp, each warp's total to a shared slot,
  and every thread combining the slots in order;
* any other width: each thread's partial to a shared slot of its own, the slots past
  the largest power of two folded onto the first ones, halving strides combining the
  rest, and every thread reading slot 0.

Then one thread combines the total with ``out(i)``'s value before the statement (so
``+=`` keeps it and ``+=!`` starts from the identity its initialization stored) and
writes it. The stores to slots are ordinary thread regions and the reads of them
uniform statements, so barrier placement puts ``__syncthreads()`` between them and
nowhere else; a warp reduction needs none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from polyfuse.ir.comprehension import (Binary, BinaryOp, Call, Expr, IndexVar, Literal, LocalRef, Read, ReduceOp, combine,
                                       walk)
from polyfuse.ir.comprehension_interpreter import identity
from polyfuse.ir.gpu import SharedTile, SingleThread, ThreadFor, WarpReduce
from polyfuse.ir.loops import (Assign, For, If, LoopRewriter, Scope, Stmt, Store, perfect_nest, stmt_bodies,
                               walk_stmts)
from polyfuse.ir.types import DType

LANE = "pf_t"  # the tree's loop variable: iteration t runs on thread t
WARP = 32      # threads of a warp, which shuffles combine without memory


def start(op: ReduceOp, dtype: DType) -> Literal:
    """The identity of ``op`` as a literal of ``dtype``."""
    value = identity(op, dtype)
    return Literal(float(value) if dtype.is_float else int(value), dtype)


@dataclass(frozen=True, slots=True)
class Reduction:
    """The three statements of a reduction in register form, and how it combines."""

    load: Assign
    loop: For
    store: Store
    op: ReduceOp

    @property
    def acc(self) -> LocalRef:
        return LocalRef(self.load.var, self.load.value.dtype)

    @property
    def partial_dtype(self) -> DType:
        dtype = self.acc.dtype
        return DType.INT64 if dtype.is_int and dtype is not DType.UINT64 else dtype.compute


@dataclass(frozen=True, slots=True)
class TreeSlot(Stmt):
    """Where :func:`expand_trees` puts a reduction's tree; exists only inside the mapping."""

    reduction: Reduction

    def map_exprs(self, fn: Callable[[Expr], Expr]) -> TreeSlot:
        return self

    def exprs(self) -> tuple[Expr, ...]:
        return ()

    def format_lines(self, indent: str) -> list[str]:
        return [f"{indent}tree {self.reduction.op.value} of {self.reduction.acc.name}"]


def match_reduction(stmts: tuple[Stmt, ...]) -> Reduction | None:
    """The reduction the first three of ``stmts`` make, or None."""
    if len(stmts) < 3:
        return None
    load, loop, store = stmts[:3]
    if not (isinstance(load, Assign) and isinstance(loop, For) and isinstance(store, Store)):
        return None
    if not (isinstance(load.value, Read) and load.value.tensor == store.buffer
            and load.value.indices == store.indices and store.value == LocalRef(load.var, load.value.dtype)):
        return None
    if load.value.dtype.is_bool:
        return None
    loops = perfect_nest(loop)
    update = loops[-1].body[0] if len(loops[-1].body) == 1 else None
    if not isinstance(update, Assign) or update.var != load.var:
        return None
    op = _combine(update.value, load.var)
    if op is None or any(_reads_local(e, load.var) for f in loops for e in (f.lo, f.hi)):
        return None
    return Reduction(load, loop, store, op)


def _combine(value: Expr, acc: str) -> ReduceOp | None:
    """How ``value`` updates ``acc``: ``acc op e`` or ``e op acc`` with ``acc`` not in ``e``."""
    if isinstance(value, Binary) and value.op in (BinaryOp.ADD, BinaryOp.MUL):
        operands = (value.lhs, value.rhs)
        op = ReduceOp.ADD if value.op is BinaryOp.ADD else ReduceOp.MUL
    elif isinstance(value, Call) and value.fn in ("max", "min") and len(value.args) == 2:
        operands = value.args
        op = ReduceOp(value.fn)
    else:
        return None
    refs = [isinstance(x, LocalRef) and x.name == acc for x in operands]
    if sum(refs) != 1 or _reads_local(operands[refs.index(False)], acc):
        return None
    return op


def _reads_local(e: Expr, name: str) -> bool:
    return any(isinstance(x, LocalRef) and x.name == name for x in walk(e))


def holds_reduction(s: Stmt) -> bool:
    """Whether a reduction in register form stands anywhere inside ``s``."""
    return any(match_reduction(b[k:]) is not None
               for x in walk_stmts((s,)) for b in stmt_bodies(x) for k in range(len(b)))


def spread(r: Reduction, serial: Callable[[tuple[Stmt, ...]], tuple[Stmt, ...]]) -> tuple[Stmt, ...]:
    """Each thread's strided partial, and the slot of the tree; ``serial`` maps loops run
    inside one thread."""
    f = r.loop
    return (Assign(r.acc.name, start(r.op, r.acc.dtype)),
            ThreadFor(f.var, f.lo, f.hi, 0, serial(f.body), f.step),
            TreeSlot(r))


class TreeNames:
    """Names for the shared partial arrays of one launch, clear of the kernel's buffers."""

    def __init__(self, taken: set[str]) -> None:
        self.taken = set(taken)

    def fresh(self, buffer: str) -> str:
        k = 0
        while f"{buffer}_r{k}" in self.taken:
            k += 1
        self.taken.add(f"{buffer}_r{k}")
        return f"{buffer}_r{k}"


def partial_slots(width: int) -> int:
    """Shared slots a tree over ``width`` threads takes: none for one warp's shuffles (a
    power of two up to 32), one per warp after shuffles in each, else one per thread."""
    if width <= WARP and width & (width - 1) == 0:
        return 0
    return width // WARP if width % WARP == 0 else width


def expand_trees(body: tuple[Stmt, ...], width: int,
                 names: TreeNames) -> tuple[tuple[Stmt, ...], tuple[SharedTile, ...]]:
    """``body`` with every tree slot replaced by its tree over ``width`` threads, and the
    shared arrays the trees use."""
    tiles: list[SharedTile] = []

    class Expand(LoopRewriter):
        def leaf(self, s: Stmt, scope: Scope) -> Stmt | tuple[Stmt, ...]:
            if not isinstance(s, TreeSlot):
                return s
            r = s.reduction
            slots = partial_slots(width)
            if not slots:
                return (WarpReduce(r.acc.name, r.partial_dtype, r.op, width), _write(r))
            tile = SharedTile(names.fresh(r.store.buffer), r.store.buffer, r.partial_dtype, (slots,))
            tiles.append(tile)
            return (*(_warps(r, tile, width) if width % WARP == 0 else _tree(r, tile, width)), _write(r))

    return Expand().body(body, Scope()), tuple(tiles)


def _write(r: Reduction) -> SingleThread:
    """One thread combines the output's value before the statement with the total."""
    return SingleThread((Assign(r.acc.name, combine(r.op, r.load.value, r.acc, r.acc.dtype)), r.store))


def _warps(r: Reduction, tile: SharedTile, width: int) -> list[Stmt]:
    """Shuffles in each warp, each warp's first lane's total to ``tile``, and every thread
    combining the warps' totals (in order, so all threads agree)."""
    lane = IndexVar(LANE)
    first = Binary(BinaryOp.EQ, Binary(BinaryOp.MOD, lane, Literal(WARP, DType.INT64), DType.INT64),
                   Literal(0, DType.INT64), DType.BOOL)
    warp = Binary(BinaryOp.DIV, lane, Literal(WARP, DType.INT64), DType.INT64)
    w = IndexVar(f"{LANE}w")
    total = combine(r.op, r.acc, Read(tile.name, (w,), tile.dtype), r.acc.dtype)
    return [WarpReduce(r.acc.name, tile.dtype, r.op, WARP),
            ThreadFor(LANE, Literal(0, DType.INT64), Literal(width, DType.INT64), 0,
                      (If(first, (Store(tile.name, (warp,), r.acc),)),)),
            Assign(r.acc.name, start(r.op, r.acc.dtype)),
            For(w.name, Literal(0, DType.INT64), Literal(width // WARP, DType.INT64), (Assign(r.acc.name, total),))]


def _tree(r: Reduction, tile: SharedTile, width: int) -> list[Stmt]:
    """Partials to ``tile``, a fold onto a power of two, halving steps, and every thread
    taking the total."""
    lane = IndexVar(LANE)
    dtype = tile.dtype

    def slot(offset: int) -> Read:
        index = lane if offset == 0 else Binary(BinaryOp.ADD, lane, Literal(offset, DType.INT64), DType.INT64)
        return Read(tile.name, (index,), dtype)

    def step(threads: int, stride: int) -> ThreadFor:
        value = combine(r.op, slot(0), slot(stride), dtype)
        return ThreadFor(LANE, Literal(0, DType.INT64), Literal(threads, DType.INT64), 0,
                         (Store(tile.name, (lane,), value),))

    out: list[Stmt] = [ThreadFor(LANE, Literal(0, DType.INT64), Literal(width, DType.INT64), 0,
                                 (Store(tile.name, (lane,), r.acc),))]
    power = 1 << (width.bit_length() - 1)
    if width > power:
        out.append(step(width - power, power))
    stride = power // 2
    while stride:
        out.append(step(stride, stride))
        stride //= 2
    out.append(Assign(r.acc.name, Read(tile.name, (Literal(0, DType.INT64),), dtype)))
    return out
