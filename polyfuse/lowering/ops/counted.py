"""Ops whose output sizes the data decides: NonZero, Compress and Unique.

Each lowers to one kernel writing its outputs at an upper bound of their size (every
element nonzero, every condition true, every entry distinct) and the number of entries
that hold results (:class:`~polyfuse.lowering.ops.Counted`); the plan ends there and the
runtime slices the outputs to that count before planning the rest of the graph for the
sizes produced.

A comprehension writes only at its own indices, so where an entry lands is counted, not
accumulated: an entry's position is the number of entries before it that are kept (a sum
over the others compared with it), and an output slot finds the one entry whose
position it is, as TopK ranks by comparison. The work is quadratic in the number of
entries compared, so it is limited to :data:`COUNT_MAX` of them.
"""

from __future__ import annotations

import math

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import INDEX, Counted, OpContext, TCKernel, access, register, tensor_param
from polyfuse.lowering.ops.movement import definition, parameter, statement

# entries a kernel compares pairwise (elements, condition entries, slices): beyond it the
# quadratic work (and Unique's pair tables) would take too long
COUNT_MAX = 1 << 14
# Unique along an axis compares every pair of slices element by element (and keeps a
# table over the pairs): at most this many element comparisons
PAIRS_MAX = 1 << 24


def check_count(ctx: OpContext, entries: int, what: str) -> None:
    if entries > COUNT_MAX:
        raise ctx.unsupported(f"{entries} {what}; polyfuse counts at most {COUNT_MAX} "
                              "(its kernels compare every pair of entries)")


def flat_read(name: str, shape: tuple[int, ...], flat: str) -> str:
    """``name`` read at row-major position ``flat`` (an expression) of ``shape``."""
    indices = []
    for k, d in enumerate(shape):
        stride = math.prod(shape[k + 1:])
        indices.append(f"({flat}) / {stride} % {d}" if stride > 1 else f"({flat}) % {d}")
    return access(name, indices)


def flat_index(shape: tuple[int, ...], names: list[str]) -> str:
    """The row-major position of element ``names`` of ``shape``."""
    terms = [f"{n} * {math.prod(shape[k + 1:])}" for k, n in enumerate(names)]
    return " + ".join(terms) if terms else "0"


def count_statement(lines: list[str], kept: str, extents: list[str]) -> str:
    """The statement of ``N``, how many entries are ``kept`` (a condition over the ranges
    ``extents``)."""
    where = ", ".join(["z in 0:1", *extents])
    lines.append(f"N(z) +=! ({kept}) ? int64(1) : int64(0) where {where}")
    return tensor_param("N", (DType.INT64, [1]))


@register("NonZero")
def _non_zero(ctx: OpContext) -> Counted:
    shape = ctx.shape(0)
    rank, size = len(shape), math.prod(shape)
    check_count(ctx, size, "elements")
    a, b = INDEX[:rank], [f"j{k}" for k in range(rank)]
    zero = "bool(0)" if ctx.dtype(0).is_bool else f"{ctx.dtype(0)}(0)"
    nonzero = lambda idx: f"{access('X', idx)} != {zero}"   # noqa: E731
    lines = [
        # P: how many nonzero elements come before each element in row-major order
        statement("P", a, f"({nonzero(b)} && {flat_index(shape, b)} < {flat_index(shape, a)}) ? 1 : 0",
                  shape, [f"{j} in 0:{d}" for j, d in zip(b, shape)], "+=!"),
        # S: the row-major position of the m-th nonzero element
        statement("S", ["m"], f"({nonzero(a)} && P({', '.join(a)}) == m) ? int64({flat_index(shape, a)}) "
                  ": int64(0)", [size], [f"{i} in 0:{d}" for i, d in zip(a, shape)], "+=!"),
    ]
    coords = " : ".join(f"k == {k} ? S(m) / {math.prod(shape[k + 1:])} % {d}"
                        for k, d in enumerate(shape[:-1])) if rank > 1 else ""
    last = f"S(m) % {shape[-1]}" if rank else "int64(0)"
    lines.append(statement("Y", ["k", "m"], f"{coords} : {last}" if coords else last, [rank, size]))
    count = count_statement(lines, nonzero(a), [f"{i} in 0:{d}" for i, d in zip(a, shape)])
    outputs = [tensor_param("Y", (DType.INT64, [rank, size])), count,
               tensor_param("P", (DType.INT32, shape)), tensor_param("S", (DType.INT64, [size]))]
    return Counted(TCKernel(definition([parameter(ctx, 0, "X")], outputs, lines), (0,)), ((0, 1),))


@register("Compress")
def _compress(ctx: OpContext) -> Counted:
    shape = ctx.shape(0)
    ctx.rank(1, 1)
    axis = ctx.attr("axis")
    if axis is not None:
        axis = ctx.axis(axis, len(shape))
    extent = shape[axis] if axis is not None else math.prod(shape)
    length = ctx.shape(1)[0]
    if length > extent:
        raise ctx.malformed(f"its condition has {length} entries, more than the {extent} "
                            f"{'slices along axis ' + str(axis) if axis is not None else 'elements'}")
    check_count(ctx, length, "condition entries")
    lines = [
        # P: how many kept entries come before entry i; S: the entry kept m-th
        f"P(i) +=! (C(j) && j < i) ? 1 : 0 where i in 0:{length}, j in 0:{length}",
        f"S(m) +=! (C(i) && P(i) == m) ? int64(i) : int64(0) where m in 0:{length}, i in 0:{length}",
    ]
    if axis is None:
        out = [length]
        lines.append(statement("Y", ["m"], flat_read("X", shape, "S(m)"), out))
    else:
        out = list(shape)
        out[axis] = length
        idx = list(INDEX[:len(shape)])
        src = list(idx)
        src[axis] = f"S({idx[axis]})"
        lines.append(statement("Y", idx, access("X", src), out))
    count = count_statement(lines, "C(i)", [f"i in 0:{length}"])
    params = [parameter(ctx, 0, "X"), parameter(ctx, 1, "C")]
    outputs = [tensor_param("Y", (ctx.dtype(0), out)), count,
               tensor_param("P", (DType.INT32, [length])), tensor_param("S", (DType.INT64, [length]))]
    return Counted(TCKernel(definition(params, outputs, lines), (0, 1)),
                   ((0, 0 if axis is None else axis),))
