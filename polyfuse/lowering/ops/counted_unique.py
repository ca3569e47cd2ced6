"""Unique: the distinct elements (or slices along an axis) of a tensor, sorted or in the
order they first occur, with where each first occurs, which distinct entry each entry
is, and how often each occurs.

Entries (elements of the flattened tensor, or slices along ``axis``) are compared
pairwise. Along an axis a table ``D(i, j)`` holds the first position where slices ``i``
and ``j`` differ (the slice size when they are equal), which decides both equality and
the lexicographic order numpy sorts slices in. An entry's first occurrence ``F`` is the
least equal entry; an entry is distinct where it is its own first occurrence; its
distinct rank ``R`` counts the distinct entries before it (smaller for ``sorted=1``,
first occurring earlier for ``sorted=0``), and output slot ``m`` finds the distinct
entry of rank ``m``. NaNs are equal to each other and sort last, as in numpy.
"""

from __future__ import annotations

import math

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import INDEX, Counted, OpContext, TCKernel, access, register, tensor_param
from polyfuse.lowering.ops.counted import PAIRS_MAX, check_count, count_statement, flat_read
from polyfuse.lowering.ops.movement import definition, parameter, statement


def _same(a: str, b: str, dt: DType) -> str:
    return f"({a} == {b} || ({a} != {a} && {b} != {b}))" if dt.is_float else f"{a} == {b}"


def _less(a: str, b: str, dt: DType) -> str:
    return f"({a} < {b} || ({a} == {a} && {b} != {b}))" if dt.is_float else f"{a} < {b}"


class _Entries:
    """How the kernel reads entry ``i`` of X: an element of the flattened tensor, or the
    slice along ``axis`` (its element at the other indices ``others``)."""

    def __init__(self, shape: tuple[int, ...], axis: int | None) -> None:
        self.shape, self.axis = shape, axis
        self.count = math.prod(shape) if axis is None else shape[axis]
        self.rest = [] if axis is None else [d for k, d in enumerate(shape) if k != axis]
        self.others = [f"o{k}" for k in range(len(self.rest))]
        self.slice = math.prod(self.rest)

    def read(self, i: str, others: list[str] | None = None) -> str:
        if self.axis is None:
            return flat_read("X", self.shape, i)
        o = list(self.others if others is None else others)
        return access("X", o[:self.axis] + [i] + o[self.axis:])

    def ranges(self) -> list[str]:
        return [f"{o} in 0:{d}" for o, d in zip(self.others, self.rest)]

    def at(self, position: str) -> list[str]:
        """The other indices of row-major position ``position`` within a slice."""
        return [f"({position}) / {math.prod(self.rest[k + 1:])} % {d}" for k, d in enumerate(self.rest)]


def _order(e: _Entries, dt: DType, ordered: bool) -> tuple[list[str], list[str], str, str]:
    """(statements, temporaries, same(i, j), before(j, i)): the pair table along an axis,
    entry equality, and whether distinct entry ``j`` comes before entry ``i``."""
    L = e.count
    pairs = f"i in 0:{L}, j in 0:{L}"
    if e.axis is None:
        same = _same(e.read("i"), e.read("j"), dt)
        before = _less(e.read("j"), e.read("i"), dt) if ordered else "j < F(i)"
        return [], [], same, before
    # D(i, j): the first position where slices i and j differ, the slice size if nowhere
    flat = " + ".join(f"{o} * {math.prod(e.rest[k + 1:])}" for k, o in enumerate(e.others)) or "0"
    lines = [f"D(i, j) min=! {_same(e.read('i'), e.read('j'), dt)} ? int64({e.slice}) : int64({flat}) "
             f"where {', '.join([pairs, *e.ranges()])}"]
    diff = e.at("D(j, i)")
    before = f"(D(j, i) < {e.slice} && {_less(e.read('j', diff), e.read('i', diff), dt)})" if ordered \
        else "j < F(i)"
    return lines, [tensor_param("D", (DType.INT64, [L, L]))], f"D(i, j) == {e.slice}", before


@register("Unique")
def _unique(ctx: OpContext) -> Counted:
    shape, dt = ctx.shape(0), ctx.dtype(0)
    axis = ctx.attr("axis")
    e = _Entries(shape, None if axis is None else ctx.axis(axis, len(shape)))
    L = e.count
    check_count(ctx, L, "entries")
    if e.axis is not None and L * L * e.slice > PAIRS_MAX:
        raise ctx.unsupported(f"{L} slices of {e.slice} elements along axis {e.axis}; polyfuse "
                              f"compares at most {PAIRS_MAX} pairs of elements")
    lines, temps, same, before = _order(e, dt, ctx.flag("sorted", 1))
    pairs = f"i in 0:{L}, j in 0:{L}"
    lines += [
        f"F(i) min=! {same} ? int64(j) : int64({L}) where {pairs}",
        f"K(i) +=! {same} ? int64(1) : int64(0) where {pairs}",
        f"R(i) +=! (F(j) == j && {before}) ? int64(1) : int64(0) where {pairs}",
        f"I(m) +=! (F(j) == j && R(j) == m) ? int64(j) : int64(0) where m in 0:{L}, j in 0:{L}",
        f"V(i) = R(i) where i in 0:{L}",
        f"C(m) = K(I(m)) where m in 0:{L}",
    ]
    if e.axis is None:
        y_shape = [L]
        lines.append(statement("Y", ["m"], e.read("I(m)"), y_shape))
    else:
        y_shape = list(shape)
        idx = list(INDEX[:len(shape)])
        others = idx[:e.axis] + idx[e.axis + 1:]
        lines.append(statement("Y", idx, e.read(f"I({idx[e.axis]})", others), y_shape))
    count = count_statement(lines, "F(j) == j", [f"j in 0:{L}"])
    results = [tensor_param("Y", (dt, y_shape)), tensor_param("I", (DType.INT64, [L])),
               tensor_param("V", (DType.INT64, [L])), tensor_param("C", (DType.INT64, [L]))]
    given = range(min(len(ctx.node.outputs), 4))
    outputs = [results[k] for k in given] + [count] + [r for k, r in enumerate(results) if k not in given]
    outputs += temps + [tensor_param(n, (DType.INT64, [L])) for n in ("F", "K", "R")]
    trims = tuple((k, (e.axis or 0) if k == 0 else 0) for k in given if k != 2)
    return Counted(TCKernel(definition([parameter(ctx, 0, "X")], outputs, lines), (0,), tuple(given)), trims)
