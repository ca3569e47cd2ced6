"""Ops that only change shapes (views) or are known from shapes alone (folded)."""

from __future__ import annotations

import math

import numpy as np

from polyfuse.ir.graph import reshape_target
from polyfuse.lowering.ops import Folded, OpContext, View, register


@register("Reshape")
def _reshape(ctx: OpContext) -> View:
    if ctx.has(1):
        shape = ctx.ints(ctx.const(1, "target shape"), "the target shape", least=-1)
    else:  # Reshape-1 took the shape as an attribute
        shape = ctx.ints(ctx.attr("shape", ()), "the target shape", least=-1)
    src = ctx.shape(0)
    expected = ctx.attr("polyfuse.input_shape")   # (lowering/layout: a channel shuffle's, channels-last)
    if expected is not None and tuple(src) != tuple(expected):
        raise ctx.unsupported(f"a Reshape taken for a channel shuffle of shape {tuple(expected)} (run "
                              f"channels-last) is given shape {tuple(src)}: the graph reshapes other "
                              "dimensions of the same count, which polyfuse does not run")
    allow_zero = ctx.flag("allowzero", 0)
    if not allow_zero and any(d == 0 for d in shape[len(src):]):
        raise ctx.malformed(f"target shape {tuple(shape)} copies (0) a dimension input shape "
                            f"{src} does not have")
    out = reshape_target(src, shape, bool(allow_zero))
    if out.count(-1) > 1:
        raise ctx.unsupported(f"target shape {tuple(shape)} has more than one -1")
    if math.prod(out) != math.prod(src) or any(d < 0 for d in out):
        raise ctx.unsupported(f"cannot reshape {src} into {tuple(shape)}")
    return View(0, tuple(out))


@register("Flatten")
def _flatten(ctx: OpContext) -> View:
    src = ctx.shape(0)
    axis = ctx.ints(ctx.attr("axis", 1), "axis", 1)[0]
    if not -len(src) <= axis <= len(src):   # the rank itself is allowed: (prod, 1)
        raise ctx.malformed(f"axis {axis} is out of range for rank {len(src)}; it must be in "
                            f"[{-len(src)}, {len(src)}]")
    axis += len(src) if axis < 0 else 0
    return View(0, (math.prod(src[:axis]), math.prod(src[axis:])))


def _axes(ctx: OpContext) -> list[int] | None:
    """The ``axes`` of Squeeze/Unsqueeze: an input from opset 13, an attribute before."""
    axes = ctx.const(1, "axes") if ctx.has(1) else ctx.attr("axes")
    if axes is not None and np.ndim(axes) > 1:
        raise ctx.malformed(f"axes must be a list of ints, got shape {np.shape(axes)}")
    # empty axes mean none given, as onnxruntime reads them (Squeeze: every size-1 dimension)
    return None if axes is None or np.size(axes) == 0 else ctx.ints(axes, "axes")


@register("Squeeze")
def _squeeze(ctx: OpContext) -> View:
    src = ctx.shape(0)
    axes = _axes(ctx)
    if axes is None:
        return View(0, tuple(d for d in src if d != 1))
    drop = set(ctx.axes(axes, len(src)))
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
    ones = set(ctx.axes(axes, rank))
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
