"""Ops that only change shapes (views) or are known from shapes alone (folded)."""

from __future__ import annotations

import math

import numpy as np

from polyfuse.lowering.ops import Folded, OpContext, View, onnx_axis, register


@register("Reshape")
def _reshape(ctx: OpContext) -> View:
    if ctx.has(1):
        shape = [int(d) for d in ctx.const(1, "target shape")]
    else:  # Reshape-1 took the shape as an attribute
        shape = [int(d) for d in ctx.attr("shape", ())]
    src = ctx.shape(0)
    allow_zero = int(ctx.attr("allowzero", 0))
    out = [src[k] if d == 0 and not allow_zero else d for k, d in enumerate(shape)]
    if out.count(-1) > 1:
        raise ctx.unsupported(f"target shape {tuple(shape)} has more than one -1")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        out[out.index(-1)] = math.prod(src) // known if known else 0
    if math.prod(out) != math.prod(src) or any(d < 0 for d in out):
        raise ctx.unsupported(f"cannot reshape {src} into {tuple(shape)}")
    return View(0, tuple(out))


@register("Flatten")
def _flatten(ctx: OpContext) -> View:
    src = ctx.shape(0)
    axis = onnx_axis(int(ctx.attr("axis", 1)), len(src))
    return View(0, (math.prod(src[:axis]), math.prod(src[axis:])))


def _axes(ctx: OpContext) -> list[int] | None:
    """The ``axes`` of Squeeze/Unsqueeze: an input from opset 13, an attribute before."""
    if ctx.has(1):
        return [int(a) for a in np.atleast_1d(ctx.const(1, "axes"))]
    axes = ctx.attr("axes")
    return None if axes is None else [int(a) for a in np.atleast_1d(axes)]


@register("Squeeze")
def _squeeze(ctx: OpContext) -> View:
    src = ctx.shape(0)
    axes = _axes(ctx)
    if axes is None:
        return View(0, tuple(d for d in src if d != 1))
    drop = {onnx_axis(a, len(src)) for a in axes}
    if any(src[a] != 1 for a in drop):
        raise ctx.unsupported(f"cannot squeeze axes {sorted(drop)} of shape {src}: "
                              "only dimensions of size 1 can be removed")
    return View(0, tuple(d for k, d in enumerate(src) if k not in drop))


@register("Unsqueeze")
def _unsqueeze(ctx: OpContext) -> View:
    src = ctx.shape(0)
    axes = _axes(ctx)
    if axes is None:
        raise ctx.unsupported("Unsqueeze needs axes")
    rank = len(src) + len(axes)
    ones = {onnx_axis(a, rank) for a in axes}
    if len(ones) != len(axes):
        raise ctx.unsupported(f"repeated axes {axes}")
    rest = iter(src)
    return View(0, tuple(1 if k in ones else next(rest) for k in range(rank)))


@register("Shape")
def _shape(ctx: OpContext) -> Folded:
    shape = np.array(ctx.shape(0), dtype=np.int64)
    start = int(ctx.attr("start", 0))
    end = ctx.attr("end")
    return Folded((shape[start:None if end is None else int(end)],))


@register("Size")
def _size(ctx: OpContext) -> Folded:
    return Folded((np.array(math.prod(ctx.shape(0)), dtype=np.int64),))
