"""Integer expressions over sizes, as sympy expressions and back.

Shapes and index ranges are kept as IR expressions (so they print as TC) but all
arithmetic on them goes through sympy: :func:`canonical` rewrites an expression to
one normal form, so two paths to the same range give equal IR.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import sympy

from polyfuse.ir.comprehension import (Binary, BinaryOp, Call, Expr, Literal, SizeVar, Unary, UnaryOp,
                                       walk)
from polyfuse.ir.limits import expr_depth
from polyfuse.ir.types import DType


@functools.cache
def size_symbol(name: str) -> sympy.Symbol:
    """Sizes are positive integers; sympy uses that to simplify min/max and floors."""
    return sympy.Symbol(name, integer=True, positive=True)


def to_sympy(e: Expr, names: Mapping[str, sympy.Expr] | None = None) -> sympy.Expr:
    """``e`` as sympy; other leaf names (indices) are looked up in ``names``."""
    match e:
        case Literal(value=v):
            return sympy.Integer(int(v))
        case SizeVar(name=n):
            return size_symbol(n)
        case Unary(op=UnaryOp.NEG, operand=a):
            return -to_sympy(a, names)
        case Binary(op=op, lhs=a, rhs=b) if op in _SYMPY_BINARY:
            return _SYMPY_BINARY[op](to_sympy(a, names), to_sympy(b, names))
        case Call(fn="floordiv" | "floormod" as fn, args=(a, b)):
            x, y = to_sympy(a, names), to_sympy(b, names)
            if y == 0:  # as every integer division by 0 in TC
                return sympy.Integer(0)
            return sympy.floor(x / y) if fn == "floordiv" else sympy.Mod(x, y)
        case Call(fn="min", args=args):
            return sympy.Min(*(to_sympy(a, names) for a in args))
        case Call(fn="max", args=args):
            return sympy.Max(*(to_sympy(a, names) for a in args))
    name = getattr(e, "name", None)
    if names is not None and isinstance(name, str) and name in names:
        return names[name]
    raise ValueError(f"not an integer size expression: {e}")


_SYMPY_BINARY = {
    BinaryOp.ADD: lambda a, b: a + b,
    BinaryOp.SUB: lambda a, b: a - b,
    BinaryOp.MUL: lambda a, b: a * b,
    BinaryOp.DIV: lambda a, b: TruncDiv(a, b),
    BinaryOp.MOD: lambda a, b: TruncMod(a, b),
}


class TruncDiv(sympy.Function):
    """C's integer division ``a / b``, rounding toward zero (a divisor 0 gives 0); it is
    ``floor(a/b)`` once sympy knows the signs, and stays itself otherwise."""

    is_integer = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
        if b == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(abs(int(a)) // abs(int(b)) * (1 if (a < 0) == (b < 0) else -1))
        if b.is_positive and a.is_nonnegative:
            return sympy.floor(a / b)
        if b.is_positive and a.is_nonpositive:
            return -sympy.floor(-a / b)
        return None


class TruncMod(sympy.Function):
    """C's integer remainder ``a % b``, with the dividend's sign (a divisor 0 gives 0)."""

    is_integer = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
        if b == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return a - b * TruncDiv(a, b)
        if b.is_positive and a.is_nonnegative:
            return sympy.Mod(a, b)
        return None


def _int(v: int) -> Literal:
    return Literal(int(v), DType.INT32 if -2**31 <= v < 2**31 else DType.INT64)


def _binary(op: BinaryOp, a: Expr, b: Expr) -> Expr:
    return Binary(op, a, b, DType.INT64 if DType.INT64 in (a.dtype, b.dtype) else DType.INT32)


def from_sympy(x: sympy.Expr) -> Expr:
    """The IR expression for an integer sympy expression built from sizes, in normal form."""
    e = _from_sympy(sympy.sympify(x))
    for _ in range(4):  # a rewrite like ceiling -> floor may simplify once more
        again = _from_sympy(to_sympy(e))
        if again == e:
            break
        e = again
    return e


def _from_sympy(x: sympy.Expr) -> Expr:
    if x.is_Integer:
        return _int(int(x))
    if x.is_Symbol:
        return SizeVar(x.name)
    if isinstance(x, sympy.Add):
        terms = x.as_ordered_terms()
        positive = [t for t in terms if not t.could_extract_minus_sign()]
        negative = [-t for t in terms if t.could_extract_minus_sign()]
        out = _from_sympy(positive[0]) if positive else _int(0)
        for t in positive[1:]:
            out = _binary(BinaryOp.ADD, out, _from_sympy(t))
        for t in negative:
            out = _binary(BinaryOp.SUB, out, _from_sympy(t))
        return out
    if isinstance(x, sympy.Mul):
        coeff, rest = x.as_coeff_Mul()
        if coeff.is_Rational and not coeff.is_Integer:
            # p/q * rest only appears inside floor(); reaching here means a fraction
            raise ValueError(f"non-integer size expression: {x}")
        factors = [f for f in sympy.Mul.make_args(rest)]
        out = _from_sympy(factors[0])
        for f in factors[1:]:
            out = _binary(BinaryOp.MUL, out, _from_sympy(f))
        if coeff == -1:
            return _binary(BinaryOp.SUB, _int(0), out)
        return out if coeff == 1 else _binary(BinaryOp.MUL, _int(int(coeff)), out)
    if isinstance(x, sympy.floor):
        return _floor_div(x.args[0])
    if isinstance(x, sympy.ceiling):
        num, den = sympy.fraction(sympy.together(x.args[0]))
        return _floor_div((num + den - 1) / den)
    if isinstance(x, (sympy.Min, sympy.Max)):
        fn = "min" if isinstance(x, sympy.Min) else "max"
        args = [_from_sympy(a) for a in sorted(x.args, key=sympy.default_sort_key)]
        out = args[-1]
        for a in reversed(args[:-1]):  # min(a, min(b, c)): the builtins take two arguments
            out = Call(fn, (a, out), DType.INT64 if DType.INT64 in (a.dtype, out.dtype) else DType.INT32)
        return out
    if isinstance(x, (TruncDiv, TruncMod)):
        op = BinaryOp.DIV if isinstance(x, TruncDiv) else BinaryOp.MOD
        return _binary(op, _from_sympy(x.args[0]), _from_sympy(x.args[1]))
    if isinstance(x, sympy.Mod):
        a, b = (_from_sympy(v) for v in x.args)
        if x.args[0].is_nonnegative and x.args[1].is_positive:
            return _binary(BinaryOp.MOD, a, b)  # C's `%` agrees
        return _call("floormod", a, b)
    if isinstance(x, sympy.Pow) and x.exp.is_Integer and x.exp > 0:
        return _from_sympy(sympy.Mul(*([x.base] * int(x.exp)), evaluate=False))
    raise ValueError(f"cannot express {x} as a TC size expression")


def _floor_div(arg: sympy.Expr) -> Expr:
    num, den = sympy.fraction(sympy.together(arg))
    if not den.is_Integer or den <= 0:
        raise ValueError(f"cannot express floor({arg}) as a TC size expression")
    num = sympy.expand(num)
    if den == 1:
        return _from_sympy(num)
    if num.is_nonnegative:
        return _binary(BinaryOp.DIV, _from_sympy(num), _int(int(den)))  # C's `/` agrees
    return _call("floordiv", _from_sympy(num), _int(int(den)))


def _call(fn: str, a: Expr, b: Expr) -> Expr:
    return Call(fn, (a, b), DType.INT64 if DType.INT64 in (a.dtype, b.dtype) else DType.INT32)


def canonical(e: Expr) -> Expr:
    """``e`` in sympy's normal form (constants folded, terms ordered). An expression of
    integers alone (a specialized shape or range, most of them) is evaluated directly,
    as :func:`evaluate_int` does; one that divides by 0 goes through sympy."""
    if all(_plain_integer(n) for n in walk(e)):
        try:
            return _int(_evaluate(e, {}))
        except _NotDirect:
            pass
    return from_sympy(to_sympy(e))


def _plain_integer(n: Expr) -> bool:
    """Whether node ``n`` lets its expression be evaluated without sizes or sympy: not a
    size, a non-integer literal or a division (one by 0 means what sympy says)."""
    if isinstance(n, Literal):
        return isinstance(n.value, int) and not isinstance(n.value, bool)
    return not (isinstance(n, SizeVar) or isinstance(n, Binary) and n.op in (BinaryOp.DIV, BinaryOp.MOD)
                or isinstance(n, Call) and n.fn in ("floordiv", "floormod"))


def zero_divisor(e: Expr, sizes: Mapping[str, int]) -> Expr | None:
    """A divisor in the size expression ``e`` (of ``/``, ``%``, ``floordiv``, ``floormod``)
    that is 0 for ``sizes``, if one is. Sizes are positive to sympy, so such a division
    means nothing (``N % M`` is sympy's ``Mod(N, M)``, which raises for M = 0); inner
    divisors are evaluated first, so evaluating an outer one never divides by 0."""
    divisors = [n.rhs if isinstance(n, Binary) else n.args[1] for n in walk(e)
                if isinstance(n, Binary) and n.op in (BinaryOp.DIV, BinaryOp.MOD)
                or isinstance(n, Call) and n.fn in ("floordiv", "floormod")]
    for divisor in sorted(divisors, key=expr_depth):
        value = to_sympy(divisor).subs({size_symbol(k): v for k, v in sizes.items()})
        if value == 0:
            return divisor
    return None


def evaluate_int(e: Expr, sizes: Mapping[str, int]) -> int:
    """The value of an integer size expression for concrete sizes (evaluated directly,
    with the semantics :func:`to_sympy` gives each operation; through sympy only for an
    expression outside them, which then raises ValueError)."""
    try:
        return _evaluate(e, sizes)
    except _NotDirect:
        pass
    value = to_sympy(e).subs({size_symbol(k): v for k, v in sizes.items()})
    if not value.is_Integer:
        raise ValueError(f"size expression {e} is not fixed by sizes {dict(sizes)}")
    return int(value)


class _NotDirect(Exception):
    """An expression :func:`_evaluate` leaves to sympy."""


def _evaluate(e: Expr, sizes: Mapping[str, int]) -> int:
    """``e`` at ``sizes`` in Python integers: C's truncating ``/`` and ``%``, floor
    division and modulo for ``floordiv`` and ``floormod``, 0 for any division by 0 (as
    every integer division by 0 in TC)."""
    match e:
        case Literal(value=v):
            return int(v)
        case SizeVar(name=n) if n in sizes:
            return int(sizes[n])
        case Unary(op=UnaryOp.NEG, operand=a):
            return -_evaluate(a, sizes)
        case Binary(op=op, lhs=a, rhs=b) if op in _SYMPY_BINARY:
            x, y = _evaluate(a, sizes), _evaluate(b, sizes)
            if op is BinaryOp.ADD:
                return x + y
            if op is BinaryOp.SUB:
                return x - y
            if op is BinaryOp.MUL:
                return x * y
            if y == 0:
                return 0
            quotient = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
            return quotient if op is BinaryOp.DIV else x - quotient * y
        case Call(fn="floordiv" | "floormod" as fn, args=(a, b)):
            x, y = _evaluate(a, sizes), _evaluate(b, sizes)
            if y == 0:
                return 0
            return x // y if fn == "floordiv" else x % y
        case Call(fn="min" | "max" as fn, args=args) if args:
            values = [_evaluate(a, sizes) for a in args]
            return min(values) if fn == "min" else max(values)
    raise _NotDirect
