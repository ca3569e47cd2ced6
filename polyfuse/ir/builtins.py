"""The scalar builtin functions of the comprehension IR (what TC calls intrinsics).

Each level that executes code (the reference interpreter, the LLVM and CUDA emitters)
keeps its own table of implementations keyed by these names.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from polyfuse.ir.types import DType


class BuiltinKind(enum.Enum):
    FLOAT = "float"      # computes on floats; integer arguments are converted to float32
    NUMERIC = "numeric"  # keeps its argument type (abs, max, min)
    BITS = "bits"        # reads its argument's bits as the type ``result`` (as_float32)
    WORDS = "words"      # reads int32 arguments as packed narrow values (dot4, bfdot2)


@dataclass(frozen=True, slots=True)
class Builtin:
    name: str
    arity: int
    kind: BuiltinKind
    result: DType | None = None   # the type of a BITS or WORDS builtin


def _table(kind: BuiltinKind, arity: int, names: str) -> dict[str, Builtin]:
    return {n: Builtin(n, arity, kind) for n in names.split()}


BUILTINS: dict[str, Builtin] = {
    **_table(BuiltinKind.FLOAT, 1, "exp exp2 expm1 log log2 log10 log1p sqrt rsqrt cbrt "
                                   "tanh sinh cosh sigmoid erf erfc fabs floor ceil round trunc "
                                   "sin cos tan asin acos atan"),
    # the rest of CUDA's single-precision math, which TC offers as builtins;
    # round rounds half away from zero (roundf), rint half to even
    **_table(BuiltinKind.FLOAT, 1, "rint acosh asinh atanh cospi sinpi cyl_bessel_i0 "
                                   "cyl_bessel_i1 erfinv erfcinv erfcx exp10 j0 j1 y0 y1 "
                                   "lgamma tgamma logb normcdf normcdfinv rcbrt"),
    **_table(BuiltinKind.FLOAT, 2, "fmax fmin pow atan2 fmod copysign fdim fdivide hypot "
                                   "nextafter remainder rhypot"),
    **_table(BuiltinKind.FLOAT, 3, "fma norm3d rnorm3d"),
    **_table(BuiltinKind.FLOAT, 4, "norm4d rnorm4d"),
    **_table(BuiltinKind.NUMERIC, 1, "abs"),
    **_table(BuiltinKind.NUMERIC, 2, "max min"),
    # floor division and modulo (the divisor's sign), beside `/` and `%`, which truncate
    # as in C: what ONNX lowerings and isl's floord need where a dividend may be negative
    **_table(BuiltinKind.NUMERIC, 2, "floordiv floormod"),
    # bit reinterpretation between types of one width, named as OpenCL's as_<type>; a
    # nonzero byte reads as a true bool
    **{f"as_{d}": Builtin(f"as_{d}", 1, BuiltinKind.BITS, d) for d in DType
       if not d.is_narrow},
    # the int8 dot product of x86's VNNI (vpdpbusd) and ARM's USDOT: dot4(a, b) sums the
    # four products of a's bytes, unsigned, and b's, signed, the bytes in memory order
    # (little-endian: byte j is bits 8j to 8j + 7); 4 x 255 x 128 fits int32
    "dot4": Builtin("dot4", 2, BuiltinKind.WORDS, DType.INT32),
    # the bfloat16 dot product of x86's AVX512-BF16 (vdpbf16ps) and ARM's BFDOT:
    # bfdot2(a, b) sums in float32 the two products of a's bfloat16 halves and b's (each
    # product exact; the low half is the first element in memory)
    "bfdot2": Builtin("bfdot2", 2, BuiltinKind.WORDS, DType.FLOAT32),
    # x rounded to TF32 (a float32 with a 10-bit fraction: what NVIDIA's tensor cores
    # multiply), to nearest with ties away from zero (PTX's cvt.rna.tf32.f32); a float32
    # with the low 13 bits of its fraction zero
    **_table(BuiltinKind.FLOAT, 1, "tf32"),
}


def reinterpreted(fn: str) -> DType | None:
    """The type a bit-reinterpreting builtin gives (``as_int32``: int32), else None."""
    builtin = BUILTINS.get(fn)
    return builtin.result if builtin is not None and builtin.kind is BuiltinKind.BITS else None
