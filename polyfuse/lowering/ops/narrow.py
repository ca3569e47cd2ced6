"""Conversions to the narrow types (float8, float4, float8 e8m0, int4, int2) as TC
expressions, for Cast, CastLike and QuantizeLinear.

A narrow value lives in a kernel as its storage type (float32, int8 or uint8; see
:mod:`polyfuse.ir.types`), so converting to a narrow type means computing, in the
storage type, the value the narrow type rounds to: the kernel then holds only values
the narrow type has, wherever in a graph the cast sits.

The float formats round to nearest, ties to even, as ONNX's Cast specifies: with ``a =
|x|`` and ``e`` its exponent (at least the format's smallest normal exponent), the
format's spacing at ``a`` is ``q = 2^(e - mantissa bits)`` and ``rint(a / q) * q`` is
``a`` rounded (the division and product by a power of two are exact). Past the largest
finite value a saturating cast gives that value, a non-saturating one infinity (e5m2)
or NaN (the formats without infinity); float4 e2m1 has neither and always saturates
(NaN becomes 0).
The FNUZ formats have no -0. Float8 e8m0 (a power of two) follows
``onnx.numpy_helper.to_float8e8m0``: the float32 exponent, rounded ``up`` (any
fraction), ``down`` or to ``nearest`` (ROUND_MODES). Floats become int4/int2 truncated toward zero,
0 when out of range (as ml_dtypes, the reference evaluator's, converts them; ONNX
leaves it undefined); integers wrap (their low bits), as ONNX's integer casts do.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import literal


@dataclass(frozen=True)
class _Format:
    mantissa: int         # fraction bits
    emin: int             # exponent of the smallest normal number
    overflow: str         # a value past the largest without saturation: "inf", "nan" or "max"
    negative_zero: bool


_FORMATS = {
    DType.FLOAT8E4M3FN: _Format(3, -6, "nan", True),
    DType.FLOAT8E4M3FNUZ: _Format(3, -7, "nan", False),
    DType.FLOAT8E5M2: _Format(2, -14, "inf", True),
    DType.FLOAT8E5M2FNUZ: _Format(2, -15, "nan", False),
    DType.FLOAT4E2M1: _Format(1, 0, "max", True),
}

Lets = dict[str, str]
ROUND_MODES = ("up", "down", "nearest")


def narrowed(x: str, src: DType, to: DType, *, saturate: bool = True,
             round_mode: str = "up") -> tuple[str, Lets]:
    """An expression (with the names it binds, ``lets``) of the value of narrow type
    ``to`` that ``x``, of storage type ``src``, converts to, in ``to``'s storage type."""
    if to is DType.FLOAT8E8M0:
        return _power_of_two(x, saturate, round_mode)
    if to.is_float:
        return _rounded(x, src, to, saturate)
    lo, hi = (int(v) for v in (ml_dtypes.iinfo(to.numpy).min, ml_dtypes.iinfo(to.numpy).max))
    if src.is_float:
        f = DType.FLOAT64 if src is DType.FLOAT64 else DType.FLOAT32
        inside = f"n_x > {literal(lo - 1, f)} && n_x < {literal(hi + 1, f)}"
        return f"({inside}) ? {to.storage}(n_x) : {literal(0, to.storage)}", {"n_x": f"{f}({x})"}
    low = f"(int64({x}) & {hi - lo})"
    return (low if lo == 0 else f"(({low} ^ {-lo}) - {-lo})"), {}


def _rounded(x: str, src: DType, to: DType, saturate: bool) -> tuple[str, Lets]:
    """``x`` rounded to the float format ``to`` (the module docstring), in float64 for a
    float64 ``x`` (so it rounds once), else in float32, which holds every other type's
    values exactly or rounds them far past the format's range."""
    fmt = _FORMATS[to]
    f = DType.FLOAT64 if src is DType.FLOAT64 else DType.FLOAT32
    i, fraction, bias = (DType.INT64, 52, 1023) if f is DType.FLOAT64 else (DType.INT32, 23, 127)
    top = float(ml_dtypes.finfo(to.numpy).max)
    lets = {"n_x": f"{f}({x})",
            "n_a": "abs(n_x)",
            "n_e": f"max(((as_{i}(n_a) >> {fraction}) & {2 * bias + 1}) - {bias}, {fmt.emin})",
            "n_q": f"as_{f}({i}(n_e + {bias - fmt.mantissa}) << {fraction})",
            "n_r": "rint(n_a / n_q) * n_q"}
    if saturate or fmt.overflow == "max":
        magnitude = f"min(n_r, {literal(top, f)})"
    else:
        magnitude = f"(n_r > {literal(top, f)} ? {literal(float(fmt.overflow), f)} : n_r)"
    lets["n_m"] = magnitude
    signed = "copysign(n_m, n_x)" if fmt.negative_zero else \
        f"(n_m == {literal(0, f)} ? n_m : copysign(n_m, n_x))"
    # float4 has no NaN: ml_dtypes (the reference evaluator's) gives the zero of the
    # opposite sign
    nan = f"copysign({literal(0, f)}, -n_x)" if fmt.overflow == "max" else "n_x"
    return f"n_x != n_x ? {nan} : {signed}", lets


def _power_of_two(x: str, saturate: bool, round_mode: str) -> tuple[str, Lets]:
    """Float8 e8m0: the biased float32 exponent ``n_e`` (255: NaN), plus one where the
    rounding goes up; below 2^-126 the value is float32's subnormal 2^-127."""
    up = {"up": "(n_b & 8388607) != 0",
          "nearest": "(n_b & 4194304) != 0 && ((n_b & 4194303) != 0 || n_f > 0)",
          "down": ""}[round_mode]
    cap = " && n_f != 254" if saturate else ""
    lets = {"n_b": f"as_int32(float32({x}))", "n_f": "(n_b >> 23) & 255",
            "n_e": f"n_f + ((n_f < 255{cap} && {up}) ? 1 : 0)" if up else "n_f"}
    nan = literal(float("nan"), DType.FLOAT32)
    return (f"n_e >= 255 ? {nan} : (n_e == 0 ? as_float32(4194304) : as_float32(n_e << 23))",
            lets)
