"""Scatters: a copy of the data with elements replaced (or combined) by updates at
positions an index tensor gives at run time.

A comprehension writes only at its own indices, so each output element finds the
updates aimed at it: it compares every index it could be written by with its own
position. With a reduction (add, mul, max, min) the matching updates fold into the
copy in order; without one, the last matching update wins (a ``max`` over the
positions of the matches), as in the ONNX reference. The work is the output size
times the number of updates that could reach an element (the length of the scatter
axis for ScatterElements, all index tuples for ScatterND).

Every index is read through an ``arange`` constant of its dimension, so a value
outside ``[-n, n)`` is caught when the kernel runs (a BoundsError) like a gather's,
instead of being ignored.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import (INDEX, OpContext, TCKernel, access, literal, register,
                                   tensor_param)
from polyfuse.lowering.ops.movement import definition, parameter, statement
from polyfuse.lowering.ops.movement_gather import normalized

_REDUCTIONS = {"add": "+=", "mul": "*=", "max": "max=", "min": "min="}


def _identity(reduction: str, dt: DType) -> str:
    """The value a reduction leaves unchanged, in ``dt``."""
    if reduction in ("add", "mul"):
        return literal(int(reduction == "mul"), dt)
    if dt.is_float:
        return literal(-math.inf if reduction == "max" else math.inf, dt)
    info = np.iinfo(dt.numpy)
    return literal(info.min if reduction == "max" else info.max, dt)


def _reduction(ctx: OpContext) -> str:
    reduction = str(ctx.attr("reduction", "none"))
    if reduction != "none" and reduction not in _REDUCTIONS:
        raise ctx.malformed(f"reduction '{reduction}' must be none, add, mul, max or min")
    if reduction != "none" and ctx.dtype(0).is_bool:
        raise ctx.unsupported(f"reduction '{reduction}' of bool data")
    return reduction


def _position(name: str, read: str, extent: int) -> str:
    """The position index ``read`` names in a dimension of ``extent``, read through the
    arange ``name`` so that a value out of range fails at run time."""
    return access(name, [normalized(read, extent)])


def _arange(extent: int) -> np.ndarray:
    return np.arange(extent, dtype=np.int64)


def _kernel(ctx: OpContext, lines: list[str], temps: list[str],
            constants: list[np.ndarray]) -> TCKernel:
    params = [parameter(ctx, 0, "X"), parameter(ctx, 1, "I"), parameter(ctx, 2, "U")]
    params += [tensor_param(f"R{c}", (DType.INT64, a.shape)) for c, a in enumerate(constants)]
    outputs = [parameter(ctx, 0, "Y")] + temps
    return TCKernel(definition(params, outputs, lines), (0, 1, 2), constants=tuple(constants))


def _combine(ctx: OpContext, reduction: str, region: list[int], keyed: int, match: str,
             update: Callable[[list[str]], str], lead: list[str],
             counts: list[int]) -> tuple[list[str], list[str]]:
    """(statements, temporaries) writing ``Y``: the data, then at each element of
    ``region`` the updates ``update(lead)`` (``lead`` over ``counts``) whose position
    ``match``es; ``match`` depends on the first ``keyed`` output indices only."""
    data = ctx.shape(0)
    out = list(INDEX[:len(data)])
    idx = out[:len(region)]
    taps = [f"{j} in 0:{n}" for j, n in zip(lead, counts)]
    copy = statement("Y", out, access("X", out), data)
    if reduction != "none":
        rhs = f"{match} ? {update(lead)} : {_identity(reduction, ctx.dtype(0))}"
        return [copy, statement("Y", idx, rhs, region, taps, _REDUCTIONS[reduction])], []
    # the last matching update wins: L is its flat position among the updates, or -1
    strides = [math.prod(counts[m + 1:]) for m in range(len(counts))]
    flat = " + ".join(f"{j} * {s}" for j, s in zip(lead, strides)) or "0"
    key = access("L", out[:keyed])
    last = statement("L", out[:keyed], f"{match} ? int64({flat}) : int64(-1)", region[:keyed],
                     taps, "max=!")
    picked = [f"floormod(floordiv(max({key}, 0), {s}), {n})" for s, n in zip(strides, counts)]
    rhs = f"{key} >= 0 ? {update(picked)} : Y({', '.join(idx)})"
    return [copy, last, statement("Y", idx, rhs, region)], \
        [tensor_param("L", (DType.INT64, region[:keyed]))]


@register("ScatterElements", "Scatter")
def _scatter_elements(ctx: OpContext) -> TCKernel:
    data, ind, upd = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    rank = len(data)
    axis = ctx.axis(ctx.attr("axis", 0), rank)
    if len(ind) != rank or upd != ind or any(i > d for k, (i, d) in enumerate(zip(ind, data))
                                             if k != axis):
        raise ctx.malformed(f"indices of shape {ind} and updates of shape {upd} cannot scatter "
                            f"into data of shape {data}: both need the data's rank, the same "
                            f"shape, and no larger size than the data outside axis {axis}")
    reduction = _reduction(ctx) if ctx.node.op == "ScatterElements" else "none"
    out = list(INDEX[:rank])
    if 0 in ind:
        return _kernel(ctx, [statement("Y", out, access("X", out), data)], [], [])

    def at(j: str) -> list[str]:  # the index and update element written along the axis
        return out[:axis] + [j] + out[axis + 1:]

    region = [data[k] if k == axis else ind[k] for k in range(rank)]
    match = f"{_position('R0', access('I', at('j')), data[axis])} == {out[axis]}"
    lines, temps = _combine(ctx, reduction, region, rank, match,
                            lambda src: access("U", at(src[0])), ["j"], [ind[axis]])
    return _kernel(ctx, lines, temps, [_arange(data[axis])])


@register("ScatterND")
def _scatter_nd(ctx: OpContext) -> TCKernel:
    data, ind, upd = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if not ind or not 1 <= ind[-1] <= len(data) or upd != ind[:-1] + data[ind[-1]:]:
        raise ctx.malformed(f"indices of shape {ind} and updates of shape {upd} cannot scatter "
                            f"into data of shape {data}: the indices need rank >= 1 and a last "
                            "dimension between 1 and the data's rank, and the updates the shape "
                            "indices.shape[:-1] + data.shape[indices.shape[-1]:]")
    reduction = _reduction(ctx)
    depth, counts = ind[-1], list(ind[:-1])
    out = list(INDEX[:len(data)])
    if 0 in counts:
        return _kernel(ctx, [statement("Y", out, access("X", out), data)], [], [])
    lead = [f"j{m}" for m in range(len(counts))]
    match = " && ".join(f"{_position(f'R{c}', access('I', lead + [str(c)]), data[c])} == {out[c]}"
                        for c in range(depth))
    lines, temps = _combine(ctx, reduction, list(data), depth, match,
                            lambda src: access("U", src + out[depth:]), lead, counts)
    return _kernel(ctx, lines, temps, [_arange(data[c]) for c in range(depth)])


@register("TensorScatter")
def _tensor_scatter(ctx: OpContext) -> TCKernel:
    """A cache update: each batch's sequence of updates lands from its write index on
    (wrapping around the cache in circular mode), so every cache element reads back at
    most one update: a gather, with linear work."""
    cache, upd = ctx.shape(0), ctx.shape(1)
    rank = len(cache)
    axis = ctx.axis(ctx.attr("axis", -2), rank)
    mode = str(ctx.attr("mode", "linear"))
    if mode not in ("linear", "circular"):
        raise ctx.malformed(f"mode '{mode}' must be linear or circular")
    if axis == 0 or len(upd) != rank or upd[axis] > cache[axis] or \
            any(u != c for k, (u, c) in enumerate(zip(upd, cache)) if k != axis):
        raise ctx.malformed(f"an update of shape {upd} cannot go into a cache of shape {cache} "
                            f"along axis {axis}: the shapes must agree except along the axis "
                            "(not the batch axis 0), where the update may be no longer")
    size, seq = cache[axis], upd[axis]
    out = list(INDEX[:rank])
    params = [parameter(ctx, 0, "X"), parameter(ctx, 1, "U")]
    constants: tuple[np.ndarray, ...] = ()
    start = "0"
    if ctx.has(2):
        if ctx.shape(2) != (cache[0],):
            raise ctx.malformed(f"write_indices have shape {ctx.shape(2)}; they must have one "
                                f"index per batch ({cache[0]},)")
        params.append(parameter(ctx, 2, "W"))
        start = access("W", out[:1])
        if mode == "linear":  # through the valid starts, so a sequence past the end fails
            params.append(tensor_param("R", (DType.INT64, [size - seq + 1])))
            constants = (_arange(size - seq + 1),)
            start = access("R", [start])
    step = f"{out[axis]} - {start}"
    lets = [f"d = {f'floormod({step}, {size})' if mode == 'circular' else step}"]
    src = out[:axis] + ["d"] + out[axis + 1:]
    rhs = f"d >= 0 && d < {seq} ? {access('U', src)} : {access('X', out)}"
    lines = [statement("Y", out, rhs, cache, lets)]
    inputs = (0, 1, 2) if ctx.has(2) else (0, 1)
    return TCKernel(definition(params, [parameter(ctx, 0, "Y")], lines), inputs,
                    constants=constants)


@register("Col2Im")
def _col2im(ctx: OpContext) -> TCKernel:
    """Column blocks summed back into an image (the inverse of im2col): each image
    element gathers, over the block offsets, the column of the one block position (if
    any, given strides) that covers it."""
    cols = ctx.shape(0)
    image = ctx.ints(ctx.const(1, "image_shape"), "image_shape", least=1)
    block = ctx.ints(ctx.const(2, "block_shape"), "block_shape", len(image), least=1)
    dims = len(image)
    dil = ctx.ints(ctx.attr("dilations", [1] * dims), "dilations", dims, least=1)
    stride = ctx.ints(ctx.attr("strides", [1] * dims), "strides", dims, least=1)
    pads = ctx.ints(ctx.attr("pads", [0] * 2 * dims), "pads", 2 * dims, least=0)
    grid = [(image[m] + pads[m] + pads[m + dims] - dil[m] * (block[m] - 1) - 1) // stride[m] + 1
            for m in range(dims)]
    per = math.prod(block)
    if len(cols) != 3 or cols[1] % per or cols[2] != math.prod(grid) or min(grid) < 1:
        raise ctx.malformed(f"an input of shape {cols} cannot fold into an image {image} with "
                            f"blocks {block}: it needs shape (N, C * {per}, {math.prod(grid)}) "
                            f"(the block positions {grid}, which must not be empty)")
    out = [cols[0], cols[1] // per] + image
    y = list(INDEX[:dims + 2])
    lets, inside, offsets, positions = [], [], [], []
    for m in range(dims):
        k, b = f"k{m}", f"b{m}"
        lets.append(f"q{m} = {y[2 + m]} + {pads[m]} - {k} * {dil[m]}")
        if stride[m] == 1:
            lets.append(f"{b} = q{m}")
        else:
            lets.append(f"{b} = floordiv(q{m}, {stride[m]})")
            inside.append(f"floormod(q{m}, {stride[m]}) == 0")
        inside += [f"{b} >= 0", f"{b} < {grid[m]}"]
        offsets.append(f"{k} * {math.prod(block[m + 1:])}")
        positions.append(f"{b} * {math.prod(grid[m + 1:])}")
    read = access("X", [y[0], f"{y[1]} * {per} + {' + '.join(offsets)}", " + ".join(positions)])
    taps = [f"k{m} in 0:{block[m]}" for m in range(dims)]
    rhs = f"{' && '.join(inside)} ? {read} : {literal(0, ctx.dtype(0))}"
    line = statement("Y", y, rhs, out, taps + lets, "+=!")
    return TCKernel(definition([parameter(ctx, 0, "X")], [tensor_param("Y", (ctx.dtype(0), out))],
                               [line]), (0,))


def _unpool_shapes(ctx: OpContext) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """(kernel, strides, begin pads, the shape the indices count in, the output shape)."""
    data = ctx.shape(0)
    dims = len(data) - 2
    if dims < 1 or ctx.shape(1) != data:
        raise ctx.malformed(f"data of shape {data} and indices of shape {ctx.shape(1)} must "
                            "agree and have rank >= 3 (N, C, spatial dimensions)")
    kernel = ctx.ints(ctx.attr("kernel_shape"), "kernel_shape", dims, least=1)
    stride = ctx.ints(ctx.attr("strides", [1] * dims), "strides", dims, least=1)
    pads = ctx.ints(ctx.attr("pads", [0] * 2 * dims), "pads", 2 * dims, least=0)
    inferred = list(data[:2]) + [(data[2 + m] - 1) * stride[m] - pads[m] - pads[m + dims]
                                 + kernel[m] for m in range(dims)]
    out = inferred
    if ctx.has(2):
        out = ctx.ints(ctx.const(2, "output_shape"), "output_shape", len(data), least=0)
        if any(o < n for o, n in zip(out, inferred)):
            raise ctx.malformed(f"output_shape {out} is smaller than the unpooled shape "
                                f"{inferred} the indices count in")
    if min(inferred) < 1:
        raise ctx.malformed(f"the unpooled shape {inferred} is empty")
    return kernel, stride, pads[:dims], inferred, out


@register("MaxUnpool")
def _max_unpool(ctx: OpContext) -> TCKernel:
    """Values back at the positions MaxPool took them from, zeros elsewhere.

    The indices are flat positions in the unpooled shape (then placed at the start of a
    larger ``output_shape``). Each output element looks only at the inputs whose pooling
    window covers it, so the work is the output size times the window size; an index
    outside its own window (which MaxPool never produces) fails when the kernel runs,
    through the arange reads of ``V``, instead of being dropped. Where windows overlap,
    the last input (in flat order) naming an element wins, as in the ONNX reference."""
    data = ctx.shape(0)
    dims = len(data) - 2
    kernel, stride, pads, inferred, out = _unpool_shapes(ctx)
    x = list(INDEX[:len(data)])
    plane = math.prod(inferred[2:])
    # V: every index read back as its offset in its window (R1..) of its own plane (R0)
    pos = f"{access('I', x)} - ({x[0]} * {data[1]} + {x[1]}) * {plane}"
    checks = [access("R0", ["p"])]
    for m in range(dims):
        coord = f"floormod(floordiv(p, {math.prod(inferred[3 + m:])}), {inferred[2 + m]})"
        checks.append(access(f"R{m + 1}", [f"{coord} - {x[2 + m]} * {stride[m]} + {pads[m]}"]))
    check = statement("V", x, " + ".join(checks), data, [f"p = {pos}"])
    # L: the flat position (in the input plane) of the last input naming each element
    y = list(INDEX[:len(data)])
    lets, inside, taps = [], [], []
    for m in range(dims):
        taps.append(f"k{m} in 0:{kernel[m]}")
        lets.append(f"q{m} = {y[2 + m]} + {pads[m]} - k{m}")
        lets.append(f"b{m} = floordiv(q{m}, {stride[m]})")
        inside += [f"floormod(q{m}, {stride[m]}) == 0", f"b{m} >= 0", f"b{m} < {data[2 + m]}"]
    src = y[:2] + [f"b{m}" for m in range(dims)]
    flat = f"({y[0]} * {data[1]} + {y[1]})"
    for m in range(dims):
        flat = f"({flat} * {inferred[2 + m]} + {y[2 + m]})"
    key = " + ".join(f"b{m} * {math.prod(data[3 + m:])}" for m in range(dims))
    match = f"{access('V', src)} >= 0 && {access('I', src)} == {flat}"
    rhs = f"{' && '.join(inside)} ? ({match} ? int64({key}) : int64(-1)) : int64(-1)"
    last = statement("L", y, rhs, inferred, taps + lets, "max=!")
    # Y: the value L picks inside the unpooled shape, zero outside it
    picked = y[:2] + [f"floormod(floordiv(max({access('L', y)}, 0), {math.prod(data[3 + m:])}), "
                      f"{data[2 + m]})" for m in range(dims)]
    zero = literal(0, ctx.dtype(0))
    within = " && ".join(f"{y[2 + m]} < {inferred[2 + m]}" for m in range(dims))
    value = f"({access('L', y)} >= 0 ? {access('X', picked)} : {zero})"
    fill = statement("Y", y, f"{within} ? {value} : {zero}", out)
    constants = [_arange(plane)] + [_arange(k) for k in kernel]
    params = [parameter(ctx, 0, "X"), parameter(ctx, 1, "I")]
    params += [tensor_param(f"R{c}", (DType.INT64, a.shape)) for c, a in enumerate(constants)]
    temps = [tensor_param("V", (DType.INT64, data)), tensor_param("L", (DType.INT64, inferred))]
    outputs = [tensor_param("Y", (ctx.dtype(0), out))] + temps
    return TCKernel(definition(params, outputs, [check, last, fill]), (0, 1),
                    constants=tuple(constants))
