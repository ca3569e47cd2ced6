"""Resize: nearest, linear and cubic interpolation, antialiased or not.

Interpolation is separable: along each resized axis, output index ``o`` maps to a
source coordinate ``x(o)`` and reads ``n`` neighbouring elements with weights. Per
axis the definition builds small tables (index ``I(o, t)``, weight ``W(o, t)``) and
one final statement sums the weighted neighbours. ``x`` is computed in float64 with
the operations, in the order, of the ONNX reference, so that the integer decisions
(which neighbour, rounding ties, extrapolation) match it exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import (INDEX, OpContext, TCKernel, access, literal,
                                   register, tensor_param)
from polyfuse.lowering.ops.movement import definition, parameter, statement

F64 = DType.FLOAT64


def f64(value: float) -> str:
    return literal(float(value), F64)


@dataclass(frozen=True)
class _Axis:
    """One resized dimension, as the reference computes it."""

    dim: int
    size_in: int
    size_out: int
    scale: float           # the scale factor (float64 of the given float32, or out / in)
    roi: tuple[int, int]   # positions of this axis' start and end in the roi input

    @property
    def width(self) -> float:  # the real-valued output width
        return self.scale * self.size_in


@dataclass(frozen=True)
class _Options:
    mode: str
    transform: str
    nearest: str
    cubic_a: float
    exclude_outside: bool
    antialias: bool


def _options(ctx: OpContext) -> _Options:
    legacy = ctx.opset < 11  # Resize-10: asymmetric coordinates, ORT's "simple" nearest
    return _Options(
        mode=str(ctx.attr("mode", "nearest")),
        transform="asymmetric" if legacy else str(ctx.attr("coordinate_transformation_mode",
                                                           "half_pixel")),
        nearest="simple" if legacy else str(ctx.attr("nearest_mode", "round_prefer_floor")),
        cubic_a=float(ctx.attr("cubic_coeff_a", -0.75)),
        exclude_outside=bool(int(ctx.attr("exclude_outside", 0))),
        antialias=bool(int(ctx.attr("antialias", 0))))


def _given(ctx: OpContext, i: int, what: str) -> np.ndarray | None:
    """Input ``i``'s value, or None when it is omitted or empty (both mean "not given")."""
    if not ctx.has(i) or math.prod(ctx.shape(i)) == 0:
        return None
    return ctx.const(i, what)


def _axes(ctx: OpContext, transform: str) -> list[_Axis]:
    """The resized axes (identity axes dropped), mirroring the reference's size rules."""
    shape = ctx.shape(0)
    rank = len(shape)
    legacy = ctx.opset < 11
    scales = _given(ctx, 1 if legacy else 2, "scales") if ctx.attr("scales") is None else \
        np.asarray(ctx.attr("scales"), np.float32)  # Upsample-7's attribute
    sizes = None if legacy else _given(ctx, 3, "sizes")
    given = ctx.attr("axes")
    axes = list(range(rank)) if given is None else ctx.axes(given, rank)
    for values, what in ((sizes, "sizes"), (scales, "scales")):
        if values is not None and values.size != len(axes):
            raise ctx.malformed(f"{what} {values.reshape(-1).tolist()} must have one entry per "
                                f"resized axis ({len(axes)})")
    if sizes is not None and (sizes < 0).any():
        raise ctx.malformed(f"sizes {sizes.tolist()} must be >= 0")
    if scales is not None and not (np.isfinite(scales) & (scales > 0)).all():
        raise ctx.malformed(f"scales {scales.tolist()} must be finite and > 0")
    if sizes is not None:
        out = list(shape)
        for k, a in enumerate(axes):
            out[a] = int(sizes[k])
        factors = [out[i] / shape[i] if shape[i] else 1.0 for i in range(rank)]
        policy = str(ctx.attr("keep_aspect_ratio_policy", "stretch"))
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            scale = pick(factors[a] for a in axes)
            factors = [scale if i in axes else 1.0 for i in range(rank)]
            out = [int(scale * shape[i] + 0.5) if i in axes else shape[i] for i in range(rank)]
    elif scales is not None:
        factors = [1.0] * rank
        for k, a in enumerate(axes):
            factors[a] = float(scales[k])
        out = [int(f * d) for f, d in zip(factors, shape)]
    else:
        raise ctx.unsupported("needs scales or sizes")
    roi = None if legacy or not ctx.has(1) else ctx.values[1]  # read at run time if need be
    roi = None if roi is None or roi.size == 0 else roi.reshape(-1)
    if roi is not None and roi.size != 2 * len(axes):
        raise ctx.malformed(f"roi {roi.tolist()} must have a start and an end for each resized "
                            f"axis ({2 * len(axes)} values)")
    result = []
    for k, a in enumerate(axes):
        bounds = (k, k + len(axes))
        trivial = roi is not None and math.isclose(float(roi[bounds[0]]), 0.0) and \
            math.isclose(float(roi[bounds[1]]), 1.0)
        if math.isclose(factors[a], 1.0) and out[a] == shape[a] and \
                (trivial or transform != "tf_crop_and_resize"):
            continue  # the reference skips identity axes
        result.append(_Axis(a, shape[a], out[a], factors[a], bounds))
    return result


