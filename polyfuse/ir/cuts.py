"""Where a loop splits so that a ``min`` in the bounds inside it is decided: linear forms
over loop variables and sizes.

A kernel compiled for symbolic sizes has bounds such as ``min(255, N - c0 - 1)`` inside
``for c0 in 0:N step 256``: the tile's last point, or the size's. Below a cut, one side
always wins; :func:`prefix_cut` finds the cut from the two sides' difference, and
:func:`aligned` moves it onto the loop's steps (``256 * floordiv(N, 256)``). What is
known where (the loops' bounds as isl constraints) is the scheduler's
(:class:`~polyfuse.scheduler.symbolic_facts.Facts`), given to the passes that need it
as a :class:`Knowledge`.
"""

from __future__ import annotations

from typing import Protocol

from polyfuse.ir.affine import ONE as _ONE
from polyfuse.ir.affine import linear, linear_sum
from polyfuse.ir.comprehension import Binary, BinaryOp, Call, Expr, IndexVar, Literal, Unary, UnaryOp
from polyfuse.ir.types import DType

_I64 = DType.INT64


class Knowledge(Protocol):
    """What holds at a point of a loop nest, over loop variables and sizes."""

    @property
    def variables(self) -> frozenset[str]: ...

    def inside(self, loop: object) -> Knowledge:
        """What holds in ``loop``'s body (a :class:`~polyfuse.ir.loops.For`)."""
        ...

    def below(self, var: str, cut: Expr) -> Knowledge: ...

    def at_least(self, var: str, cut: Expr) -> Knowledge: ...

    def always(self, a: Expr, op: str, b: Expr) -> bool:
        """Whether ``a op b`` (``<=`` or ``<``) holds everywhere here."""
        ...

    def decide(self, e: Expr, constants: bool = False) -> Expr:
        """``e`` with each ``min`` and ``max`` that one side always wins here replaced by
        it (with ``constants``, only where that side is a number)."""
        ...


class NotAffine(Exception):
    """An expression the reasoning about bounds cannot model."""


def from_linear(f: dict[Expr, int]) -> Expr:
    """The int64 expression of a linear form (terms in text order, the constant last)."""
    out: Expr | None = None
    for atom in sorted((x for x in f if x != _ONE), key=str):
        c = f[atom]
        term = atom if abs(c) == 1 else Binary(BinaryOp.MUL, Literal(abs(c), _I64), atom, _I64)
        if out is None:
            out = term if c > 0 else Unary(UnaryOp.NEG, term, _I64)
        else:
            out = Binary(BinaryOp.ADD if c > 0 else BinaryOp.SUB, out, term, _I64)
    k = f.get(_ONE, 0)
    if out is None:
        return Literal(k, _I64)
    return Binary(BinaryOp.ADD if k > 0 else BinaryOp.SUB, out, Literal(abs(k), _I64), _I64) if k else out


def floordiv(f: dict[Expr, int], d: int) -> Expr:
    """``floor(f / d)`` for ``d > 0`` (the expression of ``f`` itself when ``d`` is 1)."""
    if d == 1:
        return from_linear(f)
    return Call("floordiv", (from_linear(f), Literal(d, _I64)), _I64)


def prefix_cut(c: Call, var: str) -> Expr | None:
    """The first value of ``var`` from which the two sides of the ``min`` or ``max``
    ``c`` (affine, ``var`` in one side's difference with the other) may compare
    otherwise than at smaller values: below it, ``var``'s prefix, one side always wins
    (the difference keeps its sign). None where the sides are not affine."""
    a, b = (linear(x) for x in c.args)
    if a is None or b is None:
        return None
    d = linear_sum(b, a, -1)         # b - a = alpha * var + rest
    v = IndexVar(var)
    alpha = d.pop(v, 0)
    if not alpha:
        return None
    if alpha < 0:                    # b - a >= 0 while var <= floor(rest / -alpha)
        return _plus_one(floordiv(d, -alpha))
    # b - a < 0 while alpha * var <= -1 - rest, var <= floor((-1 - rest) / alpha)
    return _plus_one(floordiv(linear_sum({_ONE: -1}, d, -1), alpha))


def _plus_one(e: Expr) -> Expr:
    f = linear(e)
    if f is None:
        return Binary(BinaryOp.ADD, e, Literal(1, _I64), _I64)
    return from_linear(linear_sum(f, {_ONE: 1}))


def smallest(cuts: list[Expr]) -> Expr:
    """The least of ``cuts`` (nested ``min``)."""
    out = cuts[0]
    for c in cuts[1:]:
        out = Call("min", (out, c), _I64)
    return out


def aligned(lo: Expr, step: int, cut: Expr) -> Expr:
    """The first value of ``for v in lo:... step step`` at or past ``cut``:
    ``lo + ceil((cut - lo) / step) * step``."""
    if step == 1:
        return cut
    fl, fc = linear(lo), linear(cut)
    if fl is None or fc is None:
        raise NotAffine(str(cut))
    q = linear(floordiv(linear_sum(linear_sum(fc, fl, -1), {_ONE: step - 1}, 1), step))
    assert q is not None
    return from_linear(linear_sum(fl, {k: c * step for k, c in q.items()}, 1))
