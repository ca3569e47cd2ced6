"""TopK as a counting sort, in three statements.

Sorting is not a comprehension, but ranking is: the rank of element ``j`` along the
axis is the number of elements that come before it (larger, or equal with a smaller
index, for ``largest``). The ``r``-th output is then the element whose rank is ``r``,
found by a sum that only one ``j`` contributes to. Ties keep the lower index first,
as ONNX requires; the work is quadratic in the length of the axis.
"""

from __future__ import annotations

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import INDEX, OpContext, TCKernel, access, register, tensor_param
from polyfuse.lowering.ops.movement import definition, parameter


@register("TopK")
def _top_k(ctx: OpContext) -> TCKernel:
    shape = ctx.shape(0)
    rank = len(shape)
    axis = ctx.axis(ctx.attr("axis", -1), rank)
    k = ctx.ints(ctx.const(1, "k") if ctx.has(1) else ctx.attr("k"), "k", 1)[0]
    if not 0 <= k <= shape[axis]:
        raise ctx.unsupported(f"k = {k} is outside 0..{shape[axis]} (dimension {axis} of {shape})")
    before = ">" if ctx.flag("largest", 1) else "<"

    def at(i: str) -> list[str]:
        idx = list(INDEX[:rank])
        idx[axis] = i
        return idx
    xj, xk = access("X", at("j")), access("X", at("kk"))
    out = list(shape)
    out[axis] = k
    dt = ctx.dtype(0)
    lines = [
        f"{access('R', at('j'))} +=! ({xk} {before} {xj} || ({xk} == {xj} && kk < j)) ? 1 : 0",
        f"{access('I', at('r'))} +=! {access('R', at('j'))} == r ? int64(j) : int64(0) "
        f"where r in 0:{k}",
        f"{access('V', at('r'))} = {access('X', at(access('I', at('r'))))}",
    ]
    outputs = [tensor_param("V", (dt, out)), tensor_param("I", (DType.INT64, out)),
               tensor_param("R", (DType.INT32, shape))]
    return TCKernel(definition([parameter(ctx, 0, "X")], outputs, lines),
                    (0,), (0, 1))
