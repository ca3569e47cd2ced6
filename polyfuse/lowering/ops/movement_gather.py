"""Gathers: elements picked by an index tensor read at run time (indirect reads,
bounds-checked by the kernel). Negative indices count from the end, so every index
read is normalized in place: ``I < 0 ? I + n : I``."""

from __future__ import annotations

from polyfuse.lowering.ops import INDEX, OpContext, TCKernel, access, register, tensor_param
from polyfuse.lowering.ops.movement import definition, parameter, statement


def normalized(read: str, extent: int) -> str:
    """An index read from a tensor, negative values wrapped once by ``extent``."""
    return f"({read} < 0 ? {read} + {extent} : {read})"


def _kernel(ctx: OpContext, out: list[int], rhs: str) -> TCKernel:
    params = [parameter(ctx, 0, "X"), parameter(ctx, 1, "I")]
    st = statement("Y", INDEX[:len(out)], rhs, out)
    return TCKernel(definition(params, [tensor_param("Y", (ctx.dtype(0), out))], [st]), (0, 1))


@register("Gather")
def _gather(ctx: OpContext) -> TCKernel:
    data, ind = ctx.shape(0), ctx.shape(1)
    axis = ctx.axis(ctx.attr("axis", 0), len(data))
    q = len(ind)
    out = list(data[:axis]) + list(ind) + list(data[axis + 1:])
    read = access("I", INDEX[axis:axis + q])
    src = list(INDEX[:axis]) + [normalized(read, data[axis])] + \
        list(INDEX[axis + q:axis + q + len(data) - axis - 1])
    return _kernel(ctx, out, access("X", src))


@register("GatherElements")
def _gather_elements(ctx: OpContext) -> TCKernel:
    data, ind = ctx.shape(0), ctx.shape(1)
    rank = len(data)
    axis = ctx.axis(ctx.attr("axis", 0), rank)
    if len(ind) != rank or any(i > d for k, (i, d) in enumerate(zip(ind, data)) if k != axis):
        raise ctx.malformed(f"the indices have shape {ind} and the data {data}; they must have "
                            f"the same rank and no larger size outside axis {axis}")
    src = list(INDEX[:rank])
    src[axis] = normalized(access("I", INDEX[:rank]), data[axis])
    return _kernel(ctx, list(ind), access("X", src))


@register("GatherND")
def _gather_nd(ctx: OpContext) -> TCKernel:
    data, ind = ctx.shape(0), ctx.shape(1)
    batch = ctx.ints(ctx.attr("batch_dims", 0), "batch_dims", 1, least=0)[0]
    if not ind or batch >= min(len(data), len(ind)) or not 1 <= ind[-1] <= len(data) - batch \
            or ind[:batch] != data[:batch]:
        raise ctx.malformed(f"indices of shape {ind} cannot index data of shape {data} with "
                            f"batch_dims {batch}: the indices need rank >= 1 and batch_dims < "
                            "both ranks, the batch dimensions must agree, and the last index "
                            "dimension must be between 1 and the data's rank minus batch_dims")
    depth = ind[-1]
    lead = list(INDEX[:len(ind) - 1])      # indices of the index tuples
    rest = list(INDEX[len(lead):len(lead) + len(data) - batch - depth])
    out = list(ind[:-1]) + list(data[batch + depth:])
    picked = [normalized(access("I", lead + [str(c)]), data[batch + c]) for c in range(depth)]
    return _kernel(ctx, out, access("X", lead[:batch] + picked + rest))


@register("ReverseSequence")
def _reverse_sequence(ctx: OpContext) -> TCKernel:
    """The first ``L(b)`` steps of each batch's sequence reversed; a length past the time
    axis reads outside the input, which the kernel catches."""
    data = ctx.shape(0)
    rank = ctx.rank(0, least=2)
    batch = ctx.axis(ctx.attr("batch_axis", 1), rank, "batch_axis")
    time = ctx.axis(ctx.attr("time_axis", 0), rank, "time_axis")
    if {batch, time} != {0, 1} or ctx.shape(1) != (data[batch],):
        raise ctx.malformed(f"batch_axis {batch}, time_axis {time} and sequence_lens of shape "
                            f"{ctx.shape(1)}: the axes must be 0 and 1, one each, and the "
                            f"lengths one per batch ({data[batch]},)")
    length = access("I", [INDEX[batch]])
    src = list(INDEX[:rank])
    src[time] = f"{length} - 1 - {INDEX[time]}"
    rhs = f"{INDEX[time]} < {length} ? {access('X', src)} : {access('X', INDEX[:rank])}"
    return _kernel(ctx, list(data), rhs)