def _output_shape(ctx: OpContext, axes: Sequence[_Axis]) -> list[int]:
    out = list(ctx.shape(0))
    for ax in axes:
        out[ax.dim] = ax.size_out
    return out


def coordinate(transform: str, ax: _Axis, o: str) -> str:
    """The source coordinate of output index ``o`` (float64, the reference's formula)."""
    y, s = f"float64({o})", f64(ax.scale)
    if transform == "align_corners":
        return "0.0" if ax.width == 1 else f"{y} * {f64(ax.size_in - 1)} / {f64(ax.width - 1)}"
    if transform == "asymmetric":
        return f"{y} / {s}"
    if transform == "pytorch_half_pixel" and ax.width == 1:
        return "-0.5"
    if transform in ("half_pixel", "pytorch_half_pixel"):
        return f"({y} + 0.5) / {s} - 0.5"
    if transform == "half_pixel_symmetric":
        shift = ax.size_in / 2 * (1 - ax.size_out / ax.width)
        return f"{f64(shift)} + ({y} + 0.5) / {s} - 0.5"
    if transform == "tf_crop_and_resize":  # roi is float32 math in the reference, as here
        lo, hi = (access("R", [str(p)]) for p in ax.roi)
        start = f"float64({lo} * {ax.size_in - 1})"
        if ax.width == 1:
            return f"float64(({hi} - {lo}) * {ax.size_in - 1} / 2) + {start}"
        return (f"{y} * float64({hi} - {lo}) * {f64(ax.size_in - 1)} / {f64(ax.width - 1)}"
                f" + {start}")
    raise ValueError(f"unknown coordinate_transformation_mode '{transform}'")


def _lets(opts: _Options, ax: _Axis, o: str, taps: int) -> list[str]:
    """``x``, the ratio ``r`` in (0, 1] and the first neighbour ``s``, as the reference."""
    half = taps // 2
    return [f"x = {coordinate(opts.transform, ax, o)}", "fx = floor(x)",
            "r = x == fx ? float64(1.0) : x - fx", f"xp = x + {f64(half)}", "p = floor(xp)",
            f"s = int64(p) + (xp == p ? {-half} : {1 - half}) - {half}"]


def _kernel_taps(opts: _Options, scale: float) -> tuple[int, int]:
    """(neighbours read, offset of the first one from floor(x)) of the filter."""
    if opts.mode == "nearest":
        return 2, 0
    if not opts.antialias:
        return (2, 0) if opts.mode == "linear" else (4, -1)
    s = min(scale, 1.0)
    first = int(np.floor((-1 if opts.mode == "linear" else -2) / s) + 1)
    return 2 - 2 * first, first


def _weight(opts: _Options, scale: float, t: str, first: int) -> str:
    """The weight of tap ``t``, from the ratio ``r`` (the reference's coefficients)."""
    a = opts.cubic_a
    if opts.mode == "linear" and not opts.antialias:
        return f"{t} == 0 ? 1.0 - r : r"
    if opts.mode == "cubic" and not opts.antialias:
        far = (f"(({f64(a)} * ({{0}} + 1.0) - {f64(5 * a)}) * ({{0}} + 1.0) + {f64(8 * a)})"
               f" * ({{0}} + 1.0) - {f64(4 * a)}")
        near = f"({f64(a + 2)} * {{0}} - {f64(a + 3)}) * {{0}} * {{0}} + 1.0"
        return (f"{t} == 0 ? {far.format('r')} : {t} == 1 ? {near.format('r')} : "
                f"{t} == 2 ? {near.format('(1.0 - r)')} : {far.format('(1.0 - r)')}")
    s = f64(min(scale, 1.0))
    d = f"abs((float64({t} + {first}) - r) * {s})"
    if opts.mode == "linear":
        return f"min(max(1.0 - {d}, 0.0), 1.0)"
    near = f"({f64(a + 2)} * {d} - {f64(a + 3)}) * {d} * {d} + 1.0"
    far = f"(({f64(a)} * {d} - {f64(5 * a)}) * {d} + {f64(8 * a)}) * {d} - {f64(4 * a)}"
    return f"{d} <= 1.0 ? {near} : {d} < 2.0 ? {far} : 0.0"


def _nearest_pick(opts: _Options, scale: float) -> str:
    """Whether the lower of the two neighbours is taken (the reference's coefficients)."""
    mode = opts.nearest
    if mode == "simple":
        mode = "ceil" if scale < 1 else "floor"
    return {"round_prefer_floor": "r <= 0.5", "round_prefer_ceil": "r < 0.5",
            "floor": "r != 1.0", "ceil": "bool(0)"}[mode]


