"""The chain rule on scalar expressions: :func:`derivative` of an expression with
respect to one tensor element (a :class:`Read`), and the table of partial derivatives
of every builtin (:data:`PARTIALS`).

Integer and boolean expressions are piecewise constant: their derivative is zero, and so
is that of a comparison. ``select`` differentiates each side under its condition. Ties of
``max``/``min``/``fmax``/``fmin`` share the gradient evenly, as PyTorch's ``maximum``
does; ``abs`` has derivative 0 at 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from polyfuse.ir.comprehension import (Binary, BinaryOp, Call, Cast, Expr, Read, Select, Unary,
                                       UnaryOp)
from polyfuse.lowering.autodiff.algebra import (Maybe, add, both, call, compare, div, lit, mul,
                                                neg, select, sub, total)


class NotDifferentiable(Exception):
    """A builtin without a derivative polyfuse can write in TC; ``fn`` names it."""

    def __init__(self, fn: str, reason: str, node: Expr) -> None:
        super().__init__(fn)
        self.fn, self.reason, self.node = fn, reason, node


def derivative(e: Expr, var: Read) -> Maybe:
    """d e / d var, where ``var`` is one element (every occurrence counts); None is 0."""
    if not e.dtype.is_float:
        return None
    match e:
        case Read():
            return lit(1, e.dtype) if e == var else None
        case Unary(op=UnaryOp.NEG, operand=a):
            return neg(derivative(a, var))
        case Binary(op=op, lhs=a, rhs=b):
            da, db = derivative(a, var), derivative(b, var)
            if da is None and db is None:
                return None
            pa, pb = _BINARY[op](a, b, e)
            return add(mul(da, pa), mul(db, pb))
        case Select(cond=c, then=a, other=b):
            return select(c, derivative(a, var), derivative(b, var))
        case Cast(dtype=dt, operand=a):
            d = derivative(a, var)
            return None if d is None else Cast(dt, d)
        case Call(fn=fn, args=args):
            ds = [derivative(a, var) for a in args]
            if all(d is None for d in ds):
                return None
            rule = PARTIALS.get(fn)
            if rule is None:
                raise NotDifferentiable(fn, _NO_RULE.get(fn, "polyfuse has no derivative for it"), e)
            partials = rule(args, e)
            return total(mul(d, p) for d, p in zip(ds, partials))
    return None


def _div_partials(a: Expr, b: Expr, y: Expr) -> tuple[Maybe, Maybe]:
    return div(lit(1, y.dtype), b), neg(div(a, mul(b, b)))


def _mod_partials(a: Expr, b: Expr, y: Expr) -> tuple[Maybe, Maybe]:
    return lit(1, y.dtype), neg(call("trunc", div(a, b)))  # type: ignore[arg-type]


_BINARY: dict[BinaryOp, Callable[[Expr, Expr, Expr], tuple[Maybe, Maybe]]] = {
    BinaryOp.ADD: lambda a, b, y: (lit(1, y.dtype), lit(1, y.dtype)),
    BinaryOp.SUB: lambda a, b, y: (lit(1, y.dtype), lit(-1, y.dtype)),
    BinaryOp.MUL: lambda a, b, y: (b, a),
    BinaryOp.DIV: _div_partials,
    BinaryOp.MOD: _mod_partials,
}

Rule = Callable[[tuple[Expr, ...], Expr], tuple[Maybe, ...]]
PARTIALS: dict[str, Rule] = {}

_LN2, _LN10 = math.log(2.0), math.log(10.0)
_SQRT_PI, _SQRT_2PI = math.sqrt(math.pi), math.sqrt(2.0 * math.pi)

_NO_RULE = {
    "lgamma": "its derivative is the digamma function, which TC has no builtin for",
    "tgamma": "its derivative needs the digamma function, which TC has no builtin for",
    "nextafter": "it steps to the next representable number and has no useful derivative",
}


def _sq(x: Expr) -> Expr:
    return mul(x, x)  # type: ignore[return-value]


def _sign(x: Expr, c: Callable[[float], Expr]) -> Maybe:
    return select(compare(BinaryOp.GT, x, c(0)), c(1),
                  select(compare(BinaryOp.LT, x, c(0)), c(-1), None))


def _at_zero(x: Expr, c: Callable[[float], Expr], limit: float, value: Maybe) -> Maybe:
    """``value``, except ``limit`` at x == 0 (where value divides by x)."""
    return select(compare(BinaryOp.EQ, x, c(0)), c(limit), value)


_UNARY_RULES: dict[str, Callable[[Expr, Expr, Callable[[float], Expr]], Maybe]] = {
    "exp": lambda x, y, c: y,
    "exp2": lambda x, y, c: mul(c(_LN2), y),
    "exp10": lambda x, y, c: mul(c(_LN10), y),
    "expm1": lambda x, y, c: add(y, c(1)),
    "log": lambda x, y, c: div(c(1), x),
    "log2": lambda x, y, c: div(c(1), mul(x, c(_LN2))),  # type: ignore[arg-type]
    "log10": lambda x, y, c: div(c(1), mul(x, c(_LN10))),  # type: ignore[arg-type]
    "log1p": lambda x, y, c: div(c(1), add(c(1), x)),  # type: ignore[arg-type]
    "sqrt": lambda x, y, c: div(c(0.5), y),
    "rsqrt": lambda x, y, c: neg(div(mul(c(0.5), y), x)),
    "cbrt": lambda x, y, c: div(c(1), mul(c(3), _sq(y))),  # type: ignore[arg-type]
    "rcbrt": lambda x, y, c: neg(div(y, mul(c(3), x))),  # type: ignore[arg-type]
    "tanh": lambda x, y, c: sub(c(1), _sq(y)),
    "sinh": lambda x, y, c: call("cosh", x),
    "cosh": lambda x, y, c: call("sinh", x),
    "sigmoid": lambda x, y, c: mul(y, sub(c(1), y)),
    "erf": lambda x, y, c: mul(c(2 / _SQRT_PI), call("exp", neg(_sq(x)))),  # type: ignore[arg-type]
    "erfc": lambda x, y, c: mul(c(-2 / _SQRT_PI), call("exp", neg(_sq(x)))),  # type: ignore[arg-type]
    "fabs": lambda x, y, c: _sign(x, c),
    "abs": lambda x, y, c: _sign(x, c),
    "sin": lambda x, y, c: call("cos", x),
    "cos": lambda x, y, c: neg(call("sin", x)),
    "tan": lambda x, y, c: add(c(1), _sq(y)),
    "asin": lambda x, y, c: call("rsqrt", sub(c(1), _sq(x))),  # type: ignore[arg-type]
    "acos": lambda x, y, c: neg(call("rsqrt", sub(c(1), _sq(x)))),  # type: ignore[arg-type]
    "atan": lambda x, y, c: div(c(1), add(c(1), _sq(x))),  # type: ignore[arg-type]
    "acosh": lambda x, y, c: call("rsqrt", sub(_sq(x), c(1))),  # type: ignore[arg-type]
    "asinh": lambda x, y, c: call("rsqrt", add(_sq(x), c(1))),  # type: ignore[arg-type]
    "atanh": lambda x, y, c: div(c(1), sub(c(1), _sq(x))),  # type: ignore[arg-type]
    "sinpi": lambda x, y, c: mul(c(math.pi), call("cospi", x)),
    "cospi": lambda x, y, c: mul(c(-math.pi), call("sinpi", x)),
    "cyl_bessel_i0": lambda x, y, c: call("cyl_bessel_i1", x),
    "cyl_bessel_i1": lambda x, y, c: _at_zero(x, c, 0.5, sub(call("cyl_bessel_i0", x), div(y, x))),
    "j0": lambda x, y, c: neg(call("j1", x)),
    "j1": lambda x, y, c: _at_zero(x, c, 0.5, sub(call("j0", x), div(y, x))),
    "y0": lambda x, y, c: neg(call("y1", x)),
    "y1": lambda x, y, c: sub(call("y0", x), div(y, x)),
    "erfinv": lambda x, y, c: mul(c(_SQRT_PI / 2), call("exp", _sq(y))),
    "erfcinv": lambda x, y, c: mul(c(-_SQRT_PI / 2), call("exp", _sq(y))),
    "erfcx": lambda x, y, c: sub(mul(mul(c(2), x), y), c(2 / _SQRT_PI)),
    "normcdf": lambda x, y, c: mul(c(1 / _SQRT_2PI), call("exp", mul(c(-0.5), _sq(x)))),  # type: ignore[arg-type]
    "normcdfinv": lambda x, y, c: mul(c(_SQRT_2PI), call("exp", mul(c(0.5), _sq(y)))),  # type: ignore[arg-type]
}
for _name, _rule in _UNARY_RULES.items():
    PARTIALS[_name] = lambda args, y, rule=_rule: (rule(args[0], y, lambda v: lit(v, y.dtype)),)
for _name in "floor ceil round trunc rint logb".split():
    PARTIALS[_name] = lambda args, y: (None,)


def _maximum(args: tuple[Expr, ...], y: Expr, first: BinaryOp) -> tuple[Maybe, Maybe]:
    """Partials of max (first=GT) or min (first=LT): ties split the gradient evenly."""
    a, b = args
    one, half = lit(1, y.dtype), lit(0.5, y.dtype)
    tie = compare(BinaryOp.EQ, a, b)
    return (select(compare(first, a, b), one, select(tie, half, None)),
            select(compare(first, b, a), one, select(tie, half, None)))


def _pow(args: tuple[Expr, ...], y: Expr) -> tuple[Maybe, Maybe]:
    a, b = args
    zero, one = lit(0, y.dtype), lit(1, y.dtype)
    base = select(compare(BinaryOp.EQ, b, zero), None, mul(b, call("pow", a, sub(b, one))))  # type: ignore[arg-type]
    exponent = select(both(compare(BinaryOp.EQ, a, zero), compare(BinaryOp.GE, b, zero)),  # type: ignore[arg-type]
                      None, mul(y, call("log", a)))
    return base, exponent


def _norm(args: tuple[Expr, ...], y: Expr) -> tuple[Maybe, ...]:
    zero = lit(0, y.dtype)
    return tuple(select(compare(BinaryOp.EQ, y, zero), None, div(a, y)) for a in args)


def _rnorm(args: tuple[Expr, ...], y: Expr) -> tuple[Maybe, ...]:
    cube = mul(mul(y, y), y)
    return tuple(neg(mul(a, cube)) for a in args)


def _atan2(args: tuple[Expr, ...], y: Expr) -> tuple[Maybe, Maybe]:
    a, b = args
    r = add(_sq(a), _sq(b))
    return div(b, r), neg(div(a, r))  # type: ignore[arg-type]


def _copysign(args: tuple[Expr, ...], y: Expr) -> tuple[Maybe, Maybe]:
    one = lit(1, y.dtype)
    return mul(call("copysign", one, args[0]), call("copysign", one, args[1])), None


def _fdim(args: tuple[Expr, ...], y: Expr) -> tuple[Maybe, Maybe]:
    above = compare(BinaryOp.GT, args[0], args[1])
    return select(above, lit(1, y.dtype), None), select(above, lit(-1, y.dtype), None)


def _quotient(fn: str) -> Rule:
    """fmod, remainder, floormod: a - q(a / b) * b, with q piecewise constant."""
    return lambda args, y: (lit(1, y.dtype), neg(call(fn, div(args[0], args[1]))))  # type: ignore[arg-type]


PARTIALS.update({
    "max": lambda args, y: _maximum(args, y, BinaryOp.GT),
    "fmax": lambda args, y: _maximum(args, y, BinaryOp.GT),
    "min": lambda args, y: _maximum(args, y, BinaryOp.LT),
    "fmin": lambda args, y: _maximum(args, y, BinaryOp.LT),
    "pow": _pow,
    "atan2": _atan2,
    "fmod": _quotient("trunc"),
    "remainder": _quotient("rint"),
    "floormod": _quotient("floor"),
    "floordiv": lambda args, y: (None, None),
    "copysign": _copysign,
    "fdim": _fdim,
    "fdivide": lambda args, y: _div_partials(args[0], args[1], y),
    "hypot": _norm, "norm3d": _norm, "norm4d": _norm,
    "rhypot": _rnorm, "rnorm3d": _rnorm, "rnorm4d": _rnorm,
    "fma": lambda args, y: (args[1], args[0], lit(1, y.dtype)),
})
