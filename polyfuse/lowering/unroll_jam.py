"""Unroll-and-jam: a loop-IR pass for register blocking.

``for i in lo:hi { for j { S(i, j) } }`` with a constant trip count divisible by ``f``
becomes ``for i in lo:hi step f { for j { S(i, j); S(i + 1, j); ...; S(i + f - 1, j) } }``:
the copies share the loads that do not depend on ``i`` (a row of B in a matmul) and,
after SIMD, keep ``f`` rows of accumulators in registers. The scheduler only asks for
it on the point loops of a permutable (tiled) band, where interchanging the
iterations of ``i`` and ``j`` is legal.
"""

from __future__ import annotations

from dataclasses import replace

from polyfuse.ir.comprehension import Binary, BinaryOp, Expr, IndexVar, Literal, map_expr, walk
from polyfuse.ir.loops import Assign, For, If, LoopKernel, Stmt, Store
from polyfuse.ir.types import DType


def unroll_and_jam(kernel: LoopKernel, factor: int) -> LoopKernel:
    if factor <= 1:
        return kernel
    return replace(kernel, body=_visit(kernel.body, factor))


def _visit(body: tuple[Stmt, ...], factor: int) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, For):
            jammed = _jam(s, factor)
            s = jammed if jammed is not None else replace(s, body=_visit(s.body, factor))
        elif isinstance(s, If):
            s = replace(s, then=_visit(s.then, factor), other=_visit(s.other, factor))
        out.append(s)
    return tuple(out)


def _constant(e: Expr) -> int | None:
    return int(e.value) if isinstance(e, Literal) else None


def _jam(outer: For, factor: int) -> For | None:
    if len(outer.body) != 1 or not isinstance(outer.body[0], For):
        return None
    inner = outer.body[0]
    if any(isinstance(s, (For, If)) for s in inner.body):
        return None  # only the loop right around the innermost one
    lo, hi = _constant(outer.lo), _constant(outer.hi)
    if lo is None or hi is None or (hi - lo) % (outer.step * factor) or hi <= lo:
        return None
    if any(isinstance(n, IndexVar) and n.name == outer.var for e in (inner.lo, inner.hi)
           for n in walk(e)):
        return None
    copies: list[Stmt] = []
    for u in range(factor):
        shifted = Binary(BinaryOp.ADD, IndexVar(outer.var), Literal(u * outer.step, DType.INT64),
                         DType.INT64) if u else IndexVar(outer.var)
        copies += [_substitute(s, outer.var, shifted) for s in inner.body]
    return replace(outer, step=outer.step * factor, body=(replace(inner, body=tuple(copies)),))


def _substitute(s: Stmt, var: str, value: Expr) -> Stmt:
    def fn(e: Expr) -> Expr:
        return value if isinstance(e, IndexVar) and e.name == var else e

    if isinstance(s, Store):
        return replace(s, indices=tuple(map_expr(i, fn) for i in s.indices), value=map_expr(s.value, fn))
    if isinstance(s, Assign):
        return replace(s, value=map_expr(s.value, fn))
    raise TypeError(f"cannot jam {type(s).__name__}")