def _axis_tables(opts: _Options, ax: _Axis, name: str) -> tuple[list[str], list[str], int]:
    """(declarations, statements, taps) of the tables of one axis."""
    n, first = _kernel_taps(opts, ax.scale)
    last = ax.size_in - 1
    out = ax.size_out
    lets = _lets(opts, ax, "o", n)
    if opts.mode == "nearest":
        pick = _nearest_pick(opts, ax.scale)
        decls = [tensor_param(f"I{name}", (DType.INT64, [out]))]
        lines = [statement(f"I{name}", ["o"], f"min(max({pick} ? s : s + 1, 0), {last})",
                           [out], lets)]
    else:
        decls = [tensor_param(f"I{name}", (DType.INT64, [out, n])),
                 tensor_param(f"W{name}", (F64, [out, n]))]
        lines = [statement(f"I{name}", ["o", "t"], f"min(max(s + t, 0), {last})", [out, n],
                           lets)]
        lines += _weights(opts, ax, name, n, first, lets)
        if opts.exclude_outside or opts.antialias:
            decls += [tensor_param(f"U{name}", (F64, [out, n])),
                      tensor_param(f"S{name}", (F64, [out]))]
    if opts.transform == "tf_crop_and_resize":
        decls.append(tensor_param(f"E{name}", (DType.BOOL, [out])))
        lines.append(statement(f"E{name}", ["o"], f"x < 0.0 || x > {f64(last)}", [out],
                               lets[:1]))
    return decls, lines, n


def _weights(opts: _Options, ax: _Axis, name: str, n: int, first: int,
             lets: list[str]) -> list[str]:
    """Statements of the weight table ``W``, normalized to sum 1 where the reference does."""
    out, last = ax.size_out, ax.size_in - 1
    weight = _weight(opts, ax.scale, "t", first)
    if opts.exclude_outside:
        weight = f"s + t < 0 || s + t > {last} ? 0.0 : {weight}"
    if not (opts.exclude_outside or opts.antialias):
        return [statement(f"W{name}", ["o", "t"], weight, [out, n], lets)]
    return [statement(f"U{name}", ["o", "t"], weight, [out, n], lets),
            f"S{name}(o) +=! U{name}(o, t)",
            statement(f"W{name}", ["o", "t"],
                      f"U{name}(o, t) / (S{name}(o) == 0.0 ? 1.0 : S{name}(o))", [out, n])]


def _combine(dt: DType, read: str, weights: list[str], taps: list[str],
             out: list[int]) -> tuple[list[str], list[str]]:
    """(temporaries, statements) summing the weighted neighbours into ``Y``."""
    idx = INDEX[:len(out)]
    if not weights:  # nearest
        return [], [statement("Y", idx, read, out)]
    product = " * ".join(weights)
    if dt in (DType.FLOAT32, DType.FLOAT64):
        return [], [statement("Y", idx, f"{read} * {product}", out, taps, "+=!")]
    # other types accumulate in float64, then round (integers) and saturate, as the reference
    value = access("A", idx)
    if dt.is_int:
        info = np.iinfo(dt.numpy)
        value = f"min(max(rint({value}), {f64(info.min)}), {f64(info.max)})"
    return [tensor_param("A", (F64, out))], [
        statement("A", idx, f"float64({read}) * {product}", out, taps, "+=!"),
        statement("Y", idx, f"{dt}({value})", out)]


@register("Resize", "Upsample")  # Upsample (opsets 7 and 9) is Resize-10
def _resize(ctx: OpContext) -> TCKernel:
    opts = _options(ctx)
    if opts.mode not in ("nearest", "linear", "cubic"):
        raise ctx.unsupported(f"unknown mode '{opts.mode}'")
    if opts.mode == "nearest" and opts.antialias:
        raise ctx.unsupported("antialias applies to linear and cubic modes only")
    dt = ctx.dtype(0)
    axes = _axes(ctx, opts.transform)
    out = _output_shape(ctx, axes)
    crop = opts.transform == "tf_crop_and_resize" and bool(axes)
    params = [parameter(ctx, 0, "X")]
    if crop:  # the roi is read at run time
        params.append(parameter(ctx, 1, "R"))
    idx = list(INDEX[:len(out)])
    src, weights, taps, decls, lines = list(idx), [], [], [], []
    for ax in axes:
        name, i = str(ax.dim), INDEX[ax.dim]
        d, st, n = _axis_tables(opts, ax, name)
        decls += d
        lines += st
        if opts.mode == "nearest":
            src[ax.dim] = f"I{name}({i})"
        else:
            src[ax.dim] = f"I{name}({i}, t{name})"
            weights.append(f"W{name}({i}, t{name})")
            taps.append(f"t{name} in 0:{n}")
    temps, final = _combine(dt, access("X", src), weights, taps, out)
    lines += final
    if crop:
        outside = " || ".join(f"E{ax.dim}({INDEX[ax.dim]})" for ax in axes)
        value = literal(float(ctx.attr("extrapolation_value", 0.0)), dt)
        lines.append(statement("Y", idx, f"{outside} ? {value} : {access('Y', idx)}", out))
    outputs = [tensor_param("Y", (dt, out))] + decls + temps
    return TCKernel(definition(params, outputs, lines), (0, 1) if crop else (0,))
