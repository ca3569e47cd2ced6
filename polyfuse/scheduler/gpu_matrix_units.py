"""Tensor cores: a register-tiled contraction's products on the GPU's matrix units.

After register tiling, shared-memory promotion and pipelining, a contraction's thread
region reads

    threads c3 in 0:BM step mr on y, c4 in 0:BN step nr on x registers acc float32(mr, nr) {
      for c3r in 0:mr { for c4r in 0:nr { acc(c3r, c4r) = ... } }          # inits
      for c2 ... {                                                          # reduction tiles
        copies, barriers
        for c5 in 0:BK { for c3r in 0:mr { for c4r in 0:nr {
          acc(c3r, c4r) = acc(c3r, c4r) + A_s(.., c3 + c3r, c5) * B_s(.., c5, c4 + c4r) }}}
      }
      for c3r in 0:mr { for c4r in 0:nr { C(..) = f(acc(c3r, c4r)) } }       # stores
    }

Here it becomes a *warp region* (:class:`~polyfuse.ir.gpu.Threads` with 32 lanes):
each warp owns a ``WM x WN`` tile of the block's ``BM x BN`` outputs (a multiple of the
``m16n8`` tile), its registers spread over its lanes in the matrix units' layout; the
inits and stores stay loops over the registers (each lane runs the points it holds),
and each product nest becomes a :class:`~polyfuse.ir.loops.TileProduct` ``mma_*``: on
TF32 (``mma_tf32``, m16n8k8: float32 operands rounded to TF32 first, which the nest
spells as ``tf32(x) * tf32(y)``) where the caller allows it (``precision="tf32"``), and
always on bfloat16 (``mma_bf16``) and float16 (``mma_f16``) operands, m16n8k16, whose
products are exact in the float32 sums.

A product nest whose depth is not constant (the reduction's last, partial tile) runs on
the matrix units where the tile is whole and as register loops (the same products, each
point's in the same order) where it is not. The region keeps its copies, barriers and
pipeline; the block becomes 32 lanes by the warps. A region is left as it is where any
part does not fit: a depth tile that is not a multiple of the product's k, block tiles
that no grid of warps divides into ``m16n8`` multiples, registers touched elsewhere than
at the point of register loops, or other thread loops in the launch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from polyfuse.ir.affine import max_trips, normal_form
from polyfuse.ir.comprehension import Binary, BinaryOp, Call, Cast, Expr, IndexVar, Literal, Read, index_names, map_expr
from polyfuse.ir.gpu import LANES, MMA_DEPTH, TILE_M, TILE_N, GpuKernel, register_loops, Launch, Registers, ThreadFor, ThreadRange, Threads, walk_gpu
from polyfuse.ir.loops import (For, If, LoopRewriter, Scope, Stmt, Store, TileProduct, fresh_name, stmt_bodies,
                               stmt_nodes, walk_stmts)
from polyfuse.ir.types import DType

MMA_ARCH = 80            # mma.sync on TF32 and bfloat16: sm_80 and later
MAX_REGISTERS = 128      # accumulators per lane (a warp tile of 64 x 64)


def use_matrix_units(kernel: GpuKernel, precision: str, arch: str) -> GpuKernel:
    """``kernel`` with its contractions' products on the matrix units where they fit
    (see the module docstring); float32 products only with ``precision="tf32"``."""
    if int(re.sub(r"\D", "", arch) or 0) < MMA_ARCH:
        return kernel
    return replace(kernel, launches=tuple(_launch(launch, precision) for launch in kernel.launches))


def _launch(launch: Launch, precision: str) -> Launch:
    regions = [s for s in walk_gpu(launch.body) if isinstance(s, Threads)]
    if len(regions) != 1 or regions[0].warps or any(isinstance(s, ThreadFor) for s in walk_gpu(launch.body)):
        return launch
    warped = _region(regions[0], precision)
    if warped is None:
        return launch
    region, block = warped

    class Swap(LoopRewriter):
        def nested(self, s: Stmt, scope: Scope) -> Stmt | tuple[Stmt, ...]:
            return region if s is regions[0] else super().nested(s, scope)

    return replace(launch, body=Swap().body(launch.body, Scope()), block=block)


@dataclass(frozen=True)
class _Micro:
    """The region's two ranges (rows, columns), its registers and their loops' variables."""

    rows: ThreadRange
    cols: ThreadRange
    acc: Registers
    r: str
    c: str


def _region(s: Threads, precision: str) -> tuple[Threads, tuple[int, int, int]] | None:
    micro = _micro(s)
    if micro is None:
        return None
    products = [(f, _product(f, micro)) for f in walk_stmts(s.body) if isinstance(f, For)]
    kinds = {p[0] for _, p in products if p is not None}
    if len(kinds) != 1:
        return None
    (kind,) = kinds
    if kind == "mma_tf32" and precision != "tf32":
        return None
    rows, cols = micro.rows.step * micro.rows.threads, micro.cols.step * micro.cols.threads
    warps = _warps(rows, cols, max(1, micro.rows.threads * micro.cols.threads // LANES))
    if warps is None:
        return None
    wy, wx = warps
    wm, wn = rows // wy, cols // wx
    taken = {v.name for st in walk_stmts(s.body) for v in stmt_nodes(st) if isinstance(v, IndexVar)}
    taken |= {st.var for st in walk_stmts(s.body) if isinstance(st, For)}
    names = (fresh_name("r", taken), fresh_name("c", taken), fresh_name("k", taken))
    rewritten = {id(f): _on_units(f, p, micro, (wm, wn), names) for f, p in products if p is not None}
    if any(r is None for r in rewritten.values()):
        return None
    body = _rewrite(s.body, rewritten, micro, (wm, wn))
    if body is None:
        return None
    ranges = (replace(micro.rows, step=wm, threads=wy, axis=2), replace(micro.cols, step=wn, threads=wx, axis=1))
    return Threads(ranges, (replace(micro.acc, shape=(wm, wn)),), body, LANES), (LANES, wx, wy)


def _micro(s: Threads) -> _Micro | None:
    """The rows and columns of a region whose registers are one float32 tile of two
    dimensions, read and written only at the point of loops over both (``acc(c3r, c4r)``
    in ``c3r`` of the rows' micro-tile and ``c4r`` of the columns')."""
    if len(s.ranges) != 2 or len(s.registers) != 1 or len(s.registers[0].shape) != 2 \
            or s.registers[0].dtype is not DType.FLOAT32:
        return None
    acc = s.registers[0]
    points = {e.indices for st in walk_stmts(s.body) for e in _register_uses(st, acc.name)}
    if len(points) != 1:
        return None
    (point,) = points
    if not all(isinstance(i, IndexVar) for i in point):
        return None
    r, c = (i.name for i in point if isinstance(i, IndexVar))
    by_var = {}
    for rng in s.ranges:
        users = {v for st in walk_stmts(s.body) for e in stmt_nodes(st) if isinstance(e, Read)
                 for i in e.indices if rng.var in index_names(i) for v in index_names(i) & {r, c}}
        if len(users) != 1:
            return None
        by_var[users.pop()] = rng
    if set(by_var) != {r, c} or by_var[r].step != acc.shape[0] or by_var[c].step != acc.shape[1]:
        return None
    return _Micro(by_var[r], by_var[c], acc, r, c)


def _register_uses(s: Stmt, name: str) -> list[Read]:
    """The reads and writes (as reads) of register array ``name`` in ``s`` itself."""
    uses = [e for e in stmt_nodes(s) if isinstance(e, Read) and e.tensor == name]
    if isinstance(s, Store) and s.buffer == name:
        uses.append(Read(name, s.indices, DType.FLOAT32))
    return uses


def _product(f: For, m: _Micro) -> tuple[str, Store] | None:
    """The kind of matrix-unit product and the statement of a nest ``for k { for r {
    for c { acc(r, c) = acc(r, c) + x * y }}}`` (``r`` and ``c`` in either order) with ``x``
    reading at ``r, k`` and ``y`` at ``k, c``; None for any other statement."""
    inner = f.body
    loops: list[For] = []
    while len(inner) == 1 and isinstance(inner[0], For) and len(loops) < 2:
        loops.append(inner[0])
        inner = inner[0].body
    if len(loops) != 2 or {lp.var for lp in loops} != {m.r, m.c} or len(inner) != 1 \
            or not isinstance(inner[0], Store):
        return None
    store = inner[0]
    acc = Read(m.acc.name, store.indices, DType.FLOAT32)
    v = store.value
    if store.buffer != m.acc.name or not isinstance(v, Binary) or v.op is not BinaryOp.ADD or v.lhs != acc \
            or not isinstance(v.rhs, Binary) or v.rhs.op is not BinaryOp.MUL:
        return None
    x, y = _widened(v.rhs.lhs), _widened(v.rhs.rhs)
    if m.c in index_names(x) or m.r in index_names(y):
        x, y = y, x
    if m.c in index_names(x) or m.r in index_names(y) or not ({m.r, f.var} >= index_names(x) & {m.r, m.c, f.var}) \
            or not isinstance(x, Read) or not isinstance(y, Read) or x.dtype is not y.dtype:
        return None
    kind = {DType.FLOAT32: "mma_tf32", DType.BFLOAT16: "mma_bf16", DType.FLOAT16: "mma_f16"}.get(x.dtype)
    if kind is None:
        return None
    return kind, replace(store, value=Binary(BinaryOp.ADD, acc, Binary(BinaryOp.MUL, x, y, DType.FLOAT32),
                                             DType.FLOAT32))


def _widened(e: Expr) -> Expr:
    """``e``, or the 16-bit float read a cast to float32 widens (``float(A(m, k))``): the
    products of such reads are the matrix units' (exact in float32, as the cast is)."""
    if isinstance(e, Cast) and e.dtype is DType.FLOAT32 and isinstance(e.operand, Read) \
            and e.operand.dtype in (DType.BFLOAT16, DType.FLOAT16):
        return e.operand
    return e


