"""Ops that move elements: each output element is one input element, found by an
affine (or floor-divided) index. Explicit ranges size every output.

The helpers here write the TC text of every ``movement_*`` module.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from polyfuse.lowering.ops import (INDEX, OpContext, TCKernel, access, broadcast_indices,
                                   broadcast_shape, register, tensor_param)


def definition(params: Sequence[str], outputs: Sequence[str], statements: Sequence[str]) -> str:
    """The text of one TC def ``k``; ``params``/``outputs`` are declarations, one
    statement a line."""
    body = "".join(f"  {s}\n" for s in statements)
    return f"def k({', '.join(params)}) -> ({', '.join(outputs)}) {{\n{body}}}\n"


def parameter(ctx: OpContext, i: int, name: str) -> str:
    """The TC declaration of node input ``i`` as parameter ``name``."""
    return tensor_param(name, (ctx.dtype(i), ctx.shape(i)))


def statement(name: str, indices: Sequence[str], rhs: str, extents: Sequence[int | str],
              clauses: Sequence[str] = (), op: str = "=") -> str:
    """``name(indices) op rhs`` over the full ``extents`` (ints, or ``lo:hi`` strings);
    ``clauses`` adds where clauses (lets, reduction ranges)."""
    ranges = [f"{i} in {e if isinstance(e, str) else f'0:{e}'}" for i, e in zip(indices, extents)]
    where = ", ".join(ranges + list(clauses))
    return f"{access(name, indices)} {op} {rhs}{' where ' + where if where else ''}"


def offset(index: str, start: int, step: int = 1) -> str:
    """``start + step * index``, written the short way."""
    term = index if step == 1 else f"{abs(step)} * {index}"
    if step < 0:
        return f"{start} - {term}"
    return term if start == 0 else f"{term} + {start}" if start > 0 else f"{term} - {-start}"


def one_input(ctx: OpContext, out: Sequence[int], rhs: str,
              clauses: Sequence[str] = ()) -> TCKernel:
    """A kernel reading input 0 as ``X`` and setting output ``Y`` (of shape ``out``, the
    type of ``X``) to ``rhs`` at every index."""
    st = statement("Y", INDEX[:len(out)], rhs, out, clauses)
    return TCKernel(definition([parameter(ctx, 0, "X")],
                               [tensor_param("Y", (ctx.dtype(0), out))], [st]), (0,))


@register("Transpose")
def _transpose(ctx: OpContext) -> TCKernel:
    shape = ctx.shape(0)
    rank = len(shape)
    perm = ctx.axes(ctx.attr("perm", tuple(reversed(range(rank)))), rank, "perm")
    if len(perm) != rank:
        raise ctx.malformed(f"perm {perm} must list each of the {rank} axes of shape {shape} once")
    out = [shape[p] for p in perm]
    src = [""] * rank
    for d, p in enumerate(perm):
        src[p] = INDEX[d]
    return one_input(ctx, out, access("X", src))


@register("Concat")
def _concat(ctx: OpContext) -> TCKernel:
    positions = [i for i in range(len(ctx.types)) if ctx.has(i)]
    if not positions:
        raise ctx.malformed("it has no inputs; give it one or more")
    shapes = [ctx.shape(i) for i in positions]
    rank = len(shapes[0])
    axis = ctx.axis(ctx.attr("axis"), rank)
    for i, s in zip(positions, shapes):
        if len(s) != rank or any(a != b for d, (a, b) in enumerate(zip(s, shapes[0])) if d != axis):
            raise ctx.malformed(f"input {i} has shape {s} but input {positions[0]} has shape "
                                f"{shapes[0]}; all must agree except along axis {axis}")
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    # inputs empty along the axis contribute nothing (keep one so the def has a statement)
    used = [k for k, s in enumerate(shapes) if s[axis] > 0] or [0]
    params, lines, start = [], [], 0
    for n, k in enumerate(used):
        s = shapes[k]
        name = f"X{n}"
        params.append(parameter(ctx, positions[k], name))
        src = list(INDEX[:rank])
        src[axis] = offset(INDEX[axis], -start)
        extents: list[int | str] = list(s)
        extents[axis] = f"{start}:{start + s[axis]}"
        lines.append(statement("Y", INDEX[:rank], access(name, src), extents))
        start += s[axis]
    return TCKernel(definition(params, [tensor_param("Y", (ctx.dtype(positions[0]), out))], lines),
                    tuple(positions[k] for k in used))


def _split_sizes(ctx: OpContext, dim: int) -> list[int]:
    count = len(ctx.node.outputs)
    if ctx.has(1):
        return ctx.ints(ctx.const(1, "split sizes"), "split sizes")
    if ctx.attr("split") is not None:
        return ctx.ints(ctx.attr("split"), "split")
    parts = int(ctx.attr("num_outputs", count))
    if parts < 1:
        raise ctx.malformed(f"num_outputs {parts} must be at least 1")
    size = -(-dim // parts)  # ceil: the last part is the smaller one
    return [min(size, max(0, dim - k * size)) for k in range(parts)]


@register("Split")
def _split(ctx: OpContext) -> TCKernel:
    shape = ctx.shape(0)
    rank = len(shape)
    axis = ctx.axis(ctx.attr("axis", 0), rank)
    sizes = _split_sizes(ctx, shape[axis])
    if any(s < 0 for s in sizes) or sum(sizes) != shape[axis] or len(sizes) != len(ctx.node.outputs):
        raise ctx.unsupported(f"split sizes {sizes} do not cut dimension {axis} of {shape} "
                              f"into {len(ctx.node.outputs)} outputs")
    outputs, lines, start = [], [], 0
    for k, size in enumerate(sizes):
        out = list(shape)
        out[axis] = size
        outputs.append(tensor_param(f"Y{k}", (ctx.dtype(0), out)))
        src = list(INDEX[:rank])
        src[axis] = offset(INDEX[axis], start)
        lines.append(statement(f"Y{k}", INDEX[:rank], access("X", src), out))
        start += size
    return TCKernel(definition([parameter(ctx, 0, "X")], outputs, lines),
                    (0,), tuple(range(len(sizes))))


def _slice_args(ctx: OpContext) -> tuple[list[int], list[int], list[int] | None, list[int] | None]:
    if ctx.opset < 10:  # Slice-1: attributes, no steps
        axes = ctx.attr("axes")
        return (ctx.ints(ctx.attr("starts"), "starts"), ctx.ints(ctx.attr("ends"), "ends"),
                None if axes is None else ctx.ints(axes, "axes"), None)

    def ints(i: int, what: str) -> list[int] | None:
        return ctx.ints(ctx.const(i, what), what) if ctx.has(i) else None
    return (ints(1, "starts") or [], ints(2, "ends") or [], ints(3, "axes"), ints(4, "steps"))


@register("Slice")
def _slice(ctx: OpContext) -> TCKernel:
    shape = ctx.shape(0)
    rank = len(shape)
    starts, ends, axes, steps = _slice_args(ctx)
    axes = ctx.axes(axes, rank) if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps) or len(starts) > rank:
        raise ctx.malformed(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} must "
                            f"have one entry per sliced axis (at most {rank}, the input's rank)")
    out, src = list(shape), list(INDEX[:rank])
    for a, start, end, step in zip(axes, starts, ends, steps):
        if step == 0:
            raise ctx.unsupported("a slice step is 0")
        # Python's slice clamps exactly as ONNX specifies, negative steps included
        first, stop, step = slice(start, end, step).indices(shape[a])
        out[a] = len(range(first, stop, step))
        src[a] = offset(INDEX[a], first, step)
    return one_input(ctx, out, access("X", src))


@register("Expand")
def _expand(ctx: OpContext) -> TCKernel:
    shape = ctx.shape(0)
    target = ctx.ints(ctx.const(1, "shape"), "the shape", least=0)
    if np.asarray(ctx.values[1]).ndim != 1:
        raise ctx.malformed("the shape must be a 1-d tensor of sizes")
    out = broadcast_shape(shape, target)
    return one_input(ctx, out, access("X", broadcast_indices(shape, out)))


@register("Tile")
def _tile(ctx: OpContext) -> TCKernel:
    shape = ctx.shape(0)
    repeats = ctx.ints(ctx.const(1, "repeats"), "repeats", len(shape), least=0)
    out = [d * r for d, r in zip(shape, repeats)]
    src = [i if r == 1 else f"{i} % {d}" for i, d, r in zip(INDEX, shape, repeats)]
    return one_input(ctx, out, access("X", src))


def _blocks(ctx: OpContext) -> tuple[tuple[int, ...], int, str]:
    shape = ctx.shape(0)
    if len(shape) != 4:
        raise ctx.unsupported(f"expects a 4-d input (N, C, H, W), got shape {shape}")
    block, mode = ctx.ints(ctx.attr("blocksize"), "blocksize", 1, least=1)[0], str(ctx.attr("mode", "DCR"))
    if mode not in ("DCR", "CRD"):
        raise ctx.malformed(f"mode '{mode}' must be DCR or CRD")
    return shape, block, mode


@register("DepthToSpace")
def _depth_to_space(ctx: OpContext) -> TCKernel:
    (n, c, h, w), b, mode = _blocks(ctx)
    if c % (b * b):
        raise ctx.malformed(f"{c} channels do not divide by blocksize² = {b * b}")
    depth = c // (b * b)
    out = [n, depth, h * b, w * b]
    if mode == "DCR":
        channel = f"(i2 % {b}) * {b * depth} + (i3 % {b}) * {depth} + i1"
    else:
        channel = f"i1 * {b * b} + (i2 % {b}) * {b} + i3 % {b}"
    return one_input(ctx, out, f"X(i0, {channel}, i2 / {b}, i3 / {b})")


@register("SpaceToDepth")
def _space_to_depth(ctx: OpContext) -> TCKernel:
    (n, c, h, w), b, mode = _blocks(ctx)
    if h % b or w % b:
        raise ctx.malformed(f"height {h} and width {w} must divide by blocksize {b}")
    out = [n, c * b * b, h // b, w // b]
    if mode == "DCR":   # output channel (bh * b + bw) * C + c
        channel, bh, bw = f"i1 % {c}", f"i1 / {c} / {b}", f"i1 / {c} % {b}"
    else:               # output channel c * b * b + bh * b + bw
        channel, bh, bw = f"i1 / {b * b}", f"i1 % {b * b} / {b}", f"i1 % {b}"
    return one_input(ctx, out, f"X(i0, {channel}, i2 * {b} + {bh}, i3 * {b} + {bw})")

