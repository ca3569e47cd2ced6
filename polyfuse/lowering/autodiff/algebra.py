"""Typed expression builders for derived TC: constants fold, zeros vanish.

Zero is ``None`` throughout the autodiff package, so a derivative that does not depend
on a read simply disappears from the expressions built from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from polyfuse.ir.comprehension import (Binary, BinaryOp, Call, Expr, IndexVar, Literal, Select,
                                       Unary, UnaryOp, map_expr)
from polyfuse.ir.types import DType

Maybe = Expr | None


def lit(value: float, dtype: DType) -> Literal:
    return Literal(int(value) if dtype.is_int else float(value), dtype)


def _value(e: Expr) -> float | None:
    return e.value if isinstance(e, Literal) and not isinstance(e.value, bool) else None


def add(a: Maybe, b: Maybe) -> Maybe:
    if a is None or _value(a) == 0:
        return b
    if b is None or _value(b) == 0:
        return a
    return Binary(BinaryOp.ADD, a, b, a.dtype)


def neg(a: Maybe) -> Maybe:
    if a is None:
        return None
    if isinstance(a, Unary) and a.op is UnaryOp.NEG:
        return a.operand
    return Unary(UnaryOp.NEG, a, a.dtype)


def sub(a: Maybe, b: Maybe) -> Maybe:
    if b is None or _value(b) == 0:
        return a
    if a is None or _value(a) == 0:
        return neg(b)
    return Binary(BinaryOp.SUB, a, b, a.dtype)


def mul(a: Maybe, b: Maybe) -> Maybe:
    if a is None or b is None or _value(a) == 0 or _value(b) == 0:
        return None
    if _value(a) == 1:
        return b
    if _value(b) == 1:
        return a
    if _value(a) == -1:
        return neg(b)
    if _value(b) == -1:
        return neg(a)
    return Binary(BinaryOp.MUL, a, b, a.dtype)


def div(a: Maybe, b: Expr) -> Maybe:
    if a is None or _value(a) == 0:
        return None
    if _value(b) == 1:
        return a
    return Binary(BinaryOp.DIV, a, b, a.dtype)


def total(terms: Iterable[Maybe]) -> Maybe:
    out: Maybe = None
    for t in terms:
        out = add(out, t)
    return out


def compare(op: BinaryOp, a: Expr, b: Expr) -> Expr:
    return Binary(op, a, b, DType.BOOL)


def both(a: Expr | None, b: Expr | None) -> Expr | None:
    """``a && b``, where None is true."""
    if a is None:
        return b
    if b is None:
        return a
    return Binary(BinaryOp.AND, a, b, DType.BOOL)


def select(cond: Expr, then: Maybe, other: Maybe) -> Maybe:
    if then is None and other is None:
        return None
    dtype = (then if then is not None else other).dtype  # type: ignore[union-attr]
    return Select(cond, then if then is not None else lit(0, dtype),
                  other if other is not None else lit(0, dtype), dtype)


def call(fn: str, *args: Expr) -> Call:
    return Call(fn, args, args[0].dtype)


def index(name: str) -> IndexVar:
    return IndexVar(name)


def int_add(a: Expr, b: Expr) -> Expr:
    return _int(BinaryOp.ADD, a, b)


def int_sub(a: Expr, b: Expr) -> Expr:
    return _int(BinaryOp.SUB, a, b)


def int_mul(k: int, a: Expr) -> Expr:
    if k == 1 or _value(a) == 0:
        return a
    if _value(a) is not None:
        return lit(k * int(a.value), DType.INT32)  # type: ignore[attr-defined]
    return Binary(BinaryOp.MUL, lit(k, DType.INT32), a, DType.INT32)


def _int(op: BinaryOp, a: Expr, b: Expr) -> Expr:
    va, vb = _value(a), _value(b)
    if va is not None and vb is not None:
        return lit(va + vb if op is BinaryOp.ADD else va - vb, DType.INT32)
    if vb == 0:
        return a
    if op is BinaryOp.ADD and va == 0:
        return b
    if op is BinaryOp.SUB and va == 0:
        return Unary(UnaryOp.NEG, b, DType.INT32)
    return Binary(op, a, b, DType.INT32)


def substitute(e: Expr, values: Mapping[str, Expr]) -> Expr:
    """``e`` with the indices in ``values`` replaced by their expressions."""
    if not values:
        return e
    return map_expr(e, lambda n: values.get(n.name, n) if isinstance(n, IndexVar) else n)
