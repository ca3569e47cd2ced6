"""Reductions across the threads of a block: strided partials, then a tree in shared memory.

A statement's reduction in register form (after ``promote_accumulators``) reads::

    let acc = out(i)
    for k in lo:hi { let acc = acc op value }    (op: +, *, max or min)
    out(i) = acc

With ``block_reduction`` on, the mapping spreads it over the block's threads along x
(:func:`spread`): every thread starts from the identity and accumulates iterations
``k = lo + t, lo + t + blockDim.x, ...``; after the block shape is known,
:func:`expand_trees` adds the combination: each thread stores its partial to a shared
array of ``blockDim.x`` elements (in the compute type: float32 for 16-bit floats,
64-bit for integers, as the registers hold them), the slots past the largest power of
two fold onto the first ones, halving strides combine the rest, and one thread combines
the result with ``out(i)``'s value before the statement (so ``+=`` keeps it and ``+=!``
starts from the identity its initialization stored) and writes it. Every step is an
ordinary thread region: thread ``t`` writes slot ``t`` and reads slot ``t + stride``,
which another thread wrote, so barrier placement puts ``__syncthreads()`` between the
steps and nowhere inside one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from polyfuse.ir.comprehension import (Binary, BinaryOp, Call, Expr, IndexVar, Literal, LocalRef, Read, ReduceOp,
                                       walk)
from polyfuse.ir.comprehension_interpreter import identity
from polyfuse.ir.gpu import SharedTile, SingleThread, ThreadFor
from polyfuse.ir.loops import (Assign, For, LoopRewriter, Scope, Stmt, Store, perfect_nest, stmt_bodies,
                               walk_stmts)
from polyfuse.ir.types import DType

LANE = "pf_t"  # the tree's loop variable: iteration t runs on thread t


def combine(op: ReduceOp, a: Expr, b: Expr, dtype: DType) -> Expr:
    """``a op b`` for a reduction's ``op`` (+, *, max or min)."""
    if op in (ReduceOp.ADD, ReduceOp.MUL):
        return Binary(BinaryOp.ADD if op is ReduceOp.ADD else BinaryOp.MUL, a, b, dtype)
    return Call(op.value, (a, b), dtype)


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
            tile = SharedTile(names.fresh(r.store.buffer), r.store.buffer, r.partial_dtype, (width,))
            tiles.append(tile)
            return tuple(_tree(r, tile, width))

    return Expand().body(body, Scope()), tuple(tiles)


def _tree(r: Reduction, tile: SharedTile, width: int) -> list[Stmt]:
    """Partials to ``tile``, a fold onto a power of two, halving steps, one thread's write."""
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
    total = combine(r.op, r.acc, Read(tile.name, (Literal(0, DType.INT64),), dtype), r.acc.dtype)
    out.append(SingleThread((r.load, Assign(r.acc.name, total), r.store)))
    return out

