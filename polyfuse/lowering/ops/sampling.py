"""GridSample and AffineGrid: sampling an image at coordinates a tensor gives at run
time, and the affine grids of such coordinates.

GridSample is separable like Resize: along each spatial dimension a sampled point has
a source coordinate ``x`` (read from the grid, denormalized, folded into range by the
padding mode) and reads ``n`` neighbours (1 nearest, 2 linear, 4 cubic) with weights.
Per dimension the definition fills tables over the grid points (index ``Ik``, weight
``Wk``) and one statement sums the weighted neighbours. Coordinates are float32 (float64
for a float64 grid) with the operations, in the order, of the ONNX reference, so the
integer decisions (which neighbour, reflections, rounding ties) match it. Indices are
clamped into the image before they are read; out-of-range neighbours of ``zeros``
padding get weight 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import (INDEX, OpContext, TCKernel, access, literal, register,
                                   tensor_param)
from polyfuse.lowering.ops.movement import definition, parameter, statement

_MODES = {"linear": "linear", "bilinear": "linear", "cubic": "cubic", "bicubic": "cubic",
          "nearest": "nearest"}
_TAPS = {"nearest": 1, "linear": 2, "cubic": 4}
_A = -0.75  # the cubic convolution coefficient of the reference


@dataclass(frozen=True)
class _Options:
    mode: str
    padding: str
    align: bool
    ct: DType       # the type coordinates are computed in


def _reflect(v: str, lo: float, hi: float, ct: DType, k: str) -> tuple[str, list[str]]:
    """``v`` reflected at the borders until inside ``[lo, hi]`` (the reference's rule),
    and the lets it needs."""
    lo_, hi_, span = (literal(b, ct) for b in (lo, hi, hi - lo))
    lets = [f"dx{k} = {v} < {lo_} ? {lo_} - {v} : {v} - {hi_}",
            f"f{k} = trunc(dx{k} / {span})", f"r{k} = dx{k} - f{k} * {span}",
            f"e{k} = fmod(f{k}, {literal(2, ct)}) == {literal(0, ct)}"]
    inside = f"{v} < {lo_} ? (e{k} ? {lo_} + r{k} : {hi_} - r{k}) : " \
             f"{v} > {hi_} ? (e{k} ? {hi_} - r{k} : {lo_} + r{k}) : {v}"
    return inside, lets


def _coordinate(opts: _Options, size: int, grid: str, k: int) -> list[str]:
    """Lets ending in ``x{k}``: the source coordinate of a grid value along a dimension of
    ``size``, rounded (nearest) and folded in by the padding mode."""
    ct = opts.ct
    one, two = literal(1, ct), literal(2, ct)
    g = f"{ct}({grid})"
    x = f"({g} + {one}) / {two} * {literal(size - 1, ct)}" if opts.align else \
        f"(({g} + {one}) * {literal(size, ct)} - {one}) / {two}"
    lets = [f"u{k} = {f'rint({x})' if opts.mode == 'nearest' else x}"]
    lo, hi = (0.0, size - 1.0) if opts.align else (-0.5, size - 0.5)
    if opts.padding == "border":
        clamp = f"min(max(u{k}, {literal(0, ct)}), {literal(size - 1, ct)})"
        lets.append(f"x{k} = u{k} < {literal(lo, ct)} || u{k} > {literal(hi, ct)} ? {clamp} : u{k}")
    elif opts.padding == "reflection":
        folded, extra = _reflect(f"u{k}", lo, hi, ct, str(k))
        lets += extra + [f"x{k} = {folded}"]
    else:
        lets.append(f"x{k} = u{k}")
    return lets


def _tap(opts: _Options, size: int, i: str, k: int) -> tuple[str, str, list[str]]:
    """(the index read for neighbour index ``i``, the condition it is inside the image,
    the lets they need)."""
    lets = []
    if opts.padding == "reflection":
        lo, hi = (0.0, size - 1.0) if opts.align else (-0.5, size - 0.5)
        folded, lets = _reflect(f"n{k}", lo, hi, opts.ct, f"n{k}")
        lets = [f"n{k} = {opts.ct}({i})"] + lets
        i = f"int64({folded})"
    return f"min(max({i}, 0), {size - 1})", f"{i} >= 0 && {i} < {size}", lets


def _weights(mode: str, t: str, r: str, ct: DType) -> str:
    """The weight of neighbour ``t`` at fraction ``r`` (the reference's coefficients)."""
    if mode == "linear":
        return f"{t} == 0 ? {literal(1, ct)} - {r} : {r}"
    a = literal(_A, ct)
    far = f"(({a} * {{0}} - {literal(5 * _A, ct)}) * {{0}} + {literal(8 * _A, ct)}) * {{0}} - " \
          f"{literal(4 * _A, ct)}"
    one, two = literal(1, ct), literal(2, ct)
    near = f"({literal(_A + 2, ct)} * {{0}} - {literal(_A + 3, ct)}) * {{0}} * {{0}} + {one}"
    return (f"{t} == 0 ? {far.format(f'({r} + {one})')} : {t} == 1 ? {near.format(r)} : "
            f"{t} == 2 ? {near.format(f'({one} - {r})')} : {far.format(f'({two} - {r})')}")


def _tables(opts: _Options, size: int, k: int, dims: int, points: list[int],
            idx: list[str]) -> tuple[list[str], list[str]]:
    """(declarations, statements) of the index and weight tables of spatial dimension
    ``k``, over the grid points ``idx`` (of extents ``points``)."""
    grid = access("G", idx + [str(dims - 1 - k)])   # the grid lists x (the last axis) first
    # the coordinate is a table of its own: substituted into each tap's folding, its
    # expression would grow past what a statement may hold
    decls = [tensor_param(f"P{k}", (opts.ct, points))]
    lines = [statement(f"P{k}", idx, f"x{k}", points, _coordinate(opts, size, grid, k))]
    x = access(f"P{k}", idx)
    if opts.mode == "nearest":
        read, inside, lets = _tap(opts, size, f"int64({x})", k)
        decls.append(tensor_param(f"I{k}", (DType.INT64, points)))
        lines.append(statement(f"I{k}", idx, read, points, lets))
        if opts.padding == "zeros":
            decls.append(tensor_param(f"V{k}", (DType.BOOL, points)))
            lines.append(statement(f"V{k}", idx, inside, points, lets))
        return decls, lines
    n = _TAPS[opts.mode]
    lets = [f"b{k} = floor({x})", f"s{k} = int64(b{k}) + t - {n // 2 - 1}"]
    read, inside, extra = _tap(opts, size, f"s{k}", k)
    lets += extra
    weight = _weights(opts.mode, "t", f"abs({x} - b{k})", opts.ct)
    if opts.padding == "zeros":
        weight = f"{inside} ? {weight} : {literal(0, opts.ct)}"
    extents = points + [n]
    decls += [tensor_param(f"I{k}", (DType.INT64, extents)),
              tensor_param(f"W{k}", (opts.ct, extents))]
    lines += [statement(f"I{k}", idx + ["t"], read, extents, lets),
              statement(f"W{k}", idx + ["t"], weight, extents, lets)]
    return decls, lines


@register("GridSample")
def _grid_sample(ctx: OpContext) -> TCKernel:
    image, grid = ctx.shape(0), ctx.shape(1)
    rank = ctx.rank(0, least=3)
    dims = rank - 2
    if len(grid) != rank or grid[0] != image[0] or grid[-1] != dims:
        raise ctx.malformed(f"a grid of shape {grid} cannot sample an image of shape {image}: "
                            f"it needs shape (N, D1, ..., D{dims}, {dims}) with N = {image[0]}")
    mode, padding = str(ctx.attr("mode", "linear")), str(ctx.attr("padding_mode", "zeros"))
    if mode not in _MODES or padding not in ("zeros", "border", "reflection"):
        raise ctx.malformed(f"mode '{mode}' and padding_mode '{padding}': the modes are "
                            "linear, cubic and nearest, the padding modes zeros, border and "
                            "reflection")
    dt = ctx.dtype(0)
    if not dt.is_float:
        raise ctx.unsupported(f"sampling {dt} images; polyfuse samples floating-point ones")
    ct = DType.FLOAT64 if ctx.dtype(1) is DType.FLOAT64 else DType.FLOAT32
    opts = _Options(_MODES[mode], padding, ctx.flag("align_corners", 0), ct)
    out = [image[0], image[1]] + list(grid[1:-1])
    y = list(INDEX[:rank])
    idx = [y[0]] + y[2:]                       # a grid point: batch and output position
    points = [out[0]] + out[2:]
    decls, lines, src, weights, taps = [], [], y[:2], [], []
    for k in range(dims):
        d, st = _tables(opts, image[2 + k], k, dims, points, idx)
        decls += d
        lines += st
        if opts.mode == "nearest":
            src.append(access(f"I{k}", idx))
        else:
            src.append(access(f"I{k}", idx + [f"t{k}"]))
            weights.append(access(f"W{k}", idx + [f"t{k}"]))
            taps.append(f"t{k} in 0:{_TAPS[opts.mode]}")
    read = access("X", src)
    if opts.mode == "nearest":
        if opts.padding == "zeros":
            inside = " && ".join(access(f"V{k}", idx) for k in range(dims))
            read = f"{inside} ? {read} : {literal(0, dt)}"
        lines.append(statement("Y", y, read, out))
    elif dt in (DType.FLOAT32, DType.FLOAT64):
        lines.append(statement("Y", y, f"{read} * {' * '.join(weights)}", out, taps, "+=!"))
    else:  # half precision accumulates in float32
        decls.append(tensor_param("A", (DType.FLOAT32, out)))
        lines += [statement("A", y, f"float32({read}) * {' * '.join(weights)}", out, taps, "+=!"),
                  statement("Y", y, f"{dt}({access('A', y)})", out)]
    params = [parameter(ctx, 0, "X"), parameter(ctx, 1, "G")]
    return TCKernel(definition(params, [tensor_param("Y", (dt, out))] + decls, lines), (0, 1))


@register("AffineGrid")
def _affine_grid(ctx: OpContext) -> TCKernel:
    theta = ctx.shape(0)
    size = ctx.ints(ctx.const(1, "size"), "size", least=1)
    dims = len(size) - 2
    if dims not in (2, 3) or theta != (size[0], dims, dims + 1):
        raise ctx.malformed(f"theta of shape {theta} and size {size}: 2-D grids need theta "
                            "(N, 2, 3) and size (N, C, H, W), 3-D ones (N, 3, 4) and "
                            "(N, C, D, H, W)")
    align = ctx.flag("align_corners", 0)
    spatial = size[2:]
    out = [size[0]] + spatial + [dims]
    y = list(INDEX[:len(out)])
    f64 = DType.FLOAT64

    def base(k: int) -> str:  # the normalized coordinate along spatial dimension k
        n, i = spatial[k], y[1 + k]
        if align and n == 1:
            return literal(-1, f64)
        step = 2 / (n - 1) if align else 2 / n
        start = -1.0 if align else -1 + step / 2
        return f"{literal(start, f64)} + float64({i}) * {literal(step, f64)}"

    # component c of the homogeneous point is x, y(, z), 1: spatial dimensions reversed
    terms = [f"float64({access('T', [y[0], y[-1], str(c)])}) * ({base(dims - 1 - c)})"
             for c in range(dims)] + [f"float64({access('T', [y[0], y[-1], str(dims)])})"]
    dt = ctx.dtype(0)
    line = statement("Y", y, f"{dt}({' + '.join(terms)})", out)
    return TCKernel(definition([parameter(ctx, 0, "T")], [tensor_param("Y", (dt, out))], [line]),
                    (0,))
