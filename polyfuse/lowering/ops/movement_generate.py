"""Ops whose outputs are patterns of their indices: ConstantOfShape, Range, EyeLike,
Trilu and OneHot. Those without tensor inputs fold at compile time."""

from __future__ import annotations

import math

import numpy as np

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import (INDEX, OpContext, TCKernel, access, holding, literal, register,
                                   tensor_param)
from polyfuse.lowering.ops.movement import definition, one_input, parameter, statement
from polyfuse.lowering.ops.movement_gather import normalized


def _dtype(ctx: OpContext, array: np.ndarray) -> DType:
    dt = DType.from_numpy(array.dtype)
    if dt is None:
        raise ctx.unsupported(f"element type {array.dtype} is not supported")
    return dt


def _generated(dt: DType, shape: list[int], rhs: str) -> TCKernel:
    """A kernel without inputs setting ``Y`` to ``rhs`` (of its indices) everywhere."""
    st = statement("Y", INDEX[:len(shape)], rhs, shape)
    return TCKernel(definition([], [tensor_param("Y", (dt, shape))], [st]), ())


@register("ConstantOfShape")
def _constant_of_shape(ctx: OpContext) -> TCKernel:
    if np.asarray(ctx.const(0, "shape")).ndim != 1:
        raise ctx.malformed("the shape must be a 1-d tensor of sizes")
    shape = ctx.ints(ctx.const(0, "shape"), "the shape", least=0)
    value = ctx.attr("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value)
    if value.size != 1:
        raise ctx.malformed(f"the value attribute has {value.size} elements; it must have one")
    dt = _dtype(ctx, value)   # a narrow type (float8, int4) is made in its storage type
    v = value.reshape(-1)[0].astype(dt.storage.numpy).item()
    return holding(_generated(dt.storage, shape, literal(v, dt.storage)), dt)


@register("Range")
def _range(ctx: OpContext) -> TCKernel:
    for i, what in enumerate(("start", "limit", "delta")):
        if ctx.const(i, what).size != 1:
            raise ctx.malformed(f"{what} (input {i}) must be a scalar, got shape {ctx.shape(i)}")
    start, limit, delta = (ctx.const(i, "").reshape(-1)[0] for i in range(3))
    if delta == 0 or not all(np.isfinite(v) for v in (start, limit, delta)):
        raise ctx.malformed(f"Range({start}, {limit}, {delta}) has no finite length: delta must "
                            "not be 0 and all three must be finite")
    dt = ctx.dtype(0)
    if dt.is_int:
        count = max(-(-(int(limit) - int(start)) // int(delta)), 0)
    else:
        count = max(math.ceil((float(limit) - float(start)) / float(delta)), 0)
    rhs = f"{literal(start.item(), dt)} + {dt}(i0) * {literal(delta.item(), dt)}"
    return _generated(dt, [count], rhs)


@register("EyeLike")
def _eye_like(ctx: OpContext) -> TCKernel:
    shape = ctx.shape(0)
    if len(shape) != 2:
        raise ctx.unsupported(f"expects a 2-d input, got shape {shape}")
    dt = ctx.element_type("dtype") or ctx.dtype(0)
    k = int(ctx.attr("k", 0))
    rhs = f"i1 - i0 == {k} ? {literal(1, dt)} : {literal(0, dt)}"
    return _generated(dt, list(shape), rhs)


@register("Trilu")
def _trilu(ctx: OpContext) -> TCKernel:
    shape = ctx.shape(0)
    rank = ctx.rank(0, least=2)
    k = ctx.ints(ctx.const(1, "diagonal offset k"), "k", 1)[0] if ctx.has(1) else 0
    row, col = INDEX[rank - 2], INDEX[rank - 1]
    keep = f"{col} - {row} >= {k}" if ctx.flag("upper", 1) else f"{col} - {row} <= {k}"
    rhs = f"{keep} ? {access('X', INDEX[:rank])} : {literal(0, ctx.dtype(0))}"
    return one_input(ctx, shape, rhs)


@register("OneHot")
def _one_hot(ctx: OpContext) -> TCKernel:
    ind = ctx.shape(0)
    depths = ctx.const(1, "depth").reshape(-1)
    if depths.size != 1 or not np.isfinite(depths[0]) or int(depths[0]) < 1:
        raise ctx.malformed(f"depth {depths.tolist()} must be one positive number")
    depth = int(depths[0])
    if ctx.const(2, "values").size != 2:
        raise ctx.malformed(f"values must hold two elements (off, on), got shape {ctx.shape(2)}")
    rank = len(ind) + 1
    axis = ctx.axis(ctx.attr("axis", -1), rank)
    out = list(ind[:axis]) + [depth] + list(ind[axis:])
    at = [i for k, i in enumerate(INDEX[:rank]) if k != axis]
    index = normalized(access("I", at), depth)
    rhs = f"{index} == {INDEX[axis]} ? V(1) : V(0)"     # values = [off, on]
    params = [parameter(ctx, 0, "I"), parameter(ctx, 2, "V")]
    st = statement("Y", INDEX[:rank], rhs, out)
    return TCKernel(definition(params, [tensor_param("Y", (ctx.dtype(2), out))], [st]), (0, 2))
