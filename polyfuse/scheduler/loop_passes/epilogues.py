"""Epilogues applied where a register block stores its result: a loop-IR pass.

A contraction with a pointwise consumer (a conv's bias, batch norm, ReLU and residual
add; a matmul's bias and GELU) schedules as two nests: the contraction writes ``T``,
then a second pass reads all of ``T`` back (with the bias and the residual) and writes
``Y``. That pass streams the whole result through memory once more. oneDNN applies such
post-ops to the accumulators before they leave the registers; this pass does the same
for the nests ``promote_register_blocks`` leaves, whose blocks end in
``T(F) = acc(j, v)``::

    for ...: T(F) = acc(j, v)                          # the block's store
    if <the reduction's last tile>:                     # (tiled reductions only)
      for ...: Y(F) = max(acc(j, v) + B(F3) + R(F), 0)  # the epilogue, on the block

and the epilogue's nest goes. It applies when the epilogue nest (or the nests of full and
partial tiles that ``separate_full_tiles`` split it into, side by side) follows the
contraction's directly and every statement of it is ``Y(E) = f(T(E), ...)``, the same
``f`` for every statement, whose other reads index only by whole indices of ``E``
(``B(E3)``, ``R(E)``): then ``f`` at the block's element ``F`` is ``f`` with ``E``
replaced by ``F``. The block must store every element of ``T`` from an ``acc``; loops
around it that its element does not move with are reduction tiles, and the epilogue runs
on their last iteration. ``T`` is still stored: it is an output of the definition, which
a TC caller gets back.
"""

from __future__ import annotations

import math
from dataclasses import replace

from polyfuse.ir.comprehension import Binary, BinaryOp, Expr, IndexVar, Literal, Read, map_expr, walk
from polyfuse.ir.loops import (BufferRole, For, If, LoopKernel, Stmt, Store, TileProduct, constant_trips, extent_expr, rewrite,
                               perfect_nest, stmt_nodes, walk_scoped, walk_stmts)
from polyfuse.ir.types import DType

_I64 = DType.INT64
_SLOT = "__epilogue_index"


def fuse_epilogues(kernel: LoopKernel, whole: frozenset[str] = frozenset()) -> LoopKernel:
    """Apply each pointwise epilogue nest in the stores of the register blocks before it.

    ``whole`` names outputs one statement writes entirely. The product ``T`` must be one
    of them, stored by the contraction's nest alone: its blocks then store every element
    of ``T``, so the epilogue they apply writes every element of ``Y`` (a ``T`` written
    piecewise by several statements, one row each, would leave the other rows of ``Y``
    unwritten). An epilogue nest writing one of them may be split into full and partial
    tiles (its stores are still every element); any other must be one perfect nest whose
    iterations cover the output. The nests of full and partial tiles of an epilogue
    whose rows leave a partial cache tile (200 rows in tiles of 64) follow one another
    at the kernel's top; they fuse together."""
    body = list(kernel.body)
    changed = False
    k = 0
    while k + 1 < len(body):
        n = _epilogue_nests(body, k + 1)
        others = body[:k] + body[k + 1 + n:]
        fused = _fuse(body[k], body[k + 1:k + 1 + n], kernel, whole, others)
        if fused is None:
            k += 1
        else:   # the contraction's nest, or (its block stores at the top) stores and epilogue
            body[k:k + 1 + n] = fused
            changed = True
            k += len(fused) - 1
    return replace(kernel, body=tuple(body)) if changed else kernel


def _epilogue_nests(body: list[Stmt], start: int) -> int:
    """How many nests from ``body[start]`` on store only the buffer it stores: one
    epilogue split into full tiles and the partial ones after them (at least 1)."""
    def target(s: Stmt) -> str | None:
        buffers = {t.buffer for t in walk_stmts((s,)) if isinstance(t, Store)}
        return buffers.pop() if isinstance(s, For) and len(buffers) == 1 else None
    first = target(body[start])
    n = 1
    while first is not None and start + n < len(body) and target(body[start + n]) == first:
        n += 1
    return n


def _innermost(nest: Stmt) -> tuple[Store, ...] | None:
    """The statements at the bottom of a perfect loop nest, if they are all stores."""
    if not isinstance(nest, For):
        return None
    inner = perfect_nest(nest)[-1].body
    return inner if all(isinstance(s, Store) for s in inner) else None  # type: ignore[return-value]


def _trips(nest: Stmt) -> int:
    """Iterations of a perfect nest with constant bounds (0 if a bound is not constant)."""
    return math.prod(constant_trips(lp) or 0 for lp in perfect_nest(nest)) if isinstance(nest, For) else 1


