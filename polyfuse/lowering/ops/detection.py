"""RoiAlign: bilinear samples of a feature map averaged (or maxed) over the bins of
regions of interest that a tensor gives at run time.

Sampling is separable: along y (and x) a bin ``p`` of ROI ``r`` takes ``g(r)`` samples
``i``, each reading two neighbours ``t`` with weights. Per axis the definition fills
tables over ``(r, p, i, t)`` (index ``I``, weight ``W``) and one statement combines
them. Coordinates are computed in the ROIs' type with the operations, in the order,
of the ONNX reference, so the integer decisions (which neighbours) match it. With
``sampling_ratio`` 0 the sample count depends on each ROI's size: the loops run to a
bound (exact when the ROIs are constants, else from the feature map's size) and a ROI
needing more samples than the bound reads the count table out of bounds, which stops
the kernel with a BoundsError rather than giving a wrong answer.
"""

from __future__ import annotations

import math

import numpy as np

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import OpContext, TCKernel, literal, register, tensor_param
from polyfuse.lowering.ops.movement import definition, parameter, statement


def _axis(name: str, cols: tuple[int, int], size: int, bins: int, grid: int, ct: DType,
          scale: float, half_pixel: bool, ratio: int, rois: int) -> tuple[list[str], list[str]]:
    """(declarations, statements) of the count ``G{name}(r)`` and the tables
    ``I{name}``, ``W{name}`` over ``(r, p, i, t)`` of one spatial axis."""
    def c(v: float) -> str:
        return literal(v, ct)
    start, end = (f"{ct}(B(r, {k})) * {c(scale)} - {c(0.5 if half_pixel else 0.0)}" for k in cols)
    extent = f"e = {end} - s" if half_pixel else f"e = max({end} - s, {c(1.0)})"
    lets = [f"s = {start}", extent, f"w = e / {c(bins)}"]
    count = str(ratio) if ratio > 0 else f"K{name}(max(int64(ceil(w)), 0))"
    decls = [tensor_param(f"G{name}", (DType.INT64, [rois]))]
    lines = [statement(f"G{name}", ["r"], count, [rois], lets)]
    if ratio == 0:  # the count read from a table of the counts the loops allow
        decls.append(tensor_param(f"K{name}", (DType.INT64, [grid + 1])))
        lines.insert(0, statement(f"K{name}", ["g"], "g", [grid + 1]))
    lets += [f"v = s + {ct}(p) * w + ({ct}(i) + {c(0.5)}) * w / {ct}(G{name}(r))",
             f"inside = v >= {c(-1.0)} && v <= {c(size)} && i < G{name}(r)",
             f"y = max(v, {c(0.0)})", "lo = int64(y)", f"edge = lo >= {size - 1}",
             f"l = edge ? {c(0.0)} : y - {ct}(lo)"]
    extents = [rois, bins, grid, 2]
    index = f"edge ? {size - 1} : lo + t"
    weight = f"inside ? (t == 0 ? {c(1.0)} - l : l) : {c(0.0)}"
    decls += [tensor_param(f"I{name}", (DType.INT64, extents)),
              tensor_param(f"W{name}", (ct, extents))]
    idx = ["r", "p", "i", "t"]
    lines += [statement(f"I{name}", idx, index, extents, lets),
              statement(f"W{name}", idx, weight, extents, lets)]
    return decls, lines


def _grid(ctx: OpContext, ratio: int, half_pixel: bool, scale: float,
          out: tuple[int, int], size: tuple[int, int]) -> tuple[int, int]:
    """The most samples per bin along y and x that any ROI takes."""
    if ratio > 0:
        return ratio, ratio
    rois = ctx.values[1]
    if rois is None:  # a ROI inside the feature map (and a pixel around it) fits
        return tuple(math.ceil((s + 1) / o) for s, o in zip(size, out))  # type: ignore
    rois = rois.astype(np.float32) * np.float32(scale) - np.float32(0.5 if half_pixel else 0)
    extent = rois[:, 2:] - rois[:, :2]
    if not half_pixel:
        extent = np.maximum(extent, 1)
    counts = np.ceil(extent / np.array([out[1], out[0]], np.float32))
    return tuple(max(int(counts[:, k].max(initial=0)), 1) for k in (1, 0))  # type: ignore


