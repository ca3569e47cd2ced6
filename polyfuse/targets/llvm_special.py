"""Vectorizable float32 special functions (the rest of TC's builtins), emitted as LLVM IR.

Like :mod:`polyfuse.targets.llvm_math`, whose building blocks they use, these are
straight-line functions on ``float`` or ``<width x float>``, inlined into kernels so
that loops over them vectorize. Where float32 arithmetic would lose accuracy they
compute in double (always vectorizable, never a libm call): squares of float32
values are exact there, and the polynomials, fitted for polyfuse as Chebyshev
expansions to 1e-9 relative error or better, are evaluated in double.

Range reduction: sinpi/cospi reduce exactly modulo 2; the inverse error functions
use w = -log((1 - x)(1 + x)) (two logs, so tiny erfc arguments keep their accuracy)
with one polynomial in w and two in sqrt(w); erfcx uses t = (x - 4)/(x + 4) over
[0, inf), erfc and normcdf are exp(-x^2) erfcx(x) with x^2 split into a float and a
small remainder; the Bessel functions I0, I1 use x^2 up to 8 and e^x/sqrt(x) P(8/x)
beyond; rcbrt runs Newton's method in double from an exponent-bit estimate.

Measured against float64 scipy/numpy rounded to float32 on 2^20 random arguments per
function over its whole range (normal results; subnormal ones are judged absolutely):
exact (0 ulp) for fdim, nextafter, logb, remainder, hypot, rhypot and the norms;
1 ulp for exp10, rcbrt, sinpi, cospi, erfcinv, normcdfinv; 2 ulp for acosh, asinh,
erfinv; 3 ulp for atanh (log1p's 2 ulp), erfcx, normcdf, cyl_bessel_i0 and
cyl_bessel_i1 (whose e^x and e^{-x^2} factors carry float32 exp's error twice).
tests/targets/test_tc_builtins.py checks these bounds, plus one ulp, on edge values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from llvmlite import ir

from polyfuse.targets.llvm_math import _EXP2_POLY, _Emit, _exp, _log, _log1p

_LN2 = math.log(2.0)


@dataclass(frozen=True, slots=True)
class _Poly:
    """A polynomial in t = (v - mid) * scale, coefficients highest degree first."""

    mid: float
    scale: float
    coeffs: tuple[float, ...]


_SINPI = _Poly(0.03125, 32.0, (7.724927839871308e-08, -1.7977199629075434e-05, 0.002435998116153, -0.15656478720860612, 2.982573813802544))  # noqa: E501
_COSPI = _Poly(0.03125, 32.0, (-7.583919984626016e-10, 2.2061276500607406e-07, -3.985892596937196e-05, 0.0038426780108641438, -0.14640674972236495, 0.8497104919695893))  # noqa: E501
_ERFINV_NEAR = _Poly(3.125, 0.32, (5.934221935882134e-05, -0.0001307391317934999, -0.00022658810653504352, 0.0012383478739835768, -0.001291095447242336, -0.00413828067475746, 0.017812874837527835, -0.022604435800475782, -0.05892295171184716, 0.750494324619151, 1.6536545680011319))  # noqa: E501
_ERFINV_TAIL = _Poly(3.5, 1.0, (2.8324105013700145e-06, -6.567997154203454e-06, -3.6259022793528186e-07, 3.7487507563500136e-05, -0.00017322206916385756, 0.0006067754235098698, -0.001719385866670287, 0.0031062534649332774, 1.0074222641430999, 3.3354777355034653))  # noqa: E501
_ERFINV_FAR = _Poly(7.375, 0.34782608695652173, (6.959616615092033e-06, -1.658702527911928e-05, 2.0940168354940746e-05, -4.770383343161345e-05, 0.0001156710636766594, -0.00020916555619380082, 0.00024501671403656113, 0.0003186941842694734, -0.0041430602114774845, 2.8986178415186976, 7.247171357189686))  # noqa: E501
_ERFCX = _Poly(0.0, 1.0, (-9.599295058058077e-06, -8.625303336535269e-06, 0.00014780570552269624, -0.00022040449448000824, -0.0007553293946435013, 0.005047229283257179, -0.016198894296556864, 0.03716148287096287, -0.06633006827935535, 0.09373407344406129, -0.10103910340587904, 0.06809694141726946, 0.015379653887988995, -0.1396211138542686, 1.232995118611571))  # noqa: E501
_I0_NEAR = _Poly(32.0, 0.03125, (1.041378413740267e-05, 0.00016695863151151467, 0.002208370863050121, 0.024218681461198377, 0.21364060120203965, 1.4780930274685808, 7.7730271124572266, 29.833554800241124, 79.0996778794233, 133.73747017002438, 126.1934934831667, 49.20855422280678))  # noqa: E501
_I1_NEAR = _Poly(32.0, 0.03125, (7.164559959378433e-06, 0.0001044524207267534, 0.001242197171941239, 0.012109134178454776, 0.09346777192242779, 0.5542850208504568, 2.4290709698632846, 7.458388667786528, 14.83118960268949, 16.71718377327018, 7.887093342692957))  # noqa: E501
_I0_FAR = _Poly(0.5, 2.0, (3.161985512212392e-08, 1.0867942476387201e-07, 3.073322919713809e-07, 1.4761157344113978e-06, 1.1139815658520624e-05, 0.00013621716424320422, 0.003360552241721049, 0.4021765094192121))  # noqa: E501
_I1_FAR = _Poly(0.5, 2.0, (-3.577435807387839e-08, -1.2273217225256853e-07, -3.5842988886086386e-07, -1.8256907319035613e-06, -1.5035268029462656e-05, -0.00021923712538185022, -0.00974957745755676, 0.3893984590596593))  # noqa: E501


class _Wide:
    """The double twin of a float32 emitter: conversions and polynomials in double."""

    def __init__(self, e: _Emit) -> None:
        ty = e.ty
        self.d = _Emit(e.b, ir.VectorType(ir.DoubleType(), ty.count) if isinstance(ty, ir.VectorType)
                       else ir.DoubleType())
        self.e = e

    def ext(self, x: ir.Value) -> ir.Value:
        return self.e.b.fpext(x, self.d.ty)

    def narrow(self, x: ir.Value) -> ir.Value:
        return self.e.b.fptrunc(x, self.e.ty)

    def poly(self, v: ir.Value, p: _Poly) -> ir.Value:
        d = self.d
        return d.horner(d.b.fmul(d.b.fsub(v, d.f(p.mid)), d.f(p.scale)), p.coeffs)

    def sqrt(self, x: ir.Value) -> ir.Value:
        return self.d.call("llvm.sqrt", x)

    def exp(self, q: ir.Value) -> ir.Value:
        """e^q (double q up to ~177) in double, from float32 exp of q/2 squared: the
        split q = 2h + lo keeps the part float32 cannot hold as a factor 1 + lo."""
        d = self.d
        q = d.clamp(q, -400.0, 400.0)            # e^q is 0 or inf by then; no inf - inf
        h = self.narrow(d.b.fmul(q, d.f(0.5)))
        lo = d.b.fsub(q, d.b.fmul(self.ext(h), d.f(2.0)))
        half = self.ext(_exp(self.e, h))
        return d.b.fmul(d.b.fmul(half, half), d.b.fadd(lo, d.f(1.0)))


def _not_finite(e: _Emit, x: ir.Value) -> ir.Value:
    """True for inf and NaN (x - x is NaN exactly then)."""
    diff = e.b.fsub(x, x)
    return e.b.fcmp_unordered("uno", diff, diff)


def _exp10(e: _Emit, x: ir.Value) -> ir.Value:
    """10^x = 2^t, t = x log2(10) in double, split t = n + r exactly; 2^r as in exp2."""
    w = _Wide(e)
    t = w.d.b.fmul(w.ext(e.clamp(x, -46.0, 39.0)), w.d.f(math.log2(10.0)))
    n_float, n = e.round(w.narrow(t))
    r = w.narrow(w.d.b.fsub(t, w.ext(n_float)))
    return e.ldexp(e.mad(r, e.horner(r, _EXP2_POLY), e.f(1.0)), n)


def _log_half_plus_ln2(w: _Wide, y: ir.Value) -> ir.Value:
    """log y for a double y up to twice float32's range: log(y/2) + ln 2."""
    half = w.ext(_log(w.e, w.narrow(w.d.b.fmul(y, w.d.f(0.5)))))
    return w.narrow(w.d.b.fadd(half, w.d.f(_LN2)))