def _covers(nest: Stmt, kernel: LoopKernel) -> bool:
    """Whether the stores of a perfect nest write every element of their buffer: as many
    as it has with constant bounds, or (extents of a symbolic kernel's sizes) each store
    indexed by the loops' variables in order, each loop from 0 by 1 to its extent."""
    stores = _innermost(nest)
    assert stores is not None
    shape = kernel.buffer(stores[0].buffer).shape
    if kernel.buffer(stores[0].buffer).fixed and _trips(nest) * len(stores) == math.prod(shape):   # type: ignore[arg-type]
        return True
    loops = perfect_nest(nest)   # type: ignore[arg-type]
    return len(stores) == 1 and len(loops) == len(shape) and all(
        lp.lo == Literal(0, _I64) and lp.step == 1 and index == IndexVar(lp.var) and lp.hi == extent_expr(extent)
        for lp, index, extent in zip(loops, stores[0].indices, shape))


def _template(s: Store, source: str) -> Expr | None:
    """``s``'s value with each of its own indices replaced by a slot ``k`` (the read of
    ``source`` at the stored element included), or None when a read indexes by anything
    else or a loop index appears outside reads."""
    slots = {e: IndexVar(f"{_SLOT}{k}") for k, e in enumerate(s.indices)}

    def abstract(e: Expr) -> Expr:
        if isinstance(e, Read):
            if any(i not in slots and any(isinstance(n, IndexVar) for n in walk(i)) for i in e.indices):
                raise _Unfit
            return replace(e, indices=tuple(slots.get(i, i) for i in e.indices))
        return e

    try:
        out = map_expr(s.value, abstract)
    except _Unfit:
        return None
    if any(isinstance(n, IndexVar) and not n.name.startswith(_SLOT) for n in walk(out)):
        return None   # a loop index outside the reads (a select on the position)
    own = [r for r in walk(out) if isinstance(r, Read) and r.tensor == source]
    if not own or any(r.indices != tuple(slots.values()) for r in own):
        return None
    return out


class _Unfit(Exception):
    pass


def _all_stores(nest: Stmt) -> tuple[Store, ...] | None:
    """Every statement under ``nest`` when all of them are stores (loops and ifs around)."""
    stmts = [s for s in walk_stmts((nest,)) if not isinstance(s, (For, If))]
    return tuple(stmts) if stmts and all(isinstance(s, Store) for s in stmts) else None  # type: ignore[misc]


def _fuse(first: Stmt, seconds: list[Stmt], kernel: LoopKernel, whole: frozenset[str],
          others: list[Stmt]) -> tuple[Stmt, ...] | None:
    second = seconds[0]
    stores = _innermost(second) if len(seconds) == 1 else None
    split = stores is None   # full and partial tiles: fine for an output written whole
    if split:
        found = [_all_stores(s) for s in seconds]
        stores = None if None in found else tuple(t for f in found for t in f)  # type: ignore[union-attr]
    if not isinstance(first, For) or not stores:
        return None
    target = stores[0].buffer

    def alone(name: str) -> bool:   # one statement writes it whole, in this nest only
        return name in whole and not any(isinstance(s, Store) and s.buffer == name
                                         for s in walk_stmts(tuple(others)))
    if split and not alone(target):
        return None
    written = {s.buffer for s in walk_stmts((first,)) if isinstance(s, Store)}
    sources = {r.tensor for s in stores for r in walk(s.value) if isinstance(r, Read)} & written
    if len(sources) != 1 or any(s.buffer != target for s in stores) or target in written:
        return None
    source = sources.pop()
    if not alone(source):
        return None  # the blocks here would store only part of T: the epilogue must cover all of Y
    dtype = kernel.buffer(source).dtype
    if dtype.compute is not dtype or kernel.buffer(target).role is BufferRole.LOCAL:
        return None  # a 16-bit T is rounded before the epilogue reads it; acc is not
    if kernel.buffer(target).shape != kernel.buffer(source).shape or (not split and not _covers(second, kernel)) \
            or split and not kernel.buffer(target).fixed:
        return None  # the epilogue writes every element of Y, as the blocks store every one of T
    template = _template(stores[0], source)
    if template is None or any(_template(s, source) != template for s in stores[1:]):
        return None
    if any(r.tensor in written - {source} for r in walk(template) if isinstance(r, Read)) or \
            any(isinstance(r, Read) and r.tensor == target for st in walk_stmts((first,)) for r in stmt_nodes(st)):
        return None
    blocks = _find_blocks(first, source, kernel)   # each block's store nest (or tile product), its reduction tiles
    if not blocks:
        return None
    # a block store nest at the top (its tiles cover the output) becomes two statements
    return rewrite((first,), pre=lambda s: _apply(s, blocks, source, target, template))


