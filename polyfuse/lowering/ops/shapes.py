"""Ops that only change shapes (views) or are known from shapes alone (folded)."""

from __future__ import annotations

import math

import numpy as np

from polyfuse.lowering.ops import Folded, OpContext, View, onnx_axis, register


@register("Reshape")
def _reshape(ctx: OpContext) -> View:
    shape = [int(d) for d in ctx.const(1, "target shape")]
    src = ctx.shape(0)
    allow_zero = int(ctx.attr("allowzero", 0))
    out = [src[k] if d == 0 and not allow_zero else d for k, d in enumerate(shape)]
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        out[out.index(-1)] = math.prod(src) // known if known else 0
    if math.prod(out) != math.prod(src):
        raise ctx.unsupported(f"cannot reshape {src} into {tuple(shape)}")
    return View(0, tuple(out))


@register("Flatten")
def _flatten(ctx: OpContext) -> View:
    src = ctx.shape(0)
    axis = onnx_axis(int(ctx.attr("axis", 1)), len(src))
    return View(0, (math.prod(src[:axis]), math.prod(src[axis:])))


def _axes(ctx: OpContext, rank: int) -> list[int] | None:
    if ctx.has(1):
        axes = ctx.const(1, "axes")
    else:
        axes = ctx.attr("axes")
        if axes is None:
            return None
    return sorted(onnx_axis(int(a), rank) for a in np.atleast_1d(axes))


@register("Squeeze")
def _squeeze(ctx: OpContext) -> View:
    src = ctx.shape(0)
    axes = _axes(ctx, len(src))
    if axes is None:
        return View(0, tuple(d for d in src if d != 1))
    return View(0, tuple(d for k, d in enumerate(src) if k not in axes))


@register("Unsqueeze")
def _unsqueeze(ctx: OpContext) -> View:
    src = list(ctx.shape(0))
    axes = _axes(ctx, len(src) + len(np.atleast_1d(ctx.attr("axes") if not ctx.has(1) else ctx.const(1, "axes"))))
    for a in axes or []:
        src.insert(a, 1)
    return View(0, tuple(src))


@register("Shape")
def _shape(ctx: OpContext) -> Folded:
    shape = np.array(ctx.shape(0), dtype=np.int64)
    rank = len(shape)
    start = ctx.attr("start", 0)
    end = ctx.attr("end", rank)
    return Folded((shape[slice(start, end)],))


@register("Size")
def _size(ctx: OpContext) -> Folded:
    return Folded((np.array(math.prod(ctx.shape(0)), dtype=np.int64),))
