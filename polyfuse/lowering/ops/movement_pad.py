"""Pad in its four modes. Every output index ``o`` reads source index ``s = o - begin``:
constant mode selects the pad value outside the input, the others fold ``s`` back
into range (edge: clamp; wrap: ``s mod n``; reflect: ``s mod 2(n-1)`` mirrored)."""

from __future__ import annotations

from polyfuse.lowering.ops import INDEX, OpContext, TCKernel, access, literal, register, tensor_param
from polyfuse.lowering.ops.movement import definition, parameter, offset, statement


def _pads(ctx: OpContext, rank: int) -> list[tuple[int, int]]:
    """(begin, end) per dimension; negative values crop."""
    if ctx.opset < 11:
        pads = ctx.ints(ctx.attr("pads"), "pads")
        axes = list(range(rank))
    else:
        pads = ctx.ints(ctx.const(1, "pads"), "pads")
        axes = ctx.axes(ctx.const(3, "axes"), rank) if ctx.has(3) else list(range(rank))
    if len(pads) != 2 * len(axes):
        raise ctx.malformed(f"{len(pads)} pads for {len(axes)} axes; give a begin and an end "
                            "pad for each padded axis")
    out = [(0, 0)] * rank
    for k, a in enumerate(axes):
        out[a] = (pads[k], pads[k + len(axes)])
    return out


def _folded(mode: str, index: str, begin: int, size: int, let: str) -> tuple[str, list[str]]:
    """The source index of ``index`` in ``mode`` (before the crop shift), and the lets
    it needs."""
    s = offset(index, -begin)
    if mode == "edge":
        return f"min(max({s}, 0), {size - 1})", []
    if mode == "wrap":
        return f"floormod({s}, {size})", []  # s may be negative: the divisor's sign
    if size == 1:  # reflect
        return "0", []
    period = 2 * (size - 1)
    return f"({let} < {size} ? {let} : {period} - {let})", [f"{let} = floormod({s}, {period})"]


@register("Pad")
def _pad(ctx: OpContext) -> TCKernel:
    shape = ctx.shape(0)
    rank = len(shape)
    dt = ctx.dtype(0)
    mode = str(ctx.attr("mode", "constant"))
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise ctx.unsupported(f"unknown mode '{mode}'")
    pads = _pads(ctx, rank)
    out = [d + b + e for d, (b, e) in zip(shape, pads)]
    if any(d < 0 for d in out):
        raise ctx.unsupported(f"pads {pads} crop more than shape {shape} holds")
    params = [parameter(ctx, 0, "X")]
    inputs: tuple[int, ...] = (0,)
    src, lets, inside = list(INDEX[:rank]), [], []
    for k, (d, (b, e)) in enumerate(zip(shape, pads)):
        i = INDEX[k]
        if b == 0 and e == 0:
            continue
        # negative pads crop first; the other modes then fold into what is left
        # (as onnxruntime does: wrap repeats the cropped dimension)
        crop, size, b = max(-b, 0), d - max(-b, 0) - max(-e, 0), max(b, 0)
        if mode == "constant" or size <= 0:
            src[k] = offset(i, crop - b)
            inside += [f"{i} >= {b}"] if b > 0 else []
            inside += [f"{i} < {b + size}"] if e > 0 else []
        else:
            folded, extra = _folded(mode, i, b, size, f"t{k}")
            src[k] = folded if crop == 0 else f"{folded} + {crop}"
            lets += extra
    rhs = access("X", src)
    if inside:
        if ctx.opset < 11:
            value = literal(float(ctx.attr("value", 0.0)), dt)
        elif ctx.has(2) and ctx.values[2] is not None:
            value = literal(ctx.values[2].reshape(-1)[0].item(), dt)  # type: ignore[union-attr]
        elif ctx.has(2):  # the pad value arrives at run time
            params.append(parameter(ctx, 2, "V"))
            inputs = (0, 2)
            value = access("V", ["0"] * len(ctx.shape(2)))
        else:
            value = literal(0, dt)
        rhs = f"{' && '.join(inside)} ? {rhs} : {value}"
    st = statement("Y", INDEX[:rank], rhs, out, lets)
    return TCKernel(definition(params, [tensor_param("Y", (dt, out))], [st]), inputs)


@register("CenterCropPad")
def _center_crop_pad(ctx: OpContext) -> TCKernel:
    """Each named axis cropped or zero-padded to its target size around the centre (the
    odd element cut or added at the end)."""
    shape = ctx.shape(0)
    rank = len(shape)
    given = ctx.attr("axes")
    axes = list(range(rank)) if given is None else ctx.axes(given, rank)
    sizes = ctx.ints(ctx.const(1, "shape"), "shape", len(axes), least=0)
    out, src, inside = list(shape), list(INDEX[:rank]), []
    for a, n in zip(axes, sizes):
        d, i = shape[a], INDEX[a]
        out[a] = n
        if n < d:
            src[a] = offset(i, (d - n) // 2)
        elif n > d:
            begin = (n - d) // 2
            src[a] = offset(i, -begin)
            inside += [f"{i} >= {begin}", f"{i} < {begin + d}"]
    rhs = access("X", src)
    if inside:
        rhs = f"{' && '.join(inside)} ? {rhs} : {literal(0, ctx.dtype(0))}"
    st = statement("Y", INDEX[:rank], rhs, out)
    return TCKernel(definition([parameter(ctx, 0, "X")], [tensor_param("Y", (ctx.dtype(0), out))],
                               [st]), (0,))