def _acosh(e: _Emit, x: ir.Value) -> ir.Value:
    """log1p(t + sqrt(t (t + 2))), t = x - 1, below 2; log(x + sqrt(x^2 - 1)) above."""
    w = _Wide(e)
    d = w.d
    big = w.ext(x)
    t = d.b.fsub(big, d.f(1.0))
    near = _log1p(e, w.narrow(d.b.fadd(t, w.sqrt(d.b.fmul(t, d.b.fadd(t, d.f(2.0)))))))
    far = _log_half_plus_ln2(w, d.b.fadd(big, w.sqrt(d.mad(big, big, d.f(-1.0)))))
    out = e.select(e.cmp("<", x, e.f(2.0)), near, far)
    return e.select(e.cmp("<", x, e.f(1.0)), e.f(float("nan")), out)


def _asinh(e: _Emit, x: ir.Value) -> ir.Value:
    """log1p(a + a^2 / (1 + sqrt(1 + a^2))) below 2, log(a + sqrt(a^2 + 1)) above; odd."""
    w = _Wide(e)
    d = w.d
    a = e.call("llvm.fabs", x)
    big = w.ext(a)
    root = w.sqrt(d.mad(big, big, d.f(1.0)))
    near = _log1p(e, w.narrow(d.b.fadd(big, d.b.fdiv(d.b.fmul(big, big), d.b.fadd(root, d.f(1.0))))))
    far = _log_half_plus_ln2(w, d.b.fadd(big, root))
    return e.call("llvm.copysign", e.select(e.cmp("<", a, e.f(2.0)), near, far), x)


