"""Ops that move elements: each output element is one input element, found by an
affine (or floor-divided) index. Explicit ranges size every output.

The helpers here write the TC text of every ``movement_*`` module.
"""

from __future__ import annotations

from collections.abc import Sequence

from polyfuse.lowering.ops import (INDEX, OpContext, TCKernel, access, broadcast_indices,
                                   broadcast_shape, onnx_axis, register, tensor_param)


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
    perm = [onnx_axis(int(p), rank) for p in ctx.attr("perm", tuple(reversed(range(rank))))]
    out = [shape[p] for p in perm]
    src = [""] * rank
    for d, p in enumerate(perm):
        src[p] = INDEX[d]
    return one_input(ctx, out, access("X", src))


@register("Concat")
def _concat(ctx: OpContext) -> TCKernel:
    positions = [i for i in range(len(ctx.types)) if ctx.has(i)]
    shapes = [ctx.shape(i) for i in positions]
    rank = len(shapes[0])
    axis = onnx_axis(int(ctx.attr("axis")), rank)
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
        return [int(s) for s in ctx.const(1, "split sizes")]
    if ctx.attr("split") is not None:
        return [int(s) for s in ctx.attr("split")]
    parts = int(ctx.attr("num_outputs", count))
    size = -(-dim // parts)  # ceil: the last part is the smaller one
    return [min(size, max(0, dim - k * size)) for k in range(parts)]


@register("Split")
def _split(ctx: OpContext) -> TCKernel:
    shape = ctx.shape(0)
    rank = len(shape)
    axis = onnx_axis(int(ctx.attr("axis", 0)), rank)
    sizes = _split_sizes(ctx, shape[axis])
    if sum(sizes) != shape[axis] or len(sizes) != len(ctx.node.outputs):
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
        return ([int(s) for s in ctx.attr("starts")], [int(e) for e in ctx.attr("ends")],
                None if axes is None else [int(a) for a in axes], None)

    def ints(i: int, what: str) -> list[int] | None:
        return [int(v) for v in ctx.const(i, what)] if ctx.has(i) else None
    return (ints(1, "starts") or [], ints(2, "ends") or [], ints(3, "axes"), ints(4, "steps"))


@register("Slice")
def _slice(ctx: OpContext) -> TCKernel:
    shape = ctx.shape(0)
    rank = len(shape)
    starts, ends, axes, steps = _slice_args(ctx)
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    out, src = list(shape), list(INDEX[:rank])
    for a, start, end, step in zip(axes, starts, ends, steps):
        a = onnx_axis(a, rank)
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
    target = [int(d) for d in ctx.const(1, "shape")]
    out = broadcast_shape(shape, target)
    return one_input(ctx, out, access("X", broadcast_indices(shape, out)))


@register("Tile")
def _tile(ctx: OpContext) -> TCKernel:
    shape = ctx.shape(0)
    repeats = [int(r) for r in ctx.const(1, "repeats")]
    if len(repeats) != len(shape) or any(r < 0 for r in repeats):
        raise ctx.unsupported(f"repeats {repeats} do not fit shape {shape}")
    out = [d * r for d, r in zip(shape, repeats)]
    src = [i if r == 1 else f"{i} % {d}" for i, d, r in zip(INDEX, shape, repeats)]
    return one_input(ctx, out, access("X", src))


def _blocks(ctx: OpContext) -> tuple[tuple[int, ...], int, str]:
    shape = ctx.shape(0)
    if len(shape) != 4:
        raise ctx.unsupported(f"expects a 4-d input (N, C, H, W), got shape {shape}")
    return shape, int(ctx.attr("blocksize")), str(ctx.attr("mode", "DCR"))


@register("DepthToSpace")
def _depth_to_space(ctx: OpContext) -> TCKernel:
    (n, c, h, w), b, mode = _blocks(ctx)
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
    out = [n, c * b * b, h // b, w // b]
    if mode == "DCR":   # output channel (bh * b + bw) * C + c
        channel, bh, bw = f"i1 % {c}", f"i1 / {c} / {b}", f"i1 / {c} % {b}"
    else:               # output channel c * b * b + bh * b + bw
        channel, bh, bw = f"i1 / {b * b}", f"i1 % {b * b} / {b}", f"i1 % {b}"
    return one_input(ctx, out, f"X(i0, {channel}, i2 * {b} + {bh}, i3 * {b} + {bw})")