def _warps(rows: int, cols: int, count: int) -> tuple[int, int] | None:
    """Warps along the rows and the columns: ``count`` of them (or fewer, halving) whose
    tiles are multiples of m16n8 within the register budget, the squarest."""
    while count >= 1:
        shapes = [(wy, count // wy) for wy in range(1, count + 1) if count % wy == 0
                  and rows % (wy * TILE_M) == 0 and cols % (count // wy * TILE_N) == 0
                  and rows // wy * cols // (count // wy) // LANES <= MAX_REGISTERS]
        if shapes:
            return min(shapes, key=lambda w: abs(math.log2(rows / w[0]) - math.log2(cols / w[1])))
        count //= 2
    return None


def _on_units(f: For, product: tuple[str, Store], m: _Micro, tile: tuple[int, int],
              names: tuple[str, str, str]) -> tuple[Stmt, ...] | None:
    """The nest ``f`` as a tile product (an ``If`` on the depth where it is not constant:
    the product where the tile is whole, else register loops)."""
    kind, store = product
    if not (isinstance(f.lo, Literal) and f.lo.value == 0 and f.step == 1):
        return None
    depth = max_trips(f.lo, f.hi)
    if depth is None or depth % MMA_DEPTH[kind]:
        return None
    wm, wn = tile
    r, c, k = names
    x, y = _operands(kind, store)
    at: dict[str, Expr] = {m.r: IndexVar(r), m.c: IndexVar(c), f.var: IndexVar(k)}
    point = Store(store.buffer, (at[m.r], at[m.c]), _substituted(
        Binary(BinaryOp.ADD, Read(m.acc.name, (at[m.r], at[m.c]), DType.FLOAT32),
               Binary(BinaryOp.MUL, x, y, DType.FLOAT32), DType.FLOAT32), at))
    nest: Stmt = point
    for var, size in ((k, depth), (c, wn), (r, wm)):
        nest = For(var, _int(0), _int(size), (nest,))
    zero: dict[str, Expr] = {m.r: _int(0), m.c: _int(0), f.var: _int(0)}
    a, b = (map_expr(_substituted(e, zero), lambda n: replace(n, indices=tuple(map(normal_form, n.indices)))
                     if isinstance(n, Read) else n) for e in (store.value.rhs.lhs, store.value.rhs.rhs))  # type: ignore[attr-defined]
    tile_product = TileProduct(kind, (wm, wn, depth), Read(m.acc.name, (_int(0), _int(0)), DType.FLOAT32),
                               a, b, (wn, 0, 0), (nest,))  # type: ignore[arg-type]
    if isinstance(f.hi, Literal):
        return (tile_product,)
    # the partial tile: the same products, point by point, each in the reduction's order
    rounded = Store(store.buffer, store.indices, Binary(BinaryOp.ADD, store.value.lhs,  # type: ignore[attr-defined]
                                                       Binary(BinaryOp.MUL, x, y, DType.FLOAT32), DType.FLOAT32))
    loops = For(m.r, _int(0), _int(wm), (For(m.c, _int(0), _int(wn), (replace(f, body=(rounded,), unroll=1),)),))
    whole = Binary(BinaryOp.EQ, f.hi, _int(depth), DType.BOOL)
    return (If(whole, (tile_product,), (loops,)),)


def _operands(kind: str, store: Store) -> tuple[Expr, Expr]:
    """The product's operands, each rounded to TF32 first on TF32."""
    x, y = store.value.rhs.lhs, store.value.rhs.rhs  # type: ignore[attr-defined]
    if kind == "mma_tf32":
        return Call("tf32", (x,), DType.FLOAT32), Call("tf32", (y,), DType.FLOAT32)
    return x, y


def _substituted(e: Expr, at: dict[str, Expr]) -> Expr:
    return map_expr(e, lambda n: at.get(n.name, n) if isinstance(n, IndexVar) else n)


def _rewrite(body: tuple[Stmt, ...], products: dict[int, tuple[Stmt, ...] | None], m: _Micro,
             tile: tuple[int, int]) -> tuple[Stmt, ...] | None:
    """``body`` with the product nests replaced and the register loops over the warp's
    tile; None if registers are touched outside register loops or products."""
    out: list[Stmt] = []
    for s in body:
        product = products.get(id(s))
        if product is not None:
            out += product
        elif isinstance(s, For) and register_loops(s, m.acc) is not None:
            inner = s.body[0]
            extents = {m.r: tile[0], m.c: tile[1]}
            out.append(replace(s, hi=_int(extents[s.var]), unroll=1, body=(
                replace(inner, hi=_int(extents[inner.var]), unroll=1),)))  # type: ignore[type-var, attr-defined]
        elif _register_uses(s, m.acc.name) or isinstance(s, For) and s.var in (m.r, m.c):
            return None
        else:
            parts = [_rewrite(part, products, m, tile) for part in stmt_bodies(s)]
            if any(part is None for part in parts):
                return None
            out.append(_with_bodies(s, parts) if parts else s)  # type: ignore[arg-type]
    return tuple(out)


def _with_bodies(s: Stmt, parts: list[tuple[Stmt, ...]]) -> Stmt:
    """``s`` with the statement lists :func:`stmt_bodies` gives replaced by ``parts``."""
    if isinstance(s, If):
        return replace(s, then=parts[0], other=parts[1])
    return replace(s, body=parts[0])  # type: ignore[type-var]


def _int(v: int) -> Literal:
    return Literal(v, DType.INT64)