def _is_block_store(s: Stmt, source: str, kernel: LoopKernel) -> bool:
    """A nest whose statements all store an ``acc`` element into ``source``, or add one
    to it (a block of a reduction tile, :mod:`.register_blocks`)."""
    stores = _innermost(s)

    def accumulator(e: Expr) -> bool:
        return isinstance(e, Read) and kernel.buffer(e.tensor).role is BufferRole.LOCAL

    def block_value(st: Store) -> bool:
        v = st.value
        return accumulator(v) or (isinstance(v, Binary) and v.op is BinaryOp.ADD and accumulator(v.rhs)
                                  and v.lhs == Read(source, st.indices, kernel.buffer(source).dtype))
    return bool(stores) and all(st.buffer == source and block_value(st) for st in stores)  # type: ignore[union-attr]


def _find_blocks(top: Stmt, source: str, kernel: LoopKernel) -> list[tuple[Stmt, list[For]]] | None:
    """The block store nests (or tile products) under ``top``, each with the reduction
    tiles around it; None when ``source`` is stored any other way."""
    found: list[tuple[Stmt, list[For]]] = []
    blocks: set[int] = set()
    for s, scope in walk_scoped((top,)):
        if any(id(lp) in blocks for lp in scope.loops):
            continue
        tile = isinstance(s, TileProduct) and s.acc.tensor == source
        if tile or isinstance(s, For) and _is_block_store(s, source, kernel):
            stores = _innermost(s.nest[0] if tile else s)  # type: ignore[union-attr]
            assert stores is not None
            used = {n.name for st in stores for i in st.indices for n in walk(i) if isinstance(n, IndexVar)}
            tiles = [lp for lp in scope.loops if lp.var not in used]
            if any(not (isinstance(lp.lo, Literal) and isinstance(lp.hi, Literal)) for lp in tiles):
                return None
            found.append((s, tiles))
            blocks.add(id(s))
        elif isinstance(s, Store) and s.buffer == source:
            return None
        elif not isinstance(s, (For, If, Store)) and \
                any(isinstance(t, Store) and t.buffer == source for t in walk_stmts((s,))):
            return None
    return found


def _on_tiles(tile: TileProduct, target: str, template: Expr) -> Stmt:
    """The epilogue over a tile product's block, once its tiles have stored it: its
    loops but the depth, each ``T(F)`` it stored read back (from L1) into ``Y(F)``."""
    rows = tile.nest[0]
    cols = rows.body[0]   # type: ignore[attr-defined]
    st = _innermost(rows)[0]   # type: ignore[index]

    def place(e: Expr) -> Expr:
        if isinstance(e, IndexVar) and e.name.startswith(_SLOT):
            return st.indices[int(e.name[len(_SLOT):])]
        return e
    store = Store(target, st.indices, map_expr(template, place))
    return replace(rows, body=(replace(cols, body=(store,), vector=16),))


def _last(lp: For) -> Expr:
    """``lp``'s variable is at its last iteration."""
    last = int(lp.lo.value) + ((constant_trips(lp) or 1) - 1) * lp.step  # type: ignore[attr-defined]
    return Binary(BinaryOp.EQ, IndexVar(lp.var), Literal(last, _I64), DType.BOOL)


def _apply(s: Stmt, blocks: list[tuple[Stmt, list[For]]], source: str, target: str,
           template: Expr) -> tuple[Stmt, ...] | None:
    block = next(((b, tiles) for b, tiles in blocks if b is s), None)
    if block is None:
        return None
    nest, tiles = block

    def epilogue(st: Stmt) -> Stmt | None:
        if not isinstance(st, Store) or st.buffer != source:
            return None
        at = {f"{_SLOT}{k}": e for k, e in enumerate(st.indices)}

        # the element the block stored: its acc, or (an acc added to it) the element itself
        stored = st.value if not isinstance(st.value, Binary) else st.value.lhs

        def place(e: Expr) -> Expr:
            if isinstance(e, Read) and e.tensor == source:
                return stored
            if isinstance(e, IndexVar) and e.name in at:
                return at[e.name]
            return e
        return Store(target, st.indices, map_expr(template, place))

    applied = _on_tiles(nest, target, template) if isinstance(nest, TileProduct) else \
        rewrite((nest,), pre=epilogue)[0]
    if not tiles:
        return nest, applied
    cond = _last(tiles[0])
    for lp in tiles[1:]:
        cond = Binary(BinaryOp.AND, cond, _last(lp), DType.BOOL)
    return nest, If(cond, (applied,))
