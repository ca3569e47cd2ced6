"""The reference interpreter's implementations of TC's builtins that numpy lacks.

TC's builtins are CUDA's single-precision math functions. Here each is computed in
float64 from float32 (or float64) arguments with methods independent of the
compiled targets' float32 algorithms: power series where they converge without
harmful cancellation, Hankel's asymptotic expansion beyond, Newton's method for the
inverse error functions, ``math`` for gamma and remainder. The interpreter rounds
the results to the call's type. For float32 arguments the results are within
1 ulp of correctly rounded.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

_EULER = 0.57721566490153286061


def _wide(*xs: np.ndarray) -> list[np.ndarray]:
    return [np.asarray(x, np.float64) for x in xs]


def _pointwise(fn: Callable[[float], float], on_error: Callable[[float], float]
               ) -> Callable[[np.ndarray], np.ndarray]:
    """``fn`` elementwise in float64, with ``on_error(x)`` where ``math`` raises."""
    def safe(x: float) -> float:
        try:
            return fn(x)
        except (ValueError, OverflowError):
            return on_error(x)
    vectorized = np.vectorize(safe, otypes=[np.float64])
    return lambda x: vectorized(np.asarray(x, np.float64))


_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])
lgamma = _pointwise(math.lgamma, lambda x: math.inf)
tgamma = _pointwise(math.gamma, lambda x: math.copysign(math.inf, x) if x == 0 or x > 0
                    else math.nan)
_remainder = np.vectorize(lambda x, y: math.remainder(x, y) if math.isfinite(x) and y != 0
                          and not math.isnan(y) else math.nan, otypes=[np.float64])


def remainder(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return _remainder(*_wide(x, y))


def round_half_away(x: np.ndarray) -> np.ndarray:
    """C's ``round``: to the nearest integer, ties away from zero."""
    t = np.trunc(x)
    with np.errstate(invalid="ignore"):
        return np.where(np.abs(x - t) >= 0.5, t + np.copysign(1, x), t)


def _pi_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x = n/2 + s (mod 2) exactly, |s| <= 1/4: returns sin(pi s), cos(pi s), n mod 4."""
    r = np.fmod(np.asarray(x, np.float64), 2.0)
    n = np.rint(2 * r)
    s = r - n / 2
    return np.sin(np.pi * s), np.cos(np.pi * s), np.mod(n, 4)


def sinpi(x: np.ndarray) -> np.ndarray:
    sin, cos, q = _pi_parts(x)
    out = np.select([q == 0, q == 1, q == 2], [sin, cos, -sin], -cos)
    return np.where(out == 0, np.copysign(0.0, x), out)


def cospi(x: np.ndarray) -> np.ndarray:
    sin, cos, q = _pi_parts(np.abs(x))
    out = np.select([q == 0, q == 1, q == 2], [cos, -sin, -cos], sin)
    return np.where(out == 0, 0.0, out)


def exp10(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.power(10.0, np.asarray(x, np.float64))


def fdim(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    x, y = _wide(x, y)
    return np.where(x > y, x - y, np.where(np.isnan(x) | np.isnan(y), np.nan, 0.0))


def fma(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """x * y + z rounded once: exact for float32 arguments (the product is exact in
    float64, and the sum is rounded to odd so that rounding it to float32 is correct)."""
    if np.result_type(x, y, z) == np.float64:
        return x * y + z
    p, z = np.asarray(x, np.float64) * np.asarray(y, np.float64), np.asarray(z, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + z
        error = (p - (s - (s - p))) + (z - (s - p))      # Knuth's two-sum
        even = (s.view(np.int64) & 1) == 0
        odd = np.nextafter(s, s + error)
        return np.where(np.isfinite(s) & (error != 0) & even, odd, s)


def norm(*xs: np.ndarray) -> np.ndarray:
    """sqrt(sum of squares), inf if any argument is inf even when another is NaN."""
    wide = _wide(*xs)
    out = np.sqrt(sum(x * x for x in wide))
    return np.where(np.any([np.isinf(x) for x in wide], axis=0), np.inf, out)


def logb(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    exponent = np.frexp(x)[1] - 1.0
    return np.where(x == 0, -np.inf, np.where(np.isfinite(x), exponent, np.abs(x)))


def rcbrt(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return 1 / np.cbrt(np.asarray(x, np.float64))


def normcdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * _erfc(-np.asarray(x, np.float64) / math.sqrt(2.0))


def erfcx(x: np.ndarray) -> np.ndarray:
    """exp(x^2) erfc(x); beyond x = 26 (erfc underflows) its asymptotic series."""
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        near = np.exp(x * x) * _erfc(np.minimum(x, 26.0))
        v = 1 / (2 * x * x)
        far = (1 - v * (1 - 3 * v * (1 - 5 * v * (1 - 7 * v)))) / (x * math.sqrt(math.pi))
    return np.where(x < 26, near, far)


def erfcinv(c: np.ndarray) -> np.ndarray:
    """The y with erfc(y) = c, by Newton's method on log erfc (monotone from the right)."""
    c = np.asarray(c, np.float64)
    low = np.where(c > 1, 2 - c, c)          # erfcinv(2 - c) = -erfcinv(c)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        y = np.sqrt(np.maximum(-np.log(low * (2 - low)), 0.0))
        ok = (low > 0) & (low <= 1)
        target = np.log(np.where(ok, low, 1.0))
        y = np.where(ok, y, 0.0)
        for _ in range(40):
            e = _erfc(y)
            step = (np.log(e) - target) / (-2 / math.sqrt(math.pi) * np.exp(-y * y) / e)
            y = np.where(ok & (e > 0), y - step, y)
    y = np.where(low == 0, np.inf, np.where(ok, y, np.nan))
    return np.where(c > 1, -y, y)


