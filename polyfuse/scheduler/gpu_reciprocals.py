"""One reciprocal per row: a division by what a loop does not change becomes a product.

CUDA's ``x / d`` in float is IEEE division, a sequence of a dozen instructions; softmax's
last statement divides every element of a row by the row's sum. Where a loop's body
divides by a float ``d`` that no iteration of the loop changes (no variable of the loop
or of a loop inside it, no local the loop sets, no buffer it stores), the loop is
preceded by ``let pf_rcp = 1 / d`` and the quotients become ``x * pf_rcp``: one division
per row and a multiply per element. The quotient may then differ from the division's
by an ulp or two (and it is infinite where ``1 / d`` overflows, ``|d| < 2^-126``), as
with CUDA's ``-prec-div=false``. A divisor that reads memory under a condition inside
the loop stays (it might read outside its buffer where the condition is false); one
that reads memory outside any is read before the loop only where the loop runs.

The ``let`` goes where the loop stands: in uniform code every thread computes it (the
barriers, placed after this pass, order it after the store of ``d``), in a thread's own
code that thread.
"""

from __future__ import annotations

from dataclasses import replace

from polyfuse.ir.comprehension import Binary, BinaryOp, Expr, IndexVar, Literal, LocalRef, Read, walk
from polyfuse.ir.gpu import GpuKernel, ThreadFor
from polyfuse.ir.loops import (Assign, For, If, LoopRewriter, Scope, Stmt, Store, map_body_exprs, stmt_nodes,
                               walk_stmts)
from polyfuse.ir.types import DType


def hoist_reciprocals(kernel: GpuKernel) -> GpuKernel:
    """``kernel`` with one reciprocal per loop for each divisor the loop does not change."""
    taken = {b.name for b in kernel.buffers} | {s.name for s in kernel.scalars} | \
        {s.var for launch in kernel.launches for s in walk_stmts(launch.body) if isinstance(s, Assign)}
    hoister = _Hoister(taken)
    return replace(kernel, launches=tuple(replace(launch, body=hoister.body(launch.body, Scope()))
                                          for launch in kernel.launches))


class _Hoister(LoopRewriter):
    def __init__(self, taken: set[str]) -> None:
        self.taken = taken

    def loop(self, s: For, scope: Scope) -> Stmt | tuple[Stmt, ...]:
        lets, hoisted = self.hoist(s)
        assert isinstance(hoisted, For)
        return (*lets, *_stmts(super().loop(hoisted, scope)))

    def nested(self, s: Stmt, scope: Scope) -> Stmt | tuple[Stmt, ...]:
        if isinstance(s, ThreadFor):
            lets, hoisted = self.hoist(s)
            return (*lets, *_stmts(super().nested(hoisted, scope)))
        return super().nested(s, scope)

    def hoist(self, s: For | ThreadFor) -> tuple[list[Stmt], For | ThreadFor]:
        """The lets of ``s``'s invariant divisors and ``s`` with products instead."""
        inner = list(walk_stmts(s.body))
        bound = {s.var} | {x.var for x in inner if isinstance(x, (For, ThreadFor))}
        set_locals = {x.var for x in inner if isinstance(x, Assign)}
        stored = {x.buffer for x in inner if isinstance(x, Store)}
        guarded = {id(e) for x in inner if isinstance(x, If) for y in walk_stmts(x.then + x.other)
                   for e in stmt_nodes(y)}
        divisors: dict[Expr, str] = {}
        for x in inner:
            for e in stmt_nodes(x):
                if isinstance(e, Binary) and e.op is BinaryOp.DIV and e.dtype.is_float and e.rhs not in divisors \
                        and _invariant(e.rhs, bound, set_locals, stored) \
                        and not (id(e) in guarded and any(isinstance(r, Read) for r in walk(e.rhs))):
                    divisors[e.rhs] = self.fresh()
        if not divisors:
            return [], s
        lets: list[Stmt] = [Assign(name, Binary(BinaryOp.DIV, Literal(1.0, d.dtype), d, d.dtype))
                            for d, name in divisors.items()]
        reads = any(isinstance(r, Read) for d in divisors for r in walk(d))
        if reads and not (isinstance(s.lo, Literal) and isinstance(s.hi, Literal) and s.lo.value < s.hi.value):
            lets = [If(Binary(BinaryOp.LT, s.lo, s.hi, DType.BOOL), tuple(lets))]   # read where the loop would

        def product(e: Expr) -> Expr:
            if isinstance(e, Binary) and e.op is BinaryOp.DIV and e.rhs in divisors:
                return Binary(BinaryOp.MUL, e.lhs, LocalRef(divisors[e.rhs], e.rhs.dtype), e.dtype)
            return e
        return lets, replace(s, body=map_body_exprs(s.body, product))  # type: ignore[return-value]

    def fresh(self) -> str:
        k = 0
        while f"pf_rcp{k}" in self.taken:
            k += 1
        self.taken.add(f"pf_rcp{k}")
        return f"pf_rcp{k}"


def _stmts(new: Stmt | tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    return new if isinstance(new, tuple) else (new,)


def _invariant(e: Expr, bound: set[str], set_locals: set[str], stored: set[str]) -> bool:
    """Whether ``e`` has one value through a loop that binds ``bound``, sets ``set_locals``
    and stores ``stored``."""
    for x in walk(e):
        if isinstance(x, IndexVar) and x.name in bound or isinstance(x, LocalRef) and x.name in set_locals \
                or isinstance(x, Read) and x.tensor in stored:
            return False
    return True