def _atanh(e: _Emit, x: ir.Value) -> ir.Value:
    """log1p(2a / (1 - a)) / 2 with the quotient in double (1 - a is exact); odd."""
    w = _Wide(e)
    d = w.d
    a = w.ext(e.call("llvm.fabs", x))
    z = d.b.fdiv(d.b.fadd(a, a), d.b.fsub(d.f(1.0), a))
    return e.call("llvm.copysign", e.b.fmul(_log1p(e, w.narrow(z)), e.f(0.5)), x)


def _pi_quadrant(e: _Emit, x: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """x = n/2 + s (mod 2) exactly with |s| <= 1/4: sin(pi s), cos(pi s), n mod 4.

    Below 2^23, r = x - 2 round(x/2) is exact; above, x is an integer, odd only
    below 2^24 and then when its last mantissa bit is set.
    """
    w = _Wide(e)
    n_half, _ = e.round(e.b.fmul(x, e.f(0.5)))
    r = e.b.fsub(x, e.b.fmul(n_half, e.f(2.0)))
    a = e.call("llvm.fabs", x)
    odd = e.b.and_(e.b.icmp_signed("!=", e.b.and_(e.bits(x), e.i(1)), e.i(0)),
                   e.cmp("<", a, e.f(16777216.0)))
    big_r = e.call("llvm.copysign", e.select(odd, e.f(1.0), e.f(0.0)), x)
    r = e.select(e.cmp(">=", a, e.f(8388608.0)), big_r, r)
    n_float, n = e.round(e.b.fadd(r, r))
    s = w.ext(e.b.fsub(r, e.b.fmul(n_float, e.f(0.5))))
    s2 = w.d.b.fmul(s, s)
    sin = w.narrow(w.d.b.fmul(s, w.poly(s2, _SINPI)))
    return sin, w.narrow(w.poly(s2, _COSPI)), e.b.and_(n, e.i(3))


def _by_quadrant(e: _Emit, q: ir.Value, values: tuple[ir.Value, ...]) -> ir.Value:
    out = values[3]
    for k in (2, 1, 0):
        out = e.select(e.b.icmp_signed("==", q, e.i(k)), values[k], out)
    return out


def _sinpi(e: _Emit, x: ir.Value) -> ir.Value:
    sin, cos, q = _pi_quadrant(e, x)
    out = _by_quadrant(e, q, (sin, cos, e.b.fneg(sin), e.b.fneg(cos)))
    out = e.select(e.cmp("==", out, e.f(0.0)), e.call("llvm.copysign", e.f(0.0), x), out)
    return e.select(_not_finite(e, x), e.f(float("nan")), out)


def _cospi(e: _Emit, x: ir.Value) -> ir.Value:
    sin, cos, q = _pi_quadrant(e, x)
    out = _by_quadrant(e, q, (cos, e.b.fneg(sin), e.b.fneg(cos), sin))
    out = e.select(e.cmp("==", out, e.f(0.0)), e.f(0.0), out)
    return e.select(_not_finite(e, x), e.f(float("nan")), out)


def _rcbrt(e: _Emit, x: ir.Value) -> ir.Value:
    """|x|^(-1/3) by Newton's method y <- y (4 - a y^3) / 3 in double, signed like x.

    The first guess negates a third of the exponent bits (a third as the shifts
    1/4 + 1/16 + ...), within 10%, so four steps reach double accuracy.
    """
    w = _Wide(e)
    d = w.d
    a = w.ext(e.call("llvm.fabs", x))
    bits = d.bits(a)
    third = d.b.lshr(bits, d.i(2))
    for k in range(2, 9):
        third = d.b.add(third, d.b.lshr(bits, d.i(2 * k)))
    y = d.from_bits(d.b.sub(d.i(0x5540000000000000), third))
    for _ in range(4):
        y3 = d.b.fmul(d.b.fmul(y, y), y)
        y = d.b.fmul(d.b.fmul(y, d.mad(d.b.fneg(a), y3, d.f(4.0))), d.f(1 / 3))
    out = w.narrow(y)
    out = e.select(e.cmp("==", x, e.f(0.0)), e.f(float("inf")), out)
    out = e.select(e.cmp("==", e.call("llvm.fabs", x), e.f(float("inf"))), e.f(0.0), out)
    return e.call("llvm.copysign", out, x)


def _logb(e: _Emit, x: ir.Value) -> ir.Value:
    """The exponent of x as a float (subnormals scaled by 2^23 first); -inf at 0."""
    a = e.call("llvm.fabs", x)
    tiny = e.cmp("<", a, e.f(1.1754943508222875e-38))
    scaled = e.select(tiny, e.b.fmul(a, e.f(8388608.0)), a)
    k = e.b.sub(e.b.lshr(e.bits(scaled), e.i(23)), e.select(tiny, e.i(127 + 23), e.i(127)))
    out = e.select(e.cmp("<", a, e.f(float("inf"))), e.b.sitofp(k, e.ty), a)  # inf and NaN
    return e.select(e.cmp("==", a, e.f(0.0)), e.f(float("-inf")), out)


def _tf32(e: _Emit, x: ir.Value) -> ir.Value:
    """x rounded to a 10-bit fraction, ties away from zero: the magnitude's bits plus half
    the unit dropped, the low 13 bits cleared; infinities and NaN as they are."""
    bits = e.bits(x)
    rounded = e.b.and_(e.b.add(bits, e.i(0x1000)), e.i(-0x2000))
    finite = e.b.icmp_unsigned("!=", e.b.and_(bits, e.i(0x7F800000)), e.i(0x7F800000))
    return e.from_bits(e.select(finite, rounded, bits))


def _nextafter(e: _Emit, x: ir.Value, y: ir.Value) -> ir.Value:
    """The float after x towards y: one step of x's bit pattern (sign-magnitude)."""
    away = e.b.icmp_unsigned("==", e.cmp("<", x, y), e.cmp(">", x, e.f(0.0)))
    out = e.from_bits(e.b.add(e.bits(x), e.select(away, e.i(1), e.i(-1))))
    out = e.select(e.cmp("==", x, e.f(0.0)), e.call("llvm.copysign", e.from_bits(e.i(1)), y), out)
    out = e.select(e.cmp("==", x, y), y, out)
    return e.select(e.b.fcmp_unordered("uno", x, y), e.b.fadd(x, y), out)


def _remainder(e: _Emit, x: ir.Value, y: ir.Value) -> ir.Value:
    """IEEE remainder, exactly: r = fmod(x, 2y) in double, then one or two y's off so
    that |r| <= |y|/2, a tie keeping the even quotient."""
    w = _Wide(e)
    d = w.d
    big_y = d.call("llvm.fabs", w.ext(y))
    r = d.b.frem(w.ext(x), d.b.fadd(big_y, big_y))
    a = d.call("llvm.fabs", r)
    step = e.select(d.cmp(">", a, d.b.fmul(big_y, d.f(0.5))), big_y, d.f(0.0))
    step = e.select(d.cmp(">=", a, d.b.fmul(big_y, d.f(1.5))), d.b.fadd(big_y, big_y), step)
    out = w.narrow(d.b.fsub(r, d.call("llvm.copysign", step, r)))
    return e.select(e.cmp("==", out, e.f(0.0)), e.call("llvm.copysign", e.f(0.0), x), out)


def _fdim(e: _Emit, x: ir.Value, y: ir.Value) -> ir.Value:
    zero_or_nan = e.select(e.b.fcmp_unordered("uno", x, y), e.b.fadd(x, y), e.f(0.0))
    return e.select(e.cmp(">", x, y), e.b.fsub(x, y), zero_or_nan)


def _norm(reciprocal: bool) -> Callable[..., ir.Value]:
    """sqrt(sum of squares) (or its reciprocal) in double, where it cannot overflow;
    inf if any argument is inf, even when another is NaN."""
    def body(e: _Emit, *xs: ir.Value) -> ir.Value:
        w = _Wide(e)
        total = w.d.f(0.0)
        infinite = None
        for x in xs:
            big = w.ext(x)
            total = w.d.mad(big, big, total)
            is_inf = e.cmp("==", e.call("llvm.fabs", x), e.f(float("inf")))
            infinite = is_inf if infinite is None else e.b.or_(infinite, is_inf)
        root = w.sqrt(total)
        out = w.narrow(w.d.b.fdiv(w.d.f(1.0), root) if reciprocal else root)
        return e.select(infinite, e.f(0.0 if reciprocal else float("inf")), out)
    return body


def _erfcinv_core(e: _Emit, a: ir.Value, b: ir.Value, factor: ir.Value) -> ir.Value:
    """erfc^-1(a) in double, given b = 2 - a and factor = 1 - a (both for accuracy)."""
    w = _Wide(e)
    big_w = w.ext(e.b.fneg(e.b.fadd(_log(e, a), _log(e, b))))
    s = w.sqrt(big_w)
    near = w.d.b.fmul(factor, w.poly(big_w, _ERFINV_NEAR))
    tail = e.select(w.d.cmp("<", s, w.d.f(4.5)), w.poly(s, _ERFINV_TAIL), w.poly(s, _ERFINV_FAR))
    out = e.select(w.d.cmp("<", big_w, w.d.f(6.25)), near, tail)
    return e.select(e.cmp("==", a, e.f(0.0)), w.d.f(float("inf")), out)


def _erfinv(e: _Emit, x: ir.Value) -> ir.Value:
    w = _Wide(e)
    a = e.call("llvm.fabs", x)
    core = _erfcinv_core(e, e.b.fsub(e.f(1.0), a), e.b.fadd(e.f(1.0), a), w.ext(a))
    return e.call("llvm.copysign", w.narrow(core), x)


def _erfcinv_wide(e: _Emit, c: ir.Value) -> ir.Value:
    """erfcinv in double; erfcinv(c) = -erfcinv(2 - c) (exact) above 1."""
    w = _Wide(e)
    upper = e.cmp(">", c, e.f(1.0))
    a = e.select(upper, e.b.fsub(e.f(2.0), c), c)
    core = _erfcinv_core(e, a, e.b.fsub(e.f(2.0), a), w.d.b.fsub(w.d.f(1.0), w.ext(a)))
    return e.select(upper, w.d.b.fneg(core), core)


def _erfcinv(e: _Emit, c: ir.Value) -> ir.Value:
    return _Wide(e).narrow(_erfcinv_wide(e, c))


def _normcdfinv(e: _Emit, p: ir.Value) -> ir.Value:
    w = _Wide(e)
    core = _erfcinv_wide(e, e.b.fadd(p, p))
    return w.narrow(w.d.b.fmul(core, w.d.f(-math.sqrt(2.0))))


def _erfcx_positive(w: _Wide, x: ir.Value) -> ir.Value:
    """erfcx for double x >= 0: P(t) / (1 + 2x), t = (x - 4)/(x + 4) = 1 - 8/(x + 4)."""
    d = w.d
    t = d.b.fsub(d.f(1.0), d.b.fdiv(d.f(8.0), d.b.fadd(x, d.f(4.0))))
    return d.b.fdiv(w.poly(t, _ERFCX), d.mad(x, d.f(2.0), d.f(1.0)))


def _erfcx(e: _Emit, x: ir.Value) -> ir.Value:
    """erfcx(x) for x >= 0; 2 e^{x^2} - erfcx(-x) below (x^2 exact in double)."""
    w = _Wide(e)
    d = w.d
    big = w.ext(x)
    positive = _erfcx_positive(w, d.call("llvm.fabs", big))
    negative = d.b.fsub(d.b.fmul(w.exp(d.b.fmul(big, big)), d.f(2.0)), positive)
    return w.narrow(e.select(e.cmp("<", x, e.f(0.0)), negative, positive))


def _normcdf(e: _Emit, x: ir.Value) -> ir.Value:
    """erfc(|x|/sqrt 2) / 2 as e^{-x^2/2} erfcx(|x|/sqrt 2) / 2 (x^2/2 exact); 1 minus it for x > 0."""
    w = _Wide(e)
    d = w.d
    big = w.ext(x)
    t = d.b.fmul(d.call("llvm.fabs", big), d.f(math.sqrt(0.5)))
    tail = d.b.fmul(d.b.fmul(w.exp(d.b.fmul(d.b.fmul(big, big), d.f(-0.5))), d.f(0.5)),
                    _erfcx_positive(w, t))
    return w.narrow(e.select(e.cmp(">", x, e.f(0.0)), d.b.fsub(d.f(1.0), tail), tail))


def _bessel_i(order: int) -> Callable[[_Emit, ir.Value], ir.Value]:
    """I0 (even) or I1 (odd): P(x^2) (times x for I1) up to 8, e^x P(8/x) / sqrt(x) beyond,
    with e^x as (e^{x/2})^2 so that it overflows only where I does."""
    near_poly, far_poly = (_I0_NEAR, _I0_FAR) if order == 0 else (_I1_NEAR, _I1_FAR)

    def body(e: _Emit, x: ir.Value) -> ir.Value:
        w = _Wide(e)
        d = w.d
        a = e.call("llvm.fabs", x)
        big = w.ext(a)
        near = w.poly(d.b.fmul(big, big), near_poly)
        if order == 1:
            near = d.b.fmul(near, big)
        half = w.ext(_exp(e, e.b.fmul(a, e.f(0.5))))
        far = d.b.fdiv(d.b.fmul(d.b.fmul(half, half), w.poly(d.b.fdiv(d.f(8.0), big), far_poly)),
                       w.sqrt(big))
        out = w.narrow(e.select(e.cmp("<=", a, e.f(8.0)), near, far))
        out = e.select(e.cmp("==", a, e.f(float("inf"))), a, out)
        return out if order == 0 else e.call("llvm.copysign", out, x)
    return body


BODIES: dict[str, tuple[int, Callable[..., ir.Value]]] = {
    "exp10": (1, _exp10), "acosh": (1, _acosh), "asinh": (1, _asinh), "atanh": (1, _atanh),
    "sinpi": (1, _sinpi), "cospi": (1, _cospi), "rcbrt": (1, _rcbrt), "logb": (1, _logb), "tf32": (1, _tf32),
    "erfinv": (1, _erfinv), "erfcinv": (1, _erfcinv), "normcdfinv": (1, _normcdfinv),
    "erfcx": (1, _erfcx), "normcdf": (1, _normcdf), "cyl_bessel_i0": (1, _bessel_i(0)),
    "cyl_bessel_i1": (1, _bessel_i(1)), "nextafter": (2, _nextafter), "fdim": (2, _fdim), "remainder": (2, _remainder),
    "hypot": (2, _norm(False)), "rhypot": (2, _norm(True)), "norm3d": (3, _norm(False)),
    "rnorm3d": (3, _norm(True)), "norm4d": (4, _norm(False)), "rnorm4d": (4, _norm(True)),
}

# frem (fmod) has no scalable-vector form: SVE loops over these stay scalar
NOT_SCALABLE: frozenset[str] = frozenset({"remainder"})
