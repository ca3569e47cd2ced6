"""Products on a CPU's matrix tiles (AMX): a loop-IR pass, TVM's tensorize for one intrinsic.

A product of words (``bfdot2``: 2 bfloat16 per int32, summed in float32; ``dot4``: 4
unsigned times 4 signed bytes, summed in int32),

    Y(.., r, .., c) = Y(.., r, .., c) + bfdot2(P(.., r, .., k), W(.., k, .., c))

over a nest of serial loops with constant bounds (loops around several such nests, full
and partial register tiles, distribute over them first), is a matrix product whose
rows ``r`` step through ``Y`` and ``P`` evenly, whose columns ``c`` lie contiguous in
``Y`` and ``W``, and whose words ``k`` lie contiguous in ``P`` and step through ``W``
evenly: the operands of AMX's tiles (16 rows of 64 bytes; ``W``'s words of 2 bfloat16
of one column side by side are its "VNNI" layout). Loops that step one of those three
axes in whole runs of the loop inside them (``c2 + c5 + c7``: rows 64 apart, 4 apart,
1 apart) merge into one axis; the nest's other loops (a convolution's window, rows of
another dimension) stay loops, around the product (any order sums the same products).

The pass cuts the axes into blocks of :data:`BLOCK_ROWS` x :data:`BLOCK_COLS` outputs
(2 x 2 tiles of 16 x 16 sums, which the tiles keep across the whole depth) and puts
a :class:`~polyfuse.ir.loops.TileProduct` in each, with its loops: a target with tiles
runs the block on them, every other target and the interpreter run the loops. A last,
partial block (rows or columns left over) is a block of its own size. Constant weights
are read from a copy packed once, in panels of 32 columns (:func:`_panels`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from polyfuse.ir.comprehension import Binary, BinaryOp, Call, Expr, Literal, Read, map_expr
from polyfuse.ir.loops import (Buffer, BufferRole, For, LoopKernel, LoopKind, LoopRewriter, Packing, Scope, Stmt, Store, TileProduct,
                               constant_trips, fresh_name, map_body_exprs, walk_scoped, walk_stmts)
from polyfuse.ir.types import DType
from polyfuse.ir.affine import Affine, ConstantLoop, affine, constant_loop, to_expr

BLOCK_ROWS = 32    # outputs of a block: 2 x 2 tiles of 16 rows of 16 sums
BLOCK_COLS = 32
MIN_COLS = 16      # narrower products waste most of a tile
MIN_DEPTH = 16     # words: one tile row (64 bytes)

# the word types and accumulators of the builtins the tiles sum
_OPERANDS = {"bfdot2": (DType.INT32, DType.FLOAT32), "dot4": (DType.INT32, DType.INT32)}


@dataclass(frozen=True)
class _Axis:
    """Loops merged into one axis of ``size`` points: point ``p`` moves each operand's
    index forms by ``p * unit`` (per index, per operand) from where the loops start."""

    loops: tuple[ConstantLoop, ...]
    unit: tuple[tuple[int, ...], ...]
    size: int


@dataclass
class _Context:
    """What the pass knows while it walks a kernel: the dot products the tiles sum, the
    constant inputs, the names taken, the weights packed in panels so far and the loops
    around the statement at hand (outermost first)."""

    kernel: LoopKernel
    builtins: frozenset[str]
    constants: frozenset[str]
    taken: set[str]
    panels: dict[str, tuple[Buffer, tuple[int, ...]]] = field(default_factory=dict)  # and the order of dims
    path: tuple[For, ...] = ()


def use_matrix_tiles(kernel: LoopKernel, builtins: frozenset[str],
                     constants: frozenset[str] = frozenset()) -> LoopKernel:
    """``kernel`` with the products of ``builtins`` (those the target's tiles sum) put on
    tiles, block by block (see the module docstring). A ``b`` operand named in
    ``constants`` (weights, the same on every call) is read from a copy packed once, before
    the kernel runs, in panels of :data:`BLOCK_COLS` columns (see :func:`_panels`)."""
    if not builtins & set(_OPERANDS):
        return kernel
    taken = {b.name for b in kernel.buffers} | {s.name for s in kernel.scalars} | _loop_vars(kernel.body)
    ctx = _Context(kernel, builtins, constants, taken)
    body = _Tiles(ctx).body(kernel.body, Scope())
    if not ctx.panels:
        return replace(kernel, body=body)
    # packed inputs go after the kernel's inputs: calls pass every input before the outputs
    last_in = max(k for k, b in enumerate(kernel.buffers) if b.role is BufferRole.IN)
    buffers = kernel.buffers[:last_in + 1] + tuple(p for p, _ in ctx.panels.values()) + kernel.buffers[last_in + 1:]
    return replace(kernel, buffers=buffers, body=body)


class _Tiles(LoopRewriter):
    def __init__(self, ctx: _Context) -> None:
        self.ctx = ctx

    def loop(self, s: For, scope: Scope) -> Stmt | tuple[Stmt, ...]:
        tiled = _tiled(s, replace(self.ctx, path=scope.loops)) if s.kind is LoopKind.SERIAL else None
        return tiled if tiled is not None else super().loop(s, scope)


def _loop_vars(body: tuple[Stmt, ...]) -> set[str]:
    return {s.var for s in walk_stmts(body) if isinstance(s, For)}


def _tiled(top: For, ctx: _Context) -> tuple[Stmt, ...] | None:
    """The nests under ``top`` with their products on tiles, or None if none goes on
    tiles. A loop around several nests (full and partial register tiles) distributes
    over them first: every statement under ``top`` accumulating a product into its own
    element (and none reading what another writes), any order of the loops sums the same
    products."""
    chains = _distributed(top)
    products = [_product(store, ctx.kernel, ctx.builtins) for _, store in (chains or [])]
    if not products or any(p is None for p in products) or \
            {p[1].tensor for p in products} & {r.tensor for p in products for r in p[2:]}:  # type: ignore[index]
        return None
    out: list[Stmt] = []
    tiled = False
    for loops, store in chains:
        blocks = _on_tiles(loops, store, ctx)
        tiled |= blocks is not None
        out += blocks if blocks is not None else _nest(loops, (store,))
    return tuple(out) if tiled else None


def _distributed(top: For) -> list[tuple[list[For], Store]] | None:
    """The perfect nests ``top`` distributes into, each its loops and its one store; None
    unless every loop is serial with constant bounds and holds loops or one store."""
    chains: list[tuple[list[For], Store]] = []
    for s, scope in walk_scoped((top,)):
        if isinstance(s, Store):
            chains.append((list(scope.loops), s))  # type: ignore[arg-type]
        elif not (isinstance(s, For) and s.kind is LoopKind.SERIAL and constant_trips(s)
                  and (len(s.body) == 1 and isinstance(s.body[0], Store) or all(isinstance(x, For) for x in s.body))):
            return None
    return chains


def _nest(loops: list[For], body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    """``loops`` (outermost first) around ``body``."""
    for lp in reversed(loops):
        body = (replace(lp, body=body),)
    return body


def _on_tiles(nest: list[For], store: Store, ctx: _Context) -> tuple[Stmt, ...] | None:
    """The perfect nest of ``nest`` around ``store`` on tiles, or None if the tiles cannot
    hold its product."""
    kernel = ctx.kernel
    operands = _product(store, kernel, ctx.builtins)
    assert operands is not None
    builtin, acc, a, b = operands
    forms = [[affine(i) for i in r.indices] for r in (acc, a, b)]
    if any(f is None for fs in forms for f in fs) or any(r.is_checked(d) for r in (acc, a, b)
                                                           for d in range(len(r.indices))) \
            or not all(kernel.buffer(r.tensor).fixed for r in (acc, a, b)):
        return None
    strides = [kernel.buffer(r.tensor).strides for r in (acc, a, b)]
    loops = [constant_loop(lp) for lp in nest]
    used = [{v for f in fs for v in f if v} for fs in forms]  # type: ignore[union-attr]
    role = {(True, True, False): 0, (True, False, True): 1, (False, True, True): 2}
    groups: list[list[ConstantLoop]] = [[], [], []]   # rows, columns, depth
    for lp in loops:
        kind = role.get(tuple(lp.var in u for u in used))  # type: ignore[call-overload]
        if kind is not None:
            groups[kind].append(lp)
    # contiguous: the columns of acc and b (operands 0, 2), the words of a (operand 1)
    rows = _axis(groups[0], forms, strides, ())    # type: ignore[arg-type]
    cols = _axis(groups[1], forms, strides, (0, 2))  # type: ignore[arg-type]
    depth = _axis(groups[2], forms, strides, (1,))  # type: ignore[arg-type]
    if rows is None or cols is None or depth is None or cols.size < MIN_COLS or depth.size < MIN_DEPTH:
        return None
    steps = (_flat(rows.unit[0], strides[0]), _flat(rows.unit[1], strides[1]), _flat(depth.unit[2], strides[2]))
    if steps[0] < cols.size or min(steps) < 1:
        return None   # rows of acc overlapping (a sum tile stores would lose) or running backwards
    merged = {lp.var for axis in (rows, cols, depth) for lp in axis.loops}
    outer = [lp for lp in nest if lp.var not in merged]
    panels = _panels(b, forms[2], cols, depth, [*ctx.path, *outer], ctx)  # type: ignore[arg-type]
    if panels is not None:
        packed, order = panels
        steps = steps[:2] + (sum(depth.unit[2][d] * packed.strides[1 + order.index(d)] for d in order),)
    names = [fresh_name(n, ctx.taken) for n in ("rb", "cb", "r", "c", "k")]
    body = _blocks(builtin, (acc, a, b), store, forms, (rows, cols, depth), steps, names)  # type: ignore[arg-type]
    if panels is not None:
        body = map_body_exprs(body, lambda e: _in_panels(e, b.tensor, *panels))
    return _nest([replace(lp, vector=1, unroll=1) for lp in outer], body)


def _panels(b: Read, forms: list[Affine], cols: _Axis, depth: _Axis, around: list[For],
            ctx: _Context) -> tuple[Buffer, tuple[int, ...]] | None:
    """The constant ``b`` packed in panels of :data:`BLOCK_COLS` columns, ``(columns / 32,
    other dims..., the depth's dims..., 32)`` (a tile of 16 words then reads 64 bytes of
    each 128 in a row, not of rows a whole row of the weights apart: 16 pages for 3072
    columns), and the order of ``b``'s other dims in it; if ``b``'s columns are its last
    index and every block starts a panel: the columns a multiple of 32, and the loops
    ``around`` the blocks (and the column axis's start) moving them by multiples of 32."""
    source = ctx.kernel.buffer(b.tensor)
    rank = len(source.shape)
    if b.tensor not in ctx.constants or source.role is not BufferRole.IN or source.packing is not None \
            or source.shape[-1] % BLOCK_COLS or cols.unit[2] != (0,) * (rank - 1) + (1,) or depth.unit[2][-1]:
        return None
    loops = {lp.var: constant_loop(lp) for lp in around}
    start = forms[-1].get("", 0) + sum(forms[-1].get(lp.var, 0) * lp.lo for lp in cols.loops)
    moves = [(c, loops.get(v)) for v, c in forms[-1].items() if v and v not in {lp.var for lp in cols.loops}]
    if start % BLOCK_COLS or any(lp is None or (c * lp.lo) % BLOCK_COLS or (c * lp.step) % BLOCK_COLS
                                 for c, lp in moves):
        return None
    unit = depth.unit[2][:-1]
    order = tuple(d for d in range(rank - 1) if not unit[d]) + tuple(d for d in range(rank - 1) if unit[d])
    if b.tensor not in ctx.panels:
        coefs = tuple(tuple(int(a == order.index(d) + 1) for a in range(rank + 1)) for d in range(rank - 1))
        packing = Packing(b.tensor, (0,) * rank, coefs + ((BLOCK_COLS,) + (0,) * (rank - 1) + (1,),))
        shape = (source.shape[-1] // BLOCK_COLS, *(source.shape[d] for d in order), BLOCK_COLS)
        ctx.panels[b.tensor] = (Buffer(fresh_name(f"{b.tensor}_panels", ctx.taken), source.dtype, shape,
                                       BufferRole.IN, packing=packing), order)
    return ctx.panels[b.tensor] if ctx.panels[b.tensor][1] == order else None


def _in_panels(e: Expr, tensor: str, panels: Buffer, order: tuple[int, ...]) -> Expr:
    """A read of ``tensor(i..., j)`` as ``panels(j / 32, i... in ``order``, j % 32)``."""
    if not isinstance(e, Read) or e.tensor != tensor:
        return e
    j, size = e.indices[-1], _int(BLOCK_COLS)
    return Read(panels.name, (Binary(BinaryOp.DIV, j, size, DType.INT64), *(e.indices[d] for d in order),
                              Binary(BinaryOp.MOD, j, size, DType.INT64)), e.dtype)


def _product(store: Store, kernel: LoopKernel, builtins: frozenset[str]) -> tuple[str, Read, Read, Read] | None:
    """``builtin, acc, a, b`` of ``acc = acc + builtin(a, b)`` (either order of the sum)."""
    v = store.value
    if not isinstance(v, Binary) or v.op is not BinaryOp.ADD:
        return None
    acc = Read(store.buffer, store.indices, kernel.buffer(store.buffer).dtype)
    for mine, call in ((v.lhs, v.rhs), (v.rhs, v.lhs)):
        if mine == acc and isinstance(call, Call) and call.fn in builtins and call.fn in _OPERANDS \
                and all(isinstance(x, Read) for x in call.args):
            a, b = call.args
            word, sums = _OPERANDS[call.fn]
            buffers = [kernel.buffer(r.tensor) for r in (acc, a, b)]  # type: ignore[union-attr]
            if buffers[0].dtype is sums and buffers[1].dtype is word and buffers[2].dtype is word \
                    and buffers[0].role is not BufferRole.IN and acc.tensor not in (a.tensor, b.tensor):  # type: ignore[union-attr]
                return call.fn, acc, a, b  # type: ignore[return-value]
    return None


def _axis(loops: list[ConstantLoop], forms: list[list[Affine]], strides: list[tuple[int, ...]],
          contiguous: tuple[int, ...]) -> _Axis | None:
    """The loops of ``loops`` that merge into one axis, from the one whose step moves the
    ``contiguous`` operands by one element (or, with none, the one moving the accumulator
    least) outward, each stepping by the whole run of those inside it in every index of
    every operand; None if no loop starts an axis."""
    def unit(lp: ConstantLoop) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(f.get(lp.var, 0) * lp.step for f in fs) for fs in forms)

    starts = [lp for lp in loops if all(_flat(unit(lp)[o], strides[o]) == 1 for o in contiguous)]
    if not contiguous:
        starts = sorted(loops, key=lambda lp: abs(_flat(unit(lp)[0], strides[0])))[:1]
    if not starts:
        return None
    chain, size = [starts[0]], starts[0].trips
    first = unit(starts[0])
    rest = [lp for lp in loops if lp is not starts[0]]
    while True:
        nxt = next((lp for lp in rest if unit(lp) == tuple(tuple(c * size for c in u) for u in first)), None)
        if nxt is None:
            break
        chain.append(nxt)
        rest.remove(nxt)
        size *= nxt.trips
    return _Axis(tuple(chain), first, size)


def _flat(unit: tuple[int, ...], strides: tuple[int, ...]) -> int:
    return sum(u * s for u, s in zip(unit, strides))


def _blocks(builtin: str, reads: tuple[Read, Read, Read], store: Store, forms: list[list[Affine]],
            axes: tuple[_Axis, _Axis, _Axis], steps: tuple[int, int, int], names: list[str]) -> tuple[Stmt, ...]:
    """Loops over the blocks of rows (``rb``) and columns (``cb``), whole blocks first, then
    the last partial one of each, a tile product in each."""
    rows, cols, depth = axes
    rb, cb, r, c, k = names
    out: list[Stmt] = []
    for r_lo, r_hi, r_size in _parts(rows.size, BLOCK_ROWS):
        inner: list[Stmt] = []
        for c_lo, c_hi, c_size in _parts(cols.size, BLOCK_COLS):
            at = [(rows, (rb,)), (cols, (cb,)), (depth, ())]
            corner = [_moved(read, o, forms[o], at) for o, read in enumerate(reads)]
            point = [(rows, (rb, r)), (cols, (cb, c)), (depth, (k,))]
            moved = {read: _moved(read, o, forms[o], point) for o, read in enumerate(reads)}
            value = map_expr(store.value, lambda e: moved.get(e, e))  # type: ignore[arg-type]
            nest: Stmt = Store(store.buffer, moved[reads[0]].indices, value)
            for var, size in reversed(((r, r_size), (c, c_size), (k, depth.size))):
                nest = For(var, _int(0), _int(size), (nest,))
            tile = TileProduct(builtin, (r_size, c_size, depth.size), *corner, steps, (nest,))  # type: ignore[misc]
            inner.append(For(cb, _int(c_lo), _int(c_hi), (tile,), step=BLOCK_COLS))
        out.append(For(rb, _int(r_lo), _int(r_hi), tuple(inner), step=BLOCK_ROWS))
    return tuple(out)


def _parts(size: int, block: int) -> list[tuple[int, int, int]]:
    """``(lo, hi, block size)`` of the whole blocks of an axis and of the partial last one."""
    whole = size // block * block
    parts = [(0, whole, block)] if whole else []
    return parts + ([(whole, size, size - whole)] if size > whole else [])


def _moved(read: Read, operand: int, forms: list[Affine], at: list[tuple[_Axis, tuple[str, ...]]]) -> Read:
    """``read`` (operand ``operand``, index forms ``forms``) with each axis's loops
    replaced by the sum of the point variables named with it (none: the axis's start)."""
    indices: list[Expr] = []
    for d, f in enumerate(forms):
        form = dict(f)
        for axis, points in at:
            for lp in axis.loops:
                form[""] = form.get("", 0) + form.pop(lp.var, 0) * lp.lo
            for p in points:
                form[p] = form.get(p, 0) + axis.unit[operand][d]
        indices.append(to_expr({v: c for v, c in form.items() if c}))
    return replace(read, indices=tuple(indices))


def _int(v: int) -> Literal:
    return Literal(v, DType.INT64)
