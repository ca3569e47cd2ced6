"""DeformConv (2-D): a convolution whose every kernel tap reads the input at its
window position moved by an offset the model computes, sampled bilinearly (zero
outside the image) and scaled by an optional mask.

Per axis the definition fills tables over ``(n, g, ki, kj, i, j, t)`` (offset group
``g``, kernel tap ``ki, kj``, output position ``i, j``, neighbour ``t``): index ``I``
and weight ``W`` (zero for a neighbour outside the image). One statement samples each
input channel at each tap, one more contracts the samples with the weights.
"""

from __future__ import annotations

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import OpContext, TCKernel, register, tensor_param
from polyfuse.lowering.ops.movement import definition, parameter, statement

F64 = DType.FLOAT64


@register("DeformConv")
def _deform_conv(ctx: OpContext) -> TCKernel:
    ctx.rank(0, 4)
    ctx.rank(1, 4)
    ctx.rank(2, 4)
    n, channels, height, width = ctx.shape(0)
    outs, per_group, kh, kw = ctx.shape(1)
    group = int(ctx.attr("group", 1))
    offsets = int(ctx.attr("offset_group", 1))
    kernel = ctx.ints(ctx.attr("kernel_shape", [kh, kw]), "kernel_shape", 2)
    strides = ctx.ints(ctx.attr("strides", [1, 1]), "strides", 2, least=1)
    dilations = ctx.ints(ctx.attr("dilations", [1, 1]), "dilations", 2, least=1)
    pads = ctx.ints(ctx.attr("pads", [0, 0, 0, 0]), "pads", 4, least=0)
    oh, ow = ctx.shape(2)[2:]
    sizes = (height, width)
    want = [1 + (s + pads[d] + pads[d + 2] - (k - 1) * dl - 1) // st
            for d, (s, k, st, dl) in enumerate(zip(sizes, kernel, strides, dilations))]
    if group < 1 or offsets < 1 or channels != per_group * group or outs % group or \
            channels % offsets or kernel != [kh, kw] or ctx.shape(2) != (n, offsets * kh * kw * 2, *want):
        raise ctx.malformed(f"input {ctx.shape(0)}, weights {ctx.shape(1)}, offset "
                            f"{ctx.shape(2)}, group {group}, offset_group {offsets}: the offset "
                            f"must be (N, offset_group * {kh * kw} * 2, {want[0]}, {want[1]})")
    mask = ctx.has(4) and len(ctx.shape(4)) == 4
    if mask and ctx.shape(4) != (n, offsets * kh * kw, oh, ow):
        raise ctx.malformed(f"mask of shape {ctx.shape(4)} must be (N, {offsets * kh * kw}, {oh}, {ow})")
    dt = ctx.dtype(0)
    if not dt.is_float:
        raise ctx.unsupported(f"a {dt} input; polyfuse deforms floating-point ones")
    idx = ["b", "g", "ki", "kj", "i", "j"]
    extents = [n, offsets, kh, kw, oh, ow, 2]
    tap = f"((g * {kh} + ki) * {kw} + kj)"
    decls, lines = [], []
    for d, (name, pos) in enumerate((("h", "i"), ("w", "j"))):
        k = ("ki", "kj")[d]
        lets = [f"v = float64({pos} * {strides[d]} + {k} * {dilations[d]} - {pads[d]}) + "
                f"float64(O(b, {tap} * 2 + {d}, i, j))",
                "f = floor(v)", "s = int64(f) + t",
                f"inside = s >= 0 && s < {sizes[d]}"]
        weight = "inside ? (t == 0 ? 1.0 - (v - f) : v - f) : 0.0"
        decls += [tensor_param(f"I{name}", (DType.INT64, extents)),
                  tensor_param(f"W{name}", (F64, extents))]
        lines += [statement(f"I{name}", idx + ["t"], f"min(max(s, 0), {sizes[d] - 1})", extents, lets),
                  statement(f"W{name}", idx + ["t"], weight, extents, lets)]
    cpo = channels // offsets
    sample = [n, channels, kh, kw, oh, ow]
    at = ["b", "g", "ki", "kj", "i", "j"]
    gsub = [f"c / {cpo}" if a == "g" else a for a in at]
    read = (f"float64(X(b, c, Ih({', '.join(gsub)}, th), Iw({', '.join(gsub)}, tw))) * "
            f"Wh({', '.join(gsub)}, th) * Ww({', '.join(gsub)}, tw)")
    if mask:
        read += f" * float64(M(b, (c / {cpo} * {kh} + ki) * {kw} + kj, i, j))"
    lines.append(statement("S", ["b", "c", "ki", "kj", "i", "j"], read, sample,
                           ["th in 0:2", "tw in 0:2"], "+=!"))
    opg = outs // group
    total = f"float64(F(o, c, ki, kj)) * S(b, o / {opg} * {per_group} + c, ki, kj, i, j)"
    lines.append(statement("A", ["b", "o", "i", "j"], total, [n, outs, oh, ow],
                           [f"c in 0:{per_group}", f"ki in 0:{kh}", f"kj in 0:{kw}"], "+=!"))
    bias = ctx.has(3) and len(ctx.shape(3)) == 1
    value = "A(b, o, i, j)" + (" + float64(Bias(o))" if bias else "")
    lines.append(statement("Y", ["b", "o", "i", "j"], f"{dt}({value})", [n, outs, oh, ow]))
    decls += [tensor_param("S", (F64, sample)), tensor_param("A", (F64, [n, outs, oh, ow]))]
    params = [parameter(ctx, 0, "X"), parameter(ctx, 1, "F"), parameter(ctx, 2, "O")]
    inputs = [0, 1, 2]
    if bias:
        params.append(parameter(ctx, 3, "Bias"))
        inputs.append(3)
    if mask:
        params.append(parameter(ctx, 4, "M"))
        inputs.append(4)
    return TCKernel(definition(params, [tensor_param("Y", (dt, [n, outs, oh, ow]))] + decls, lines),
                    tuple(inputs))
