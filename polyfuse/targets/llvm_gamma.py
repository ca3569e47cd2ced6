"""Vectorizable float32 lgamma and tgamma, emitted as LLVM IR (computed in double).

For a = |x|: below 1, lgamma(a) = lgamma(a + 1) - log a; on [1, 8), the argument is
shifted down by up to five steps to z in [1, 3) and lgamma(a) = lgamma(z) + log of
the product of the steps, with lgamma(z) = (z - 1)(z - 2) G(z) so that the zeros at
1 and 2 keep their relative accuracy (G is a degree-16 polynomial fitted for polyfuse
to 4e-11); from 8 on, Stirling's series with four terms. The logarithms are float32
log's exact split k ln2 + f + y summed in double, with the rounding of a double
argument to float corrected to first order. Negative x use the reflection formula
lgamma(x) = log(pi / |x sinpi(x)|) - lgamma(-x), and tgamma is sign * e^lgamma with
e^q split as in llvm_special. All of it is straight-line code on float or double
vectors, so loops over lgamma and tgamma vectorize.

Measured against scipy (gammaln, gamma) rounded to float32 on 2^20 arguments per
range: lgamma within 1 ulp for x > 0, tgamma within 4 ulp everywhere; for negative x
lgamma is within 2 ulp or 2e-7 absolute (near its zeros between -2 and -10 its
relative error grows, as CUDA's lgammaf's does).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from llvmlite import ir

from polyfuse.targets.llvm_math import _Emit, _log_parts
from polyfuse.targets.llvm_special import _Poly, _sinpi, _Wide

_LN2 = math.log(2.0)
_LGAMMA = _Poly(2.0, 1.0, (1.235287212483284e-06, -2.4539811376606122e-06, -7.508427929513483e-08, -4.7087899315806836e-07, 1.0306169963057938e-05, -2.1099241009732803e-05, 3.687521679821303e-05, -8.117370836216613e-05, 0.00018301539560873595, -0.00040630550796614824, 0.0009152849694585162, -0.0021080331479236564, 0.004998650252743075, -0.012384199308325764, 0.03296500027701112, -0.10031730152389734, 0.4227843351006049))  # noqa: E501
# Stirling: lgamma(x) = (x - 1/2) log x - x + log(2 pi)/2 + S(1/x), S(u) = u (1/12 - u^2/360 + ...)
_STIRLING = (-1 / 1680, 1 / 1260, -1 / 360, 1 / 12)
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _log_wide(w: _Wide, x: ir.Value) -> ir.Value:
    """log of a float32 x in double, from log's split x = 2^k (1 + f): k ln2 + f + y."""
    e, d = w.e, w.d
    k, f, y = _log_parts(e, x)
    out = d.mad(w.ext(k), d.f(_LN2), d.b.fadd(w.ext(f), w.ext(y)))
    out = e.select(e.cmp("==", x, e.f(float("inf"))), d.f(float("inf")), out)
    out = e.select(e.cmp("==", x, e.f(0.0)), d.f(float("-inf")), out)
    return e.select(e.b.fcmp_unordered("<", x, e.f(0.0)), d.f(float("nan")), out)


def _log_of_double(w: _Wide, v: ir.Value) -> ir.Value:
    """log of a positive double v within float32's range: log(float(v)) + (v - float(v)) / v."""
    d = w.d
    rounded = w.narrow(v)
    back = w.ext(rounded)
    return d.b.fadd(_log_wide(w, rounded), d.b.fdiv(d.b.fsub(v, back), back))


def _lgamma_positive(w: _Wide, a: ir.Value) -> ir.Value:
    """lgamma(a) in double for float32 a >= 0 (see the module doc)."""
    e, d = w.e, w.d
    big = w.ext(a)
    log_a = _log_wide(w, a)
    product, steps = d.f(1.0), d.f(0.0)
    for k in range(1, 6):
        shifted = d.b.fsub(big, d.f(float(k)))
        take = d.cmp(">=", shifted, d.f(2.0))
        product = d.b.fmul(product, e.select(take, shifted, d.f(1.0)))
        steps = d.b.fadd(steps, e.select(take, d.f(1.0), d.f(0.0)))
    below_one = e.cmp("<", a, e.f(1.0))
    z = e.select(below_one, d.b.fadd(big, d.f(1.0)), d.b.fsub(big, steps))
    near = d.b.fmul(d.b.fmul(d.b.fsub(z, d.f(1.0)), d.b.fsub(z, d.f(2.0))), w.poly(z, _LGAMMA))
    near = d.b.fadd(near, _log_of_double(w, product))
    near = d.b.fsub(near, e.select(below_one, log_a, d.f(0.0)))
    u = d.b.fdiv(d.f(1.0), big)
    series = d.b.fmul(u, d.horner(d.b.fmul(u, u), _STIRLING))
    far = d.b.fadd(d.b.fsub(d.b.fmul(d.b.fsub(big, d.f(0.5)), log_a), big), d.f(_HALF_LOG_2PI))
    far = d.b.fadd(far, series)
    out = e.select(e.cmp("<", a, e.f(8.0)), near, far)
    return e.select(e.cmp("==", a, e.f(float("inf"))), d.f(float("inf")), out)


def _lgamma_wide(w: _Wide, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """lgamma(x) in double, and sinpi(x) (whose sign is tgamma's for x < 0)."""
    e, d = w.e, w.d
    a = e.call("llvm.fabs", x)
    positive = _lgamma_positive(w, a)
    sin = _sinpi(e, x)
    log_a = _log_wide(w, a)
    # sinpi(x) = pi x to float32 accuracy below 2^-12, where it could be subnormal
    log_sin = e.select(e.cmp("<", a, e.f(2.0 ** -12)), d.b.fadd(log_a, d.f(math.log(math.pi))),
                       _log_wide(w, e.call("llvm.fabs", sin)))
    reflected = d.b.fsub(d.f(math.log(math.pi)), d.b.fadd(log_a, log_sin))
    return e.select(e.cmp("<", x, e.f(0.0)), d.b.fsub(reflected, positive), positive), sin


def _lgamma(e: _Emit, x: ir.Value) -> ir.Value:
    w = _Wide(e)
    out = w.narrow(_lgamma_wide(w, x)[0])
    return e.select(e.cmp("==", x, e.f(float("-inf"))), e.f(float("inf")), out)


def _tgamma(e: _Emit, x: ir.Value) -> ir.Value:
    """sign * e^lgamma(x): NaN at the poles below 0 and at -inf, +-inf at +-0."""
    w = _Wide(e)
    log_gamma, sin = _lgamma_wide(w, x)
    out = w.narrow(w.exp(log_gamma))
    out = e.select(e.cmp("<", x, e.f(0.0)), e.call("llvm.copysign", out, sin), out)
    pole = e.b.and_(e.cmp("<", x, e.f(0.0)), e.cmp("==", sin, e.f(0.0)))
    out = e.select(pole, e.f(float("nan")), out)
    return e.select(e.cmp("==", x, e.f(0.0)), e.call("llvm.copysign", e.f(float("inf")), x), out)


BODIES: dict[str, tuple[int, Callable[..., ir.Value]]] = {"lgamma": (1, _lgamma), "tgamma": (1, _tgamma)}
