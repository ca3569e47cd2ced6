"""Unroll-and-jam: a loop-IR pass for register blocking.

``for i in lo:hi { for j { S(i, j) } }`` with a constant trip count divisible by ``f``
becomes ``for i in lo:hi step f { for j { S(i, j); S(i + 1, j); ...; S(i + f - 1, j) } }``
(a trip count of 2 to ``f - 1``, the rows a partial block leaves, is jammed whole):
the copies share the loads that do not depend on ``i`` (a row of B in a matmul) and,
after SIMD, keep ``f`` rows of accumulators in registers. The scheduler only asks for
it on the point loops of a permutable (tiled) band, where interchanging the
iterations of ``i`` and ``j`` is legal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from polyfuse.ir.comprehension import Binary, BinaryOp, Expr, IndexVar, Literal, walk
from polyfuse.ir.loops import For, If, LoopKernel, Stmt, map_body_exprs, rewrite
from polyfuse.ir.types import DType


def unroll_and_jam(kernel: LoopKernel, factor: int) -> LoopKernel:
    """Jam ``factor`` copies of each loop right around an innermost loop, where its trip
    count allows; other loops are left alone."""
    if factor <= 1:
        return kernel
    return rewrite(kernel, pre=lambda s: _jam(s, factor) if isinstance(s, For) else None)


def _constant(e: Expr) -> int | None:
    return int(e.value) if isinstance(e, Literal) else None


def _jam(outer: For, factor: int) -> For | None:
    if len(outer.body) != 1 or not isinstance(outer.body[0], For):
        return None
    inner = outer.body[0]
    if any(isinstance(s, (For, If)) for s in inner.body):
        return None  # only the loop right around the innermost one
    lo, hi = _constant(outer.lo), _constant(outer.hi)
    if lo is None or hi is None or hi <= lo:
        return None
    if 2 <= (hi - lo) // outer.step < factor and (hi - lo) % outer.step == 0:
        factor = (hi - lo) // outer.step   # a partial block (the rows a tile leaves): all of them
    if (hi - lo) % (outer.step * factor):
        return None
    if any(isinstance(n, IndexVar) and n.name == outer.var for e in (inner.lo, inner.hi)
           for n in walk(e)):
        return None
    copies: list[Stmt] = []
    for u in range(factor):
        shifted = Binary(BinaryOp.ADD, IndexVar(outer.var), Literal(u * outer.step, DType.INT64),
                         DType.INT64) if u else IndexVar(outer.var)
        copies += map_body_exprs(inner.body, _substitution(outer.var, shifted))
    return replace(outer, step=outer.step * factor, body=(replace(inner, body=tuple(copies)),))


def _substitution(var: str, value: Expr) -> Callable[[Expr], Expr]:
    return lambda e: value if isinstance(e, IndexVar) and e.name == var else e
