"""The kernels of a convolution by Winograd's minimal filtering F(m x m, 3x3), which
the layout pass splits in three (:mod:`polyfuse.lowering.winograd`), for a tile of
m x m outputs and a = m + 2 inputs along each axis:

* ``WinogradInput(X)``: ``V(x, y, p, c) = (Bᵀ d_p B)(x, y)`` for input tile ``d_p``
  (``p`` numbers batch, tile row and tile column) of the channels-last input
  ``X(n, h, w, c)``, with the padding read as zeros where a tile reaches it (no padded
  copy);
* ``MatMul(V, U)``: ``S(x, y, p, m) = sum_c V(x, y, p, c) U(x, y, c, m)``, the planner's
  matrix product with prepacked constant weights;
* ``WinogradOutput(S[, B])``: ``Y(n, h, w, m) = (Aᵀ S_p A)(h % m, w % m) + B(m)``,
  channels-last, which the convolution's epilogue (activation, residual add) joins.

Each transform is sums of products by the matrices' entries with the channel innermost
(vectorized). The input's is separable: ``Bᵀ d`` along rows, then ``· B`` along columns,
a terms per element each. The output's is one statement of a² terms per output: its
separable form would read the row transform at ``(h / m, h % m)``, a dependence isl takes
seconds to schedule. Attributes: ``tile`` (m), ``tiles`` (tiles along each axis), ``pads`` (the
padding before each axis) on the input and ``sizes`` (the output's height and width) on
the output.
"""

from __future__ import annotations

import numpy as np

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import OpContext, TCKernel, literal, register, tensor_param
from polyfuse.lowering.ops.conv import where
from polyfuse.lowering.winograd import TRANSFORMS


def _tiling(ctx: OpContext, matrix: int) -> tuple[int, int, int, np.ndarray]:
    """The tile (outputs along each axis), the tiles along each axis and transform
    ``matrix`` of the node (0: Bᵀ, 2: Aᵀ)."""
    tile = ctx.ints(ctx.attr("tile"), "tile", 1)[0]
    if tile not in TRANSFORMS:
        raise ctx.unsupported(f"tile {tile}: polyfuse has Winograd transforms for tiles of "
                              f"{' and '.join(map(str, sorted(TRANSFORMS)))}")
    t0, t1 = ctx.ints(ctx.attr("tiles"), "tiles", 2, least=1)
    return tile, t0, t1, TRANSFORMS[tile][matrix]


def _sum(terms: list[str]) -> str:
    return " + ".join(terms)


@register("WinogradInput", internal=True)
def _winograd_input(ctx: OpContext) -> TCKernel:
    n, h, w, c = ctx.shape(0)
    tile, t0, t1, bt = _tiling(ctx, 0)
    p0, p1 = ctx.ints(ctx.attr("pads"), "pads", 2)
    tiles = n * t0 * t1
    zero = literal(0, ctx.dtype(0))

    def element(i: int) -> str:   # input row i of tile p, column j
        row, col = f"{tile} * ((p / {t1}) % {t0}) + {i - p0}", f"{tile} * (p % {t1}) + j - {p1}"
        inside = f"{row} >= 0 && {row} < {h} && {col} >= 0 && {col} < {w}"
        return f"(({inside}) ? X(p / {t0 * t1}, {row}, {col}, c) : {zero})"
    rows = _sum([f"BT(x, {i}) * {element(i)}" for i in range(tile + 2)])
    cols = _sum([f"V1(p, x, {j}, c) * BT(y, {j})" for j in range(tile + 2)])
    return TCKernel(
        f"def winograd_input({tensor_param('X', ctx.types[0])}, "  # type: ignore[arg-type]
        f"{tensor_param('BT', (DType.FLOAT32, bt.shape))}) -> (V, V1) {{\n"
        f"  V1(p, x, j, c) = {rows}{where([('p', tiles), ('x', tile + 2), ('j', tile + 2), ('c', c)])}\n"
        f"  V(x, y, p, c) = {cols}{where([('x', tile + 2), ('y', tile + 2), ('p', tiles), ('c', c)])}\n}}\n",
        (0,), constants=(bt,))


@register("WinogradOutput", internal=True)
def _winograd_output(ctx: OpContext) -> TCKernel:
    _, _, tiles, m = ctx.shape(0)
    tile, t0, t1, at = _tiling(ctx, 2)
    oh, ow = ctx.ints(ctx.attr("sizes"), "sizes", 2)
    n = tiles // (t0 * t1)
    params = [tensor_param("S", ctx.types[0])]  # type: ignore[arg-type]
    bias, inputs = "", (0,)
    if ctx.has(1):
        params.append(tensor_param("B", ctx.types[1]))  # type: ignore[arg-type]
        bias, inputs = " + B(m)", (0, 1)
    params.append(tensor_param("AT", (DType.FLOAT32, at.shape)))
    out = [("n", n), ("o0", oh), ("o1", ow), ("m", m)]
    which = f"(n * {t0} + o0 / {tile}) * {t1} + o1 / {tile}"   # the tile of output (o0, o1)
    # one statement (tile + 2)² terms long: a second pass over a row transform would read
    # it at (o0 / tile, o0 % tile), a dependence isl schedules slowly (seconds)
    terms = _sum([f"AT(o0 % {tile}, {x}) * AT(o1 % {tile}, {y}) * S({x}, {y}, {which}, m)"
                  for x in range(tile + 2) for y in range(tile + 2)])
    return TCKernel(
        f"def winograd_output({', '.join(params)}) -> (Y) {{\n"
        f"  Y(n, o0, o1, m) = {terms}{bias}{where(out)}\n}}\n",
        inputs, constants=(at,))
