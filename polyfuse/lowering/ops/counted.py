"""Ops whose output sizes the data decides: NonZero, Compress and Unique.

Each lowers to one kernel writing its outputs at an upper bound of their size (every
element nonzero, every condition true, every entry distinct) and the number of entries
that hold results (:class:`~polyfuse.lowering.ops.Counted`); the plan ends there and the
runtime slices the outputs to that count before planning the rest of the graph for the
sizes produced.

A comprehension writes only at its own indices, so where an entry lands is counted, not
accumulated: an entry's position is the number of entries before it that are kept (a sum
over the others compared with it), and an output slot finds the one entry whose
position it is, as TopK ranks by comparison. NonZero and Compress count in blocks of
about the square root of the entries (:func:`positions`: counts per block, then within
a block), so their work grows as ``n ** 1.5``, up to :data:`POSITIONS_MAX` entries;
Unique compares every pair of entries, up to :data:`COUNT_MAX`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import INDEX, Counted, OpContext, TCKernel, access, register, tensor_param
from polyfuse.lowering.ops.movement import definition, parameter, statement

# entries a kernel compares pairwise (Unique's elements or slices, NonMaxSuppression's
# boxes): beyond it the quadratic work would take too long
COUNT_MAX = 1 << 14
# entries NonZero and Compress place by counting in blocks
POSITIONS_MAX = 1 << 16
# Unique along an axis compares every pair of slices element by element (and keeps a
# table over the pairs): at most this many element comparisons
PAIRS_MAX = 1 << 24


def check_count(ctx: OpContext, entries: int, what: str, limit: int = COUNT_MAX) -> None:
    if entries > limit:
        raise ctx.unsupported(f"{entries} {what}; polyfuse counts at most {limit} here "
                              "(its kernels compare entries with each other)")


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


def positions(kept: Callable[[str], str], n: int) -> tuple[list[str], list[str]]:
    """(statements, declarations) of ``S(m)``, the position of the ``m``-th of ``n``
    entries for which ``kept`` (the condition at a flat position) holds (0 past
    the last), and ``N``, how many are kept. Entries are counted in ``B`` blocks of
    ``s``: ``W(k, t)`` flags the kept ones, ``E`` counts each block, ``O`` the kept
    entries in the blocks before it, ``R`` those before ``t`` in its block; output slot
    ``m`` finds its block ``A(m)`` (the blocks ending at or before it) and looks in that
    block only."""
    s = max(1, math.isqrt(max(n - 1, 0)) + 1)
    B = max(1, -(-n // s))
    q = f"(k * {s} + t)"
    lines = [
        f"W(k, t) = ({q} < {n} && {kept(q)}) ? 1 : 0 where k in 0:{B}, t in 0:{s}",
        f"E(k) +=! W(k, t) where k in 0:{B}, t in 0:{s}",
        f"O(k) +=! (p < k) ? E(p) : 0 where k in 0:{B}, p in 0:{B}",
        f"R(k, t) +=! (u < t) ? W(k, u) : 0 where k in 0:{B}, t in 0:{s}, u in 0:{s}",
        f"A(m) +=! (O(k) + E(k) <= m) ? 1 : 0 where m in 0:{n}, k in 0:{B}",
        f"S(m) +=! (W(c, t) == 1 && O(c) + R(c, t) == m) ? int64(c * {s} + t) : int64(0) "
        f"where m in 0:{n}, t in 0:{s}, c = min(A(m), {B - 1})",
        f"N(z) +=! int64(W(k, t)) where z in 0:1, k in 0:{B}, t in 0:{s}",
    ]
    decls = [tensor_param("N", (DType.INT64, [1])), tensor_param("S", (DType.INT64, [n]))] + \
        [tensor_param(t, (DType.INT32, size)) for t, size in
         (("W", [B, s]), ("E", [B]), ("O", [B]), ("R", [B, s]), ("A", [n]))]
    return lines, decls


@register("NonZero")
def _non_zero(ctx: OpContext) -> Counted:
    shape = ctx.shape(0)
    rank, size = len(shape), math.prod(shape)
    check_count(ctx, size, "elements", POSITIONS_MAX)
    zero = "bool(0)" if ctx.dtype(0).is_bool else f"{ctx.dtype(0)}(0)"
    lines, decls = positions(lambda q: f"{flat_read('X', shape, q)} != {zero}", size)
    coords = " : ".join(f"k == {k} ? S(m) / {math.prod(shape[k + 1:])} % {d}"
                        for k, d in enumerate(shape[:-1])) if rank > 1 else ""
    last = f"S(m) % {shape[-1]}" if rank else "int64(0)"
    lines.append(statement("Y", ["k", "m"], f"{coords} : {last}" if coords else last, [rank, size]))
    outputs = [tensor_param("Y", (DType.INT64, [rank, size])), *decls]
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
    check_count(ctx, length, "condition entries", POSITIONS_MAX)
    lines, decls = positions(lambda q: f"C({q} % {max(length, 1)})", length)
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
    params = [parameter(ctx, 0, "X"), parameter(ctx, 1, "C")]
    outputs = [tensor_param("Y", (ctx.dtype(0), out)), *decls]
    return Counted(TCKernel(definition(params, outputs, lines), (0, 1)),
                   ((0, 0 if axis is None else axis),))
