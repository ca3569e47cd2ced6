"""Element types shared by every IR level.

The narrow types ONNX defines (float8 in its five formats, float4 e2m1, int4, uint4,
int2, uint2) are *storage types* of the graph level only: a value of one is held in a
wider type, its :attr:`DType.storage` (float32 for the floats, int8 or uint8 for the
integers), from the graph's inputs through every kernel to its outputs, and crosses the
API in its own ml_dtypes dtype (:attr:`DType.numpy`), converted at the feed and at the
outputs. The comprehension and loop levels, the scheduler and the targets never see
them: an op that makes such a value (Cast, QuantizeLinear) rounds it in its kernel to
a value of the narrow type, so the wider container only ever holds values the narrow
type has, and everything else (movement, memory plans, every target) works unchanged
on the container. Holding them packed would ask every target for sub-byte loads and
stores and float8 arithmetic for a handful of ops that only convert.
"""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np


class DType(enum.Enum):
    """An element type. ``value`` is the canonical name used in every IR text form."""

    BOOL = "bool"
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    UINT8 = "uint8"
    UINT16 = "uint16"
    UINT32 = "uint32"
    UINT64 = "uint64"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    # the narrow storage types (see the module docstring), named as ONNX names them
    FLOAT8E4M3FN = "float8e4m3fn"
    FLOAT8E4M3FNUZ = "float8e4m3fnuz"
    FLOAT8E5M2 = "float8e5m2"
    FLOAT8E5M2FNUZ = "float8e5m2fnuz"
    FLOAT8E8M0 = "float8e8m0"
    FLOAT4E2M1 = "float4e2m1"
    INT4 = "int4"
    UINT4 = "uint4"
    INT2 = "int2"
    UINT2 = "uint2"

    def __str__(self) -> str:
        return self.value

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_int(self) -> bool:
        return self in _INTS

    @property
    def is_unsigned(self) -> bool:
        return self in _UNSIGNED

    @property
    def is_bool(self) -> bool:
        return self is DType.BOOL

    @property
    def bits(self) -> int:
        return _BITS[self]

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype that stores this type."""
        return _NUMPY[self]

    @property
    def numpy_name(self) -> str:
        """How Python code names :attr:`numpy`: ``np.float32``, ``ml_dtypes.int4``."""
        return f"ml_dtypes.{self.numpy.name}" if self in _ML_DTYPES else f"np.{self.numpy.name}"

    @property
    def compute(self) -> DType:
        """The type arithmetic runs in: 16-bit floats are storage types computed in float32."""
        return DType.FLOAT32 if self in (DType.FLOAT16, DType.BFLOAT16) else self.storage

    @property
    def storage(self) -> DType:
        """The type kernels hold this type's values in: itself, or for a narrow type
        (float8, float4, int4, ...) the wider type of the module docstring."""
        return _STORAGE.get(self, self)

    @property
    def is_narrow(self) -> bool:
        """Whether this is a narrow type, which only the graph level names."""
        return self in _STORAGE

    @staticmethod
    def from_name(name: str) -> DType | None:
        """The type a TC type name denotes (``float`` is float32), or None if unknown."""
        return _NAMES.get(name)

    @staticmethod
    def from_numpy(dtype: np.dtype) -> DType | None:
        """The DType stored as ``dtype``, or None if polyfuse has no such type."""
        return _FROM_NUMPY.get(np.dtype(dtype))


_ML_DTYPES = {DType.BFLOAT16: ml_dtypes.bfloat16, DType.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn,
              DType.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
              DType.FLOAT8E5M2: ml_dtypes.float8_e5m2, DType.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
              DType.FLOAT8E8M0: ml_dtypes.float8_e8m0fnu, DType.FLOAT4E2M1: ml_dtypes.float4_e2m1fn,
              DType.INT4: ml_dtypes.int4, DType.UINT4: ml_dtypes.uint4, DType.INT2: ml_dtypes.int2,
              DType.UINT2: ml_dtypes.uint2}
_STORAGE = {DType.INT4: DType.INT8, DType.INT2: DType.INT8, DType.UINT4: DType.UINT8,
            DType.UINT2: DType.UINT8} | {d: DType.FLOAT32 for d in _ML_DTYPES
                                        if d.value.startswith(("float8", "float4"))}
_FLOATS = frozenset({DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64}) | \
    frozenset(d for d, s in _STORAGE.items() if s is DType.FLOAT32)
_UNSIGNED = frozenset({DType.UINT8, DType.UINT16, DType.UINT32, DType.UINT64, DType.UINT4, DType.UINT2})
_INTS = frozenset({DType.INT8, DType.INT16, DType.INT32, DType.INT64, DType.INT4, DType.INT2}) | _UNSIGNED
_BITS = {DType.BOOL: 8, DType.INT8: 8, DType.INT16: 16, DType.INT32: 32, DType.INT64: 64,
         DType.UINT8: 8, DType.UINT16: 16, DType.UINT32: 32, DType.UINT64: 64, DType.FLOAT16: 16, DType.BFLOAT16: 16, DType.FLOAT32: 32,
         DType.FLOAT64: 64, DType.INT4: 4, DType.UINT4: 4, DType.INT2: 2, DType.UINT2: 2,
         DType.FLOAT4E2M1: 4} | {d: 8 for d in _STORAGE if d.value.startswith("float8")}
_NUMPY = {d: np.dtype(_ML_DTYPES[d] if d in _ML_DTYPES else d.value) for d in DType}
_FROM_NUMPY = {v: k for k, v in _NUMPY.items()}
# the names TC source may use: no narrow type (kernels hold those in their storage)
_NAMES = {d.value: d for d in DType if not d.is_narrow} | {
    "float": DType.FLOAT32, "double": DType.FLOAT64, "half": DType.FLOAT16,
    "int": DType.INT32, "long": DType.INT64, "char": DType.INT8, "short": DType.INT16,
}


def promote(a: DType, b: DType) -> DType:
    """The common type of two strongly typed operands of an arithmetic operator.

    C-like: a float beats an int, the wider float wins (float16 with bfloat16 gives
    float32), integers follow numpy's rules but never turn into floats.
    """
    if a is b:
        return a
    if a.is_bool:
        return promote(DType.INT32, b) if not b.is_bool else a
    if b.is_bool:
        return promote(a, DType.INT32)
    if a.is_float and b.is_float:
        if a.bits == b.bits:
            return DType.FLOAT32 if a.bits == 16 else a
        return a if a.bits > b.bits else b
    if a.is_float:
        return a
    if b.is_float:
        return b
    joined = DType.from_numpy(np.promote_types(a.numpy, b.numpy))
    return joined if joined is not None and joined.is_int else DType.INT64


def float_to_int(x: object, dst: DType) -> np.ndarray:
    """Floats converted to the integer type ``dst`` as every target converts them: toward
    zero into 64 bits, saturating (NaN is 0, values past the ends give the ends), then
    narrowed modulo 2**bits like any 64-bit integer (``uint8(-1.5) == 255``); uint64
    saturates at 0 and 2**64 - 1 itself."""
    v = np.asarray(x, dtype=np.float64)
    if dst is DType.UINT64:
        lo, hi, top = v < 1.0, v >= 2.0**64, np.uint64(2**64 - 1)
        out = np.trunc(np.where(np.isnan(v) | lo | hi, 0.0, v)).astype(np.uint64)
        return np.where(hi, top, out)
    lo, hi = v < -2.0**63, v >= 2.0**63
    out = np.trunc(np.where(np.isnan(v) | lo | hi, 0.0, v)).astype(np.int64)
    out = np.where(lo, np.int64(-2**63), np.where(hi, np.int64(2**63 - 1), out))
    return out.astype(dst.numpy)


def reinterpret(x: object, src: DType, dst: DType) -> np.ndarray:
    """Values of ``src`` with their bits read as ``dst``, a type as wide; a nonzero byte
    reads as a true bool."""
    bits = np.asarray(x).astype(src.numpy).view(np.dtype(f"uint{src.bits}"))
    return bits != 0 if dst.is_bool else bits.view(dst.numpy)


CONSTANT_ALIGNMENT = 64   # bytes: a cache line, and a 512-bit vector


def aligned_array(x: object, alignment: int = CONSTANT_ALIGNMENT) -> np.ndarray:
    """``x`` as a C-contiguous array whose data starts at a multiple of ``alignment``
    bytes: itself where it already is one, else a copy. Constants are kept so: kernels
    read weights they do not pack as whole vectors, and numpy places large arrays 16
    bytes past a line, so each 64-byte vector of them would straddle two cache lines
    (a 1x1 convolution reading its weights so ran slower: benchmarks/LOG.md). Arrays of objects (ONNX
    strings) stay as they are."""
    a = np.asarray(x)
    if a.dtype.hasobject or (a.flags.c_contiguous and a.ctypes.data % alignment == 0):
        return a
    raw = np.empty(a.nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out