@register("RoiAlign")
def _roi_align(ctx: OpContext) -> TCKernel:
    ctx.rank(0, 4)
    ctx.rank(1, 2)
    ctx.rank(2, 1)
    n, channels, height, width = ctx.shape(0)
    rois = ctx.shape(1)[0]
    if ctx.shape(1)[1] != 4 or ctx.shape(2)[0] != rois:
        raise ctx.malformed(f"rois of shape {ctx.shape(1)} and batch_indices of shape "
                            f"{ctx.shape(2)}: they must be (R, 4) and (R,)")
    mode = str(ctx.attr("mode", "avg"))
    transform = str(ctx.attr("coordinate_transformation_mode",
                             "half_pixel" if ctx.opset >= 16 else "output_half_pixel"))
    if mode not in ("avg", "max") or transform not in ("half_pixel", "output_half_pixel"):
        raise ctx.malformed(f"mode '{mode}' and coordinate_transformation_mode '{transform}': "
                            "the modes are avg and max, the transforms half_pixel and "
                            "output_half_pixel")
    out = (int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1)))
    ratio = int(ctx.attr("sampling_ratio", 0))
    scale = float(ctx.attr("spatial_scale", 1.0))
    if min(out) < 1 or ratio < 0:
        raise ctx.malformed(f"output size {out} must be >= 1 and sampling_ratio {ratio} >= 0")
    dt = ctx.dtype(0)
    if not dt.is_float:
        raise ctx.unsupported(f"a {dt} feature map; polyfuse pools floating-point ones")
    ct = DType.FLOAT64 if ctx.dtype(1) is DType.FLOAT64 else DType.FLOAT32
    half = transform == "half_pixel"
    grid = _grid(ctx, ratio, half, scale, out, (height, width))
    decls, lines = [], []
    for name, cols, size, bins, g in (("y", (1, 3), height, out[0], grid[0]),
                                      ("x", (0, 2), width, out[1], grid[1])):
        d, st = _axis(name, cols, size, bins, g, ct, scale, half, ratio, rois)
        decls += d
        lines += st
    y = ["r", "c", "ph", "pw"]
    shape = [rois, channels, *out]
    read = "X(N(r), c, Iy(r, ph, iy, ty), Ix(r, pw, ix, tx))"
    weight = "Wy(r, ph, iy, ty) * Wx(r, pw, ix, tx)"
    taps = [f"iy in 0:{grid[0]}", f"ix in 0:{grid[1]}", "ty in 0:2", "tx in 0:2"]
    acc = dt if dt in (DType.FLOAT32, DType.FLOAT64) else DType.FLOAT32
    decls.append(tensor_param("A", (acc, shape)))
    if mode == "avg":
        lines += [statement("A", y, f"{acc}({read}) * {acc}({weight})", shape, taps, "+=!"),
                  statement("Y", y, f"{dt}(A(r, c, ph, pw) / {acc}(max(Gy(r) * Gx(r), 1)))",
                            shape)]
    else:  # samples past the ROI's count take no part; an empty ROI gives 0
        value = f"iy < Gy(r) && ix < Gx(r) ? {acc}({weight}) * {acc}({read}) : " \
                f"{literal(float('-inf'), acc)}"
        lines += [statement("A", y, value, shape, taps, "max=!"),
                  statement("Y", y, f"Gy(r) * Gx(r) == 0 ? {literal(0, dt)} : {dt}(A(r, c, ph, pw))",
                            shape)]
    params = [parameter(ctx, 0, "X"), parameter(ctx, 1, "B"), parameter(ctx, 2, "N")]
    return TCKernel(definition(params, [tensor_param("Y", (dt, shape))] + decls, lines),
                    (0, 1, 2))