def erfinv(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    y = a * math.sqrt(math.pi) / 2                # Newton on erf(y) = |x| near 0
    for _ in range(8):
        y = y - (_erf(y) - a) / (2 / math.sqrt(math.pi) * np.exp(-y * y))
    return np.copysign(np.where(a <= 0.5, y, erfcinv(1 - a)), x)


def normcdfinv(p: np.ndarray) -> np.ndarray:
    return -math.sqrt(2.0) * erfcinv(2 * np.asarray(p, np.float64))


def cyl_bessel_i0(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = np.asarray(x, np.float64)
        return np.where(np.isinf(x), np.inf, np.i0(np.where(np.isinf(x), 0.0, x)))


def cyl_bessel_i1(x: np.ndarray) -> np.ndarray:
    """Its power series, all of whose terms are positive; inf beyond float32's range."""
    x = np.asarray(x, np.float64)
    h = np.minimum(np.abs(x), 100.0) / 2
    term, total = h.copy(), h.copy()
    for k in range(160):
        term = term * h * h / ((k + 1) * (k + 2))
        total = total + term
    return np.copysign(np.where(np.abs(x) > 100, np.inf, total), x)


def _bessel_series(x: np.ndarray, order: int) -> tuple[np.ndarray, np.ndarray]:
    """J and the non-logarithmic part of Y (A&S 9.1.10-11) for 0 < x <= 12."""
    q = -(x * x) / 4
    term = np.ones_like(x) if order == 0 else x / 2          # (x/2)^n (-x^2/4)^k / (k! (n+k)!)
    j, rest = np.zeros_like(x), np.zeros_like(x)
    harmonic = 0.0                                           # H_k
    for k in range(60):
        j = j + term
        psi = 2 * harmonic - 2 * _EULER if order == 0 else 2 * harmonic + 1 / (k + 1) - 2 * _EULER
        rest = rest + psi * term
        harmonic += 1 / (k + 1)
        term = term * q / ((k + 1) * (k + 1 + order))
    return j, rest


def _bessel_far(x: np.ndarray, order: int) -> tuple[np.ndarray, np.ndarray]:
    """Hankel's expansion for x >= 12: J and Y from P, Q and the phase x - (2n+1) pi/4."""
    mu = 4.0 * order * order
    p, q = np.zeros_like(x), np.zeros_like(x)
    term = np.ones_like(x)                                   # a_k(n) / x^k
    for k in range(24):
        sign = 1 if k % 4 in (0, 1) else -1
        if k % 2 == 0:
            p = p + sign * term
        else:
            q = q + sign * term
        term = term * (mu - (2 * k + 1) ** 2) / ((k + 1) * 8 * x)
    phase = (2 * order + 1) * math.pi / 4
    cos = np.cos(x) * math.cos(phase) + np.sin(x) * math.sin(phase)
    sin = np.sin(x) * math.cos(phase) - np.cos(x) * math.sin(phase)
    amplitude = np.sqrt(2 / (math.pi * x))
    return amplitude * (p * cos - q * sin), amplitude * (p * sin + q * cos)


def _bessel(x: np.ndarray, order: int) -> tuple[np.ndarray, np.ndarray]:
    """J_n(|x|) and Y_n(|x|) for n = 0, 1."""
    a = np.abs(np.asarray(x, np.float64))
    with np.errstate(all="ignore"):
        small = np.where(a <= 12, a, 1.0)
        j_near, rest = _bessel_series(small, order)
        y_near = 2 / math.pi * np.log(small / 2) * j_near - rest / math.pi
        if order == 1:
            y_near = y_near - 2 / (math.pi * small)
        big = np.where(np.isfinite(a) & (a > 12), a, 13.0)
        j_far, y_far = _bessel_far(big, order)
    j = np.where(a <= 12, j_near, np.where(np.isinf(a), 0.0, np.where(np.isnan(a), a, j_far)))
    y = np.where(a <= 12, y_near, np.where(np.isinf(a), 0.0, np.where(np.isnan(a), a, y_far)))
    return j, np.where(a == 0, -np.inf, y)


def j0(x: np.ndarray) -> np.ndarray:
    return _bessel(x, 0)[0]


def j1(x: np.ndarray) -> np.ndarray:
    return np.where(np.asarray(x) < 0, -1.0, 1.0) * _bessel(x, 1)[0]


def y0(x: np.ndarray) -> np.ndarray:
    return np.where(np.asarray(x) < 0, np.nan, _bessel(x, 0)[1])


def y1(x: np.ndarray) -> np.ndarray:
    return np.where(np.asarray(x) < 0, np.nan, _bessel(x, 1)[1])


def dot4(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The ``dot4`` builtin: the sum of the products of the 4 bytes of each int32 of ``a``,
    unsigned, with those of ``b``, signed."""
    a = np.asarray(a).astype(np.int32).view(np.uint32).astype(np.int64)
    b = np.asarray(b).astype(np.int32).view(np.uint32).astype(np.int64)
    total = np.zeros(np.broadcast(a, b).shape, np.int64)
    for shift in range(0, 32, 8):
        byte = (b >> shift) & 255
        total += ((a >> shift) & 255) * (byte - ((byte & 128) << 1))
    return total


def bfdot2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The ``bfdot2`` builtin: the float32 sum of the products of the two bfloat16 halves
    of each int32 of ``a`` with those of ``b``."""
    def halves(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w = np.asarray(words).astype(np.int64) & 0xFFFFFFFF
        return ((w & 0xFFFF0000).astype(np.uint32).view(np.float32),
                ((w & 0xFFFF) << 16).astype(np.uint32).view(np.float32))
    (a1, a0), (b1, b0) = halves(a), halves(b)
    return a1 * b1 + a0 * b0


def tf32(x: np.ndarray) -> np.ndarray:
    """The ``tf32`` builtin: float32 ``x`` rounded to a 10-bit fraction, to nearest with
    ties away from zero (the magnitude's bits plus half the dropped unit, truncated);
    infinities and NaN as they are."""
    x = np.asarray(x)
    bits = x.astype(np.float32).view(np.uint32)
    finite = (bits & 0x7F800000) != 0x7F800000
    rounded = np.where(finite, (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000), bits).astype(np.uint32)
    return rounded.view(np.float32).astype(x.dtype if x.dtype.kind == "f" else np.float32)


FUNCTIONS: dict[str, Callable[..., np.ndarray]] = {
    "dot4": dot4, "bfdot2": bfdot2, "tf32": tf32,
    "round": round_half_away, "rint": np.rint, "acosh": np.arccosh, "asinh": np.arcsinh,
    "atanh": np.arctanh, "copysign": np.copysign, "cospi": cospi, "sinpi": sinpi,
    "cyl_bessel_i0": cyl_bessel_i0, "cyl_bessel_i1": cyl_bessel_i1, "erfinv": erfinv,
    "erfcinv": erfcinv, "erfcx": erfcx, "exp10": exp10, "j0": j0, "j1": j1, "y0": y0, "y1": y1,
    "lgamma": lgamma, "tgamma": tgamma, "logb": logb, "normcdf": normcdf,
    "normcdfinv": normcdfinv, "rcbrt": rcbrt,
    "fdim": fdim, "fdivide": np.true_divide, "hypot": norm, "nextafter": np.nextafter,
    "remainder": remainder, "rhypot": lambda x, y: 1 / norm(x, y), "fma": fma,
    "norm3d": norm, "rnorm3d": lambda x, y, z: 1 / norm(x, y, z), "norm4d": norm,
    "rnorm4d": lambda x, y, z, w: 1 / norm(x, y, z, w),
}
