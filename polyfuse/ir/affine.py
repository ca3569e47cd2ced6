"""Affine forms of loop-IR index expressions, and loops of constant bounds: what the
loop passes, the GPU mapping and the targets reason with.

An affine form maps loop variables to integer coefficients; the key ``""`` holds the
constant. Index arithmetic from isl's AST is affine but for ``min``/``max`` in loop
bounds, which :func:`max_trips` bounds from above by any of their arguments. A
:class:`ConstantLoop` is a loop whose bounds are literals; :func:`span` gives the range
of a form over such loops.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from polyfuse.ir.comprehension import (Binary, BinaryOp, Call, Expr, IndexVar, Literal, ScalarRef, SizeVar, Unary,
                                       UnaryOp)
from polyfuse.ir.loops import For, constant_trips
from polyfuse.ir.types import DType

Affine = dict[str, int]

_MAX_FORMS = 16  # bounds tried per expression (min/max nest this deep in practice)


def affine(e: Expr) -> Affine | None:
    """The affine form of an integer expression, or None when it is not affine."""
    return _form(e, _index_atom, "")


def linear(e: Expr) -> dict[Expr, int] | None:
    """``e`` as integer coefficients of its atoms: loop variables, int scalars (a symbolic
    kernel's sizes) and floor divisions by a constant; the key :data:`ONE` holds the
    constant. None where ``e`` is not such a sum."""
    return _form(e, _size_atom, ONE)


def size_form(e: Expr) -> Affine | None:
    """The affine form of an integer expression over the sizes it names (``SizeVar``
    names; ``""`` the constant), or None when it is not affine in them."""
    return _form(e, _size_name, "")


ONE = Literal(1, DType.INT64)
K = TypeVar("K", str, Expr)


def _index_atom(e: Expr) -> str | None:
    return e.name if isinstance(e, IndexVar) else None


def _size_name(e: Expr) -> str | None:
    return e.name if isinstance(e, SizeVar) else None


def _size_atom(e: Expr) -> Expr | None:
    match e:
        case IndexVar() | ScalarRef() if e.dtype.is_int:
            return e
        case Call(fn="floordiv", args=(_, Literal(value=d))) if isinstance(d, int) and d > 0:
            return e
    return None


def _form(e: Expr, atom: Callable[[Expr], K | None], one: K) -> dict[K, int] | None:
    """``e`` as integer coefficients of the keys ``atom`` gives its leaves (``one``: the
    constant's), or None where it is not such a sum."""
    match e:
        case Literal(value=v) if isinstance(v, int) and not isinstance(v, bool):
            return {one: v} if v else {}
        case Unary(op=UnaryOp.NEG, operand=a):
            f = _form(a, atom, one)
            return None if f is None else scale(f, -1)
        case Binary(op=BinaryOp.ADD | BinaryOp.SUB, lhs=a, rhs=b):
            fa, fb = _form(a, atom, one), _form(b, atom, one)
            if fa is None or fb is None:
                return None
            return linear_sum(fa, fb, 1 if e.op is BinaryOp.ADD else -1)
        case Binary(op=BinaryOp.MUL, lhs=a, rhs=b):
            fa, fb = _form(a, atom, one), _form(b, atom, one)
            if fa is None or fb is None:
                return None
            if set(fa) <= {one}:
                return scale(fb, fa.get(one, 0))
            if set(fb) <= {one}:
                return scale(fa, fb.get(one, 0))
    key = atom(e)
    return None if key is None else {key: 1}


def linear_sum(a: dict[K, int], b: dict[K, int], k: int = 1) -> dict[K, int]:
    """``a + k * b`` of two linear forms."""
    out = dict(a)
    for x, c in b.items():
        out[x] = out.get(x, 0) + k * c
    return {x: c for x, c in out.items() if c}


def combine(a: Affine, b: Affine, k: int = 1) -> Affine:
    """``a + k * b``."""
    return linear_sum(a, b, k)


def scale(a: dict[K, int], k: int) -> dict[K, int]:
    return {v: c * k for v, c in a.items() if c * k}


def constant(a: Affine) -> int | None:
    """The value of a form without variables, else None."""
    return a.get("", 0) if set(a) <= {""} else None


def variables(a: Affine) -> set[str]:
    return {v for v in a if v}


def to_expr(a: Affine) -> Expr:
    """The int64 expression of a form: terms in name order, then the constant."""
    out: Expr | None = None
    for var in sorted(variables(a)):
        c = a[var]
        term: Expr = IndexVar(var)
        if abs(c) != 1:
            term = Binary(BinaryOp.MUL, Literal(abs(c), DType.INT64), term, DType.INT64)
        if out is None:
            out = term if c > 0 else Unary(UnaryOp.NEG, term, DType.INT64)
        else:
            out = Binary(BinaryOp.ADD if c > 0 else BinaryOp.SUB, out, term, DType.INT64)
    k = a.get("", 0)
    if out is None:
        return Literal(k, DType.INT64)
    if k:
        out = Binary(BinaryOp.ADD if k > 0 else BinaryOp.SUB, out, Literal(abs(k), DType.INT64),
                     DType.INT64)
    return out


def normal_form(e: Expr) -> Expr:
    """An affine expression in its normal form (``c0 + c3 + c3r``, constants folded);
    any other as it is."""
    form = affine(e)
    return e if form is None else to_expr(form)


def bounds(e: Expr, upper: bool) -> list[Affine]:
    """Affine forms each at least (``upper``) or at most ``e``, for every value of the
    variables: an argument of ``min`` bounds it from above, of ``max`` from below."""
    f = affine(e)
    if f is not None:
        return [f]
    match e:
        case Call(fn="min" | "max", args=args) if (e.fn == "min") == upper:
            return [b for a in args for b in bounds(a, upper)][:_MAX_FORMS]
        case Binary(op=BinaryOp.ADD, lhs=a, rhs=b):
            pairs = itertools.product(bounds(a, upper), bounds(b, upper))
            return [combine(x, y) for x, y in itertools.islice(pairs, _MAX_FORMS)]
        case Binary(op=BinaryOp.SUB, lhs=a, rhs=b):
            pairs = itertools.product(bounds(a, upper), bounds(b, not upper))
            return [combine(x, y, -1) for x, y in itertools.islice(pairs, _MAX_FORMS)]
    return []


def max_trips(lo: Expr, hi: Expr, step: int = 1) -> int | None:
    """The most iterations of ``for v in lo:hi step step`` over all values of the
    enclosing variables, when some bound of ``hi - lo`` is a constant; else None."""
    spans = [constant(combine(h, l, -1)) for h in bounds(hi, True) for l in bounds(lo, False)]
    known = [s for s in spans if s is not None]
    if not known:
        return None
    return max(0, -(-min(known) // step))


@dataclass(frozen=True)
class ConstantLoop:
    """A loop with literal bounds: ``trips`` iterations from ``lo`` by ``step``."""

    var: str
    lo: int
    trips: int
    step: int
    vector: int

    @property
    def last(self) -> int:
        return self.lo + (self.trips - 1) * self.step


def constant_loop(s: For) -> ConstantLoop | None:
    """``s`` as a :class:`ConstantLoop`, or None when its bounds are not literals."""
    trips = constant_trips(s)
    return ConstantLoop(s.var, int(s.lo.value), trips, s.step, s.vector) if trips else None  # type: ignore[attr-defined]


def span(form: Affine, path: tuple[ConstantLoop, ...]) -> tuple[int, int]:
    """The least and greatest value of ``form`` over the loops of ``path``."""
    by_var = {lp.var: lp for lp in path}
    lo = hi = form.get("", 0)
    for v, c in form.items():
        if v:
            ends = (c * by_var[v].lo, c * by_var[v].last)
            lo, hi = lo + min(ends), hi + max(ends)
    return lo, hi
