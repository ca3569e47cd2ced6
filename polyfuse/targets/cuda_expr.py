"""Loop-IR expressions -> CUDA C expressions.

The same semantics as the LLVM emitter: every integer is a ``long long`` (narrowed only
when stored or cast; a shift's operands are values of its type), except the index
arithmetic of loop variables and literals in a launch whose indices fit in 32 bits
(:func:`polyfuse.targets.cuda_codegen.narrow_indices`: ``int``, proven not to overflow);
bool is ``bool``, float16 and bfloat16 are computed as float and stored as 16-bit patterns (converted with PTX ``cvt`` and round-to-nearest-even bit
arithmetic, so no CUDA header is needed). Integer division and modulo truncate as in C
(``floordiv`` and ``floormod`` floor) and give 0 for a zero divisor (uint64, whose bits a ``long long`` holds, divides, compares and
converts unsigned); float ``max``/``min`` propagate NaN; ``c ? a : b`` reads only the
chosen side. Float literals are written in hexadecimal, so they are exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from polyfuse.errors import CodegenError
from polyfuse.ir.builtins import reinterpreted
from polyfuse.ir.comprehension import (Binary, BinaryOp, Call, Cast, Expr, IndexVar, Literal,
                                       LocalRef, Read, ScalarRef, Select, SizeVar, Unary, UnaryOp)
from polyfuse.ir.types import DType

# 32-bit index arithmetic holds every value within this (sums of two such stay int32);
# narrow code writes literals within it as int, others as long long
INT32_SPAN = 2**30

# device functions a kernel may call, by name (a kernel's source holds those it calls)
HELPERS: dict[str, str] = {
    "pf_h2f": """__device__ __forceinline__ float pf_h2f(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }""",
    "pf_f2h": """__device__ __forceinline__ unsigned short pf_f2h(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }""",
    "pf_bf2f": """__device__ __forceinline__ float pf_bf2f(unsigned short b) {
  return __uint_as_float(((unsigned int)b) << 16); }""",
    "pf_f2bf": """__device__ __forceinline__ unsigned short pf_f2bf(float f) {
  unsigned int u = __float_as_uint(f);
  if (f != f) return (unsigned short)((u | 0x00400000u) >> 16);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }""",
    # integer helpers on int or long long (narrow index arithmetic), in C's common type
    "pf_div": """template <typename T, typename U> __device__ __forceinline__ auto pf_div(T x, U y) -> decltype(x / y) {
  return y == 0 ? 0 : y == -1 ? -x : x / y; }""",
    "pf_mod": """template <typename T, typename U> __device__ __forceinline__ auto pf_mod(T x, U y) -> decltype(x % y) {
  return (y == 0 || y == -1) ? 0 : x % y; }""",
    "pf_floordiv": """template <typename T, typename U> __device__ __forceinline__ auto pf_floordiv(T x, U y) -> decltype(x / y) {
  if (y == 0) return 0;
  if (y == -1) return -x;
  decltype(x / y) q = x / y, r = x % y;
  return (r != 0 && ((r < 0) != (y < 0))) ? q - 1 : q; }""",
    "pf_floormod": """template <typename T, typename U> __device__ __forceinline__ auto pf_floormod(T x, U y) -> decltype(x % y) {
  if (y == 0 || y == -1) return 0;
  decltype(x % y) r = x % y;
  return (r != 0 && ((r < 0) != (y < 0))) ? r + y : r; }""",
    "pf_fmodf": """__device__ __forceinline__ float pf_fmodf(float x, float y) {
  float r = fmodf(x, y); return (r != 0.0f && ((r < 0.0f) != (y < 0.0f))) ? r + y : r; }""",
    "pf_fmod": """__device__ __forceinline__ double pf_fmod(double x, double y) {
  double r = fmod(x, y); return (r != 0.0 && ((r < 0.0) != (y < 0.0))) ? r + y : r; }""",
    "pf_maxf": """__device__ __forceinline__ float pf_maxf(float a, float b) {
  return (a != a || b != b) ? a + b : fmaxf(a, b); }""",
    "pf_minf": """__device__ __forceinline__ float pf_minf(float a, float b) {
  return (a != a || b != b) ? a + b : fminf(a, b); }""",
    "pf_max": """__device__ __forceinline__ double pf_max(double a, double b) {
  return (a != a || b != b) ? a + b : fmax(a, b); }""",
    "pf_min": """__device__ __forceinline__ double pf_min(double a, double b) {
  return (a != a || b != b) ? a + b : fmin(a, b); }""",
    "pf_udiv": """__device__ __forceinline__ long long pf_udiv(long long x, long long y) {
  return y == 0 ? 0 : (long long)((unsigned long long)x / (unsigned long long)y); }""",
    "pf_umod": """__device__ __forceinline__ long long pf_umod(long long x, long long y) {
  return y == 0 ? 0 : (long long)((unsigned long long)x % (unsigned long long)y); }""",
    "pf_umax": """__device__ __forceinline__ long long pf_umax(long long a, long long b) {
  return (unsigned long long)a > (unsigned long long)b ? a : b; }""",
    "pf_umin": """__device__ __forceinline__ long long pf_umin(long long a, long long b) {
  return (unsigned long long)a < (unsigned long long)b ? a : b; }""",
    "pf_dot4": """__device__ __forceinline__ long long pf_dot4(long long a, long long b) {
  long long s = 0;
  for (int j = 0; j < 32; j += 8) s += (long long)((a >> j) & 255) * (signed char)((b >> j) & 255);
  return s; }""",
    "pf_bfdot2": """__device__ __forceinline__ float pf_bfdot2(long long a, long long b) {
  unsigned ua = (unsigned)a, ub = (unsigned)b;
  return __uint_as_float(ua & 0xffff0000u) * __uint_as_float(ub & 0xffff0000u)
       + __uint_as_float(ua << 16) * __uint_as_float(ub << 16); }""",
    "pf_imax": """template <typename T, typename U> __device__ __forceinline__ auto pf_imax(T a, U b) -> decltype(a + b) {
  return a > b ? a : b; }""",
    "pf_imin": """template <typename T, typename U> __device__ __forceinline__ auto pf_imin(T a, U b) -> decltype(a + b) {
  return a < b ? a : b; }""",
    "pf_iabs": "template <typename T> __device__ __forceinline__ T pf_iabs(T a) { return a < 0 ? -a : a; }",
    # shifts of values of a type ``bits`` wide: a count outside [0, bits) gives the sign fill
    "pf_shl": """__device__ __forceinline__ long long pf_shl(long long x, long long y, long long bits) {
  return (unsigned long long)y < (unsigned long long)bits ? (long long)((unsigned long long)x << y) : 0; }""",
    "pf_shr": """__device__ __forceinline__ long long pf_shr(long long x, long long y, long long bits) {
  return x >> ((unsigned long long)y < (unsigned long long)bits ? y : bits - 1); }""",
    "pf_ushr": """__device__ __forceinline__ long long pf_ushr(long long x, long long y, long long bits) {
  return (unsigned long long)y < (unsigned long long)bits ? (long long)((unsigned long long)x >> y) : 0; }""",
    # asynchronous copies global -> shared (cp.async, sm_80 on; src-size 0 fills zeros);
    # elsewhere (the host's compilers) plain copies, which land at once
    "pf_cp_async4": """__device__ __forceinline__ void pf_cp_async4(void* dst, const void* src, bool inside) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::
               "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "r"(inside ? 4 : 0));
#else
  unsigned v = 0; if (inside) memcpy(&v, src, 4); memcpy(dst, &v, 4);
#endif
}""",
    "pf_cp_async8": """__device__ __forceinline__ void pf_cp_async8(void* dst, const void* src, bool inside) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::
               "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "r"(inside ? 8 : 0));
#else
  unsigned long long v = 0; if (inside) memcpy(&v, src, 8); memcpy(dst, &v, 8);
#endif
}""",
    "pf_cp_async16": """__device__ __forceinline__ void pf_cp_async16(void* dst, const void* src, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::
               "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "r"(bytes));
#else  // as cp.async, which faults off 16-byte words: there, a wrong answer (NaN)
  if (((unsigned long long)src | (unsigned long long)dst) & 15ULL) { memset(dst, 0xFF, 16); return; }
  memset(dst, 0, 16); memcpy(dst, src, bytes);
#endif
}""",
    "pf_cp_async_commit": """#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define pf_cp_async_commit() asm volatile("cp.async.commit_group;" ::: "memory")
#else
#define pf_cp_async_commit()
#endif""",
    "pf_cp_async_wait": """#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define pf_cp_async_wait(n) asm volatile("cp.async.wait_group " #n ";" ::: "memory")
#else
#define pf_cp_async_wait(n)
#endif""",
    # float32 rounded to TF32 (the tf32 builtin): cvt.rna on sm_80 and later, else the
    # same rounding on the bits
    "pf_tf32": """__device__ __forceinline__ float pf_tf32(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x)); return __uint_as_float(r);
#else
  unsigned u = __float_as_uint(x);
  return (u & 0x7f800000u) == 0x7f800000u ? x : __uint_as_float((u + 0x1000u) & 0xffffe000u);
#endif
}""",
    # a warp's product on the matrix units: d (the m16n8 float32 tile, 4 per lane) +=
    # a (m16 x k) * b (k x n8), the fragments in mma.sync's layout. Before sm_80 (the
    # host's compilers) the same sums from the fragments the other lanes hold, by shuffles.
    "pf_mma_tf32": """__device__ __forceinline__ void pf_mma_tf32(float* d, const unsigned* a, const unsigned* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  for (int k = 0; k < 8; ++k) {
    const int h = k >> 2, at = g * 4 + (k & 3);
    const float a0 = __uint_as_float(__shfl_sync(0xffffffffu, a[2 * h], at));
    const float a1 = __uint_as_float(__shfl_sync(0xffffffffu, a[2 * h + 1], at));
    const float b0 = __uint_as_float(__shfl_sync(0xffffffffu, b[h], 2 * t * 4 + (k & 3)));
    const float b1 = __uint_as_float(__shfl_sync(0xffffffffu, b[h], (2 * t + 1) * 4 + (k & 3)));
    d[0] += a0 * b0; d[1] += a0 * b1; d[2] += a1 * b0; d[3] += a1 * b1;
  }
#endif
}""",
}
for _kind, _ptx, _convert in (("bf16", "bf16", "__uint_as_float(bits << 16)"),
                              ("f16", "f16", "pf_h2f((unsigned short)bits)")):
    HELPERS[f"pf_mma_{_kind}"] = f"""__device__ __forceinline__ void pf_mma_{_kind}(float* d, const unsigned* a, const unsigned* b) {{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{_ptx}.{_ptx}.f32 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, "
               "{{%8, %9}}, {{%0, %1, %2, %3}};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  for (int k = 0; k < 16; ++k) {{
    const int h = k >> 3, lane = (k & 7) >> 1, shift = (k & 1) * 16;
    unsigned x[4] = {{__shfl_sync(0xffffffffu, a[2 * h], g * 4 + lane),
                     __shfl_sync(0xffffffffu, a[2 * h + 1], g * 4 + lane),
                     __shfl_sync(0xffffffffu, b[h], 2 * t * 4 + lane),
                     __shfl_sync(0xffffffffu, b[h], (2 * t + 1) * 4 + lane)}};
    float v[4];
    for (int j = 0; j < 4; ++j) {{ const unsigned bits = (x[j] >> shift) & 0xffffu; v[j] = {_convert}; }}
    d[0] += v[0] * v[2]; d[1] += v[0] * v[3]; d[2] += v[1] * v[2]; d[3] += v[1] * v[3];
  }}
#endif
}}"""
# ldmatrix: the fragments of 8 x 16-byte matrices in shared memory, lane 8 j + i giving
# the address of row i of matrix j; lane l gets word l % 4 of row l / 4 of each (the
# transposed form: the 16-bit elements at column l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1).
# Before sm_75 (the host's compilers) the same words through the lanes' addresses.
for _count in (4, 2):
    _regs = ", ".join(f"%{j}" for j in range(_count))
    _outs = ", ".join(f'"=r"(r[{j}])' for j in range(_count))
    HELPERS[f"pf_ldmatrix_x{_count}"] = f"""__device__ __forceinline__ void pf_ldmatrix_x{_count}(unsigned* r, const void* row) {{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  asm volatile("ldmatrix.sync.aligned.m8n8.x{_count}.shared.b16 {{{_regs}}}, [%{_count}];"
               : {_outs} : "r"((unsigned)__cvta_generic_to_shared(row)));
#else
  const int lane = threadIdx.x & 31;
  for (int j = 0; j < {_count}; ++j) {{
    const char* p = (const char*)__shfl_sync(0xffffffffu, (unsigned long long)row, j * 8 + (lane >> 2));
    r[j] = *(const unsigned*)(p + 4 * (lane & 3));
  }}
#endif
}}"""
HELPERS["pf_ldmatrix_x2_trans"] = """__device__ __forceinline__ void pf_ldmatrix_x2_trans(unsigned* r, const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1]) : "r"((unsigned)__cvta_generic_to_shared(row)));
#else
  const int lane = threadIdx.x & 31;
  for (int j = 0; j < 2; ++j) {
    const char* lo = (const char*)__shfl_sync(0xffffffffu, (unsigned long long)row, j * 8 + 2 * (lane & 3));
    const char* hi = (const char*)__shfl_sync(0xffffffffu, (unsigned long long)row, j * 8 + 2 * (lane & 3) + 1);
    r[j] = (unsigned)*(const unsigned short*)(lo + 2 * (lane >> 2))
         | ((unsigned)*(const unsigned short*)(hi + 2 * (lane >> 2)) << 16);
  }
#endif
}"""
HELPERS |= {
    # consecutive elements read or written as one word (up to 128 bits: ld.global.v4.f32)
    "pf_vec": """template <typename T, int N> struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) pf_vec {
  T v[N]; };""",
    "pf_checked": """__device__ __forceinline__ long long pf_checked(long long i, long long n, long long* error) {
  if ((unsigned long long)i >= (unsigned long long)n) { *error = 1; return 0; }
  return i; }""",
}


def helpers_for(code: str) -> list[str]:
    """The helper definitions ``code`` calls (or instantiates), and those they call
    (defined first)."""
    def calls(text: str, name: str) -> bool:
        return f"{name}(" in text or f"{name}<" in text
    names = {name for name in HELPERS if calls(code, name)}
    while True:
        more = {name for name in HELPERS for used in names if name not in names and calls(HELPERS[used], name)}
        if not more:
            return [text for name, text in HELPERS.items() if name in names]
        names |= more


_STORAGE = {DType.BOOL: "unsigned char", DType.INT8: "signed char", DType.UINT8: "unsigned char",
            DType.UINT16: "unsigned short", DType.UINT32: "unsigned int",
            DType.UINT64: "unsigned long long",
            DType.INT16: "short", DType.INT32: "int", DType.INT64: "long long",
            DType.FLOAT16: "unsigned short", DType.BFLOAT16: "unsigned short",
            DType.FLOAT32: "float", DType.FLOAT64: "double"}

_OPS = {BinaryOp.ADD: "+", BinaryOp.SUB: "-", BinaryOp.MUL: "*", BinaryOp.DIV: "/",
        BinaryOp.LT: "<", BinaryOp.LE: "<=", BinaryOp.GT: ">", BinaryOp.GE: ">=",
        BinaryOp.EQ: "==", BinaryOp.NE: "!=", BinaryOp.AND: "&", BinaryOp.OR: "|",
        BinaryOp.BIT_AND: "&", BinaryOp.BIT_OR: "|", BinaryOp.BIT_XOR: "^"}

# builtin -> C function on double (float adds "f")
_MATH = {name: name for name in "exp exp2 expm1 log log2 log10 log1p sqrt cbrt tanh sinh cosh erf "
         "erfc fabs floor ceil trunc sin cos tan asin acos atan fmax fmin pow atan2".split()}
_MATH |= {name: name for name in "round rint acosh asinh atanh copysign cospi sinpi cyl_bessel_i0 "
          "cyl_bessel_i1 erfinv erfcinv erfcx exp10 j0 j1 y0 y1 lgamma tgamma logb normcdf "
          "normcdfinv rcbrt fdim hypot nextafter remainder rhypot fma norm3d rnorm3d norm4d "
          "rnorm4d".split()}
_MATH |= {"abs": "fabs", "fdivide": "fdivide"}  # fdividef; in double a plain division


# C++ words a TC name may spell; such names (and ones in polyfuse's pf_ space) get a "_"
_RESERVED = frozenset(
    "alignas alignof asm auto bool break case catch char class const constexpr continue "
    "decltype default delete do double else enum explicit extern false float for friend goto "
    "if inline int long mutable namespace new noexcept nullptr operator private protected public "
    "register return short signed sizeof static struct switch template this throw true try "
    "typedef typeid typename union unsigned using virtual void volatile while threadIdx "
    "blockIdx blockDim gridDim warpSize".split())


def c_name(name: str) -> str:
    """A loop-IR name as a C identifier that cannot clash with C++ or polyfuse's helpers."""
    return name + "_" if name in _RESERVED or name.startswith(("pf_", "__")) else name


def register_type(dt: DType) -> str:
    if dt.is_bool:
        return "bool"
    if dt.is_int:
        return "long long"
    return "double" if dt is DType.FLOAT64 else "float"


def storage_type(dt: DType) -> str:
    return _STORAGE[dt]


def to_register(value: str, dt: DType) -> str:
    """A loaded storage value as a register value."""
    if dt.is_bool:
        return f"({value} != 0)"
    if dt.is_int:
        return f"(long long){value}"
    if dt is DType.FLOAT16:
        return f"pf_h2f({value})"
    if dt is DType.BFLOAT16:
        return f"pf_bf2f({value})"
    return value


def to_storage(value: str, dt: DType) -> str:
    """A register value as the storage type of ``dt``."""
    if dt is DType.FLOAT16:
        return f"pf_f2h({value})"
    if dt is DType.BFLOAT16:
        return f"pf_f2bf({value})"
    if dt in (DType.FLOAT32, DType.FLOAT64, DType.INT64):
        return value
    return f"({_STORAGE[dt]})({value})"


def literal(value: int | float | bool, dt: DType) -> str:
    if dt.is_bool:
        return "true" if value else "false"
    if dt.is_int:
        v = int(value)
        if v >= 2**63:  # a uint64 constant: the long long with its bits
            return f"((long long){v}ULL)"
        return "(-9223372036854775807LL - 1)" if v == -2**63 else f"{v}LL"
    v = float(value)
    double = dt is DType.FLOAT64
    if math.isfinite(v):
        return f"{v.hex()}{'' if double else 'f'}"
    bits = {(True, 1): "0x7ff0000000000000LL", (True, -1): "0xfff0000000000000LL",
            (False, 1): "0x7f800000", (False, -1): "0xff800000"}
    if math.isnan(v):
        return "__longlong_as_double(0x7ff8000000000000LL)" if double else "__int_as_float(0x7fc00000)"
    sign = 1 if v > 0 else -1
    return f"__longlong_as_double({bits[True, sign]})" if double else f"__int_as_float({bits[False, sign]})"


def to_bits(x: str, dt: DType) -> str:
    """The storage bits of a register value of ``dt`` in the low bits of a ``long long``
    (an integer register is its own bits)."""
    if dt.is_bool:
        return f"(long long){x}"
    if dt.is_int:
        return x
    return {DType.FLOAT16: f"(long long)pf_f2h({x})", DType.BFLOAT16: f"(long long)pf_f2bf({x})",
            DType.FLOAT32: f"(long long)__float_as_uint({x})",
            DType.FLOAT64: f"__double_as_longlong({x})"}[dt]


def from_bits(bits: str, dt: DType) -> str:
    """The register value of ``dt`` whose storage is the low bits of the ``long long`` ``bits``."""
    if dt.is_bool:
        return f"((unsigned char)({bits}) != 0)"
    if dt.is_int:
        return f"(long long)({_STORAGE[dt]})({bits})"
    return {DType.FLOAT16: f"pf_h2f((unsigned short)({bits}))",
            DType.BFLOAT16: f"pf_bf2f((unsigned short)({bits}))",
            DType.FLOAT32: f"__uint_as_float((unsigned int)({bits}))",
            DType.FLOAT64: f"__longlong_as_double({bits})"}[dt]


class ExprEmitter:
    """Writes expressions; ``load(read)`` gives the C expression of a read's value."""

    def __init__(self, load: Callable[[Read], str], narrow: bool = False) -> None:
        """``narrow``: integer literals that fit are ``int`` (so index arithmetic of loop
        variables, ``int`` in a kernel whose indices fit, stays 32-bit)."""
        self.load = load
        self.narrow = narrow

    def emit(self, e: Expr) -> str:
        match e:
            case Literal(value=v, dtype=dt):
                if self.narrow and dt.is_int and dt is not DType.UINT64 and -INT32_SPAN < int(v) < INT32_SPAN:
                    return str(int(v))
                return literal(v, dt)
            case IndexVar(name=n) | ScalarRef(name=n) | LocalRef(name=n):
                return c_name(n)
            case SizeVar(name=n):
                raise CodegenError(f"size '{n}' is not bound to a value")
            case Read():
                return self.load(e)
            case Cast(dtype=dt, operand=a):
                return self.convert(self.emit(a), a.dtype, dt)
            case Unary(op=UnaryOp.NEG, operand=a):
                return f"(-{self.emit(a)})"
            case Unary(op=UnaryOp.NOT, operand=a):
                return f"(!{self.emit(a)})"
            case Unary(op=UnaryOp.BIT_NOT, operand=a):
                return f"(~{self.emit(a)})"
            case Select(cond=c, then=t, other=o):
                return f"({self.emit(c)} ? {self.emit(t)} : {self.emit(o)})"
            case Binary():
                return self.binary(e)
            case Call():
                return self.call(e)
        raise CodegenError(f"cannot generate CUDA code for {e}")

    def convert(self, x: str, src: DType, dst: DType) -> str:
        if dst.is_bool:
            return x if src.is_bool else f"({x} != 0)"
        if dst.is_int:
            if src.is_float:  # the GPU's conversions saturate, NaN to 0 (ir.types.float_to_int)
                x = f"(long long)(unsigned long long){x}" if dst is DType.UINT64 else f"(long long){x}"
            narrow = x if dst is DType.INT64 else f"({_STORAGE[dst]})({x})"
            return f"(long long){narrow}"
        if src is DType.UINT64:
            x = f"(unsigned long long)({x})"
        value = f"({register_type(dst)})({x})"
        if dst is DType.FLOAT16:
            return f"pf_h2f(pf_f2h({value}))"
        if dst is DType.BFLOAT16:
            return f"pf_bf2f(pf_f2bf({value}))"
        return value

    def binary(self, e: Binary) -> str:
        a, b = self.emit(e.lhs), self.emit(e.rhs)
        if e.dtype.is_float and e.op is BinaryOp.MOD:
            return f"pf_fmod{'f' if e.dtype is not DType.FLOAT64 else ''}({a}, {b})"
        if e.lhs.dtype is DType.UINT64 and (e.op.is_comparison or e.op in (BinaryOp.DIV, BinaryOp.MOD)):
            if e.op.is_comparison:
                return f"((unsigned long long)({a}) {_OPS[e.op]} (unsigned long long)({b}))"
            return f"pf_u{'div' if e.op is BinaryOp.DIV else 'mod'}({a}, {b})"
        if e.dtype.is_int and e.op in (BinaryOp.DIV, BinaryOp.MOD):
            return f"pf_{'div' if e.op is BinaryOp.DIV else 'mod'}({a}, {b})"
        if e.op is BinaryOp.SHL:  # the operands are values of the type; so is the result
            return self.convert(f"pf_shl({a}, {b}, {e.dtype.bits})", DType.INT64, e.dtype)
        if e.op is BinaryOp.SHR:
            return f"pf_{'u' if e.dtype.is_unsigned else ''}shr({a}, {b}, {e.dtype.bits})"
        return f"({a} {_OPS[e.op]} {b})"

    def call(self, e: Call) -> str:
        args = [self.emit(a) for a in e.args]
        fn = e.fn
        if reinterpreted(fn):
            return from_bits(to_bits(args[0], e.args[0].dtype), e.dtype)
        if fn in ("dot4", "bfdot2"):
            return f"pf_{fn}({args[0]}, {args[1]})"
        if e.dtype.is_bool or e.dtype.is_int:  # on 0/1 or 64-bit integers
            if fn not in ("max", "min", "abs", "floordiv", "floormod"):
                raise CodegenError(f"builtin '{fn}' has no integer form")
            wide = [f"(long long){a}" if x.dtype.is_bool else a for a, x in zip(args, e.args)]
            if e.dtype is DType.UINT64:  # bit patterns of unsigned values
                unsigned = {"floordiv": "div", "floormod": "mod"}.get(fn, fn)
                return args[0] if fn == "abs" else f"pf_u{unsigned}({', '.join(args)})"
            value = f"pf_{fn if fn.startswith('floor') else 'i' + fn}({', '.join(wide)})"
            return f"({value} != 0)" if e.dtype.is_bool else value
        double = e.dtype is DType.FLOAT64
        f = "" if double else "f"
        one = "1.0" + f
        if fn in ("max", "min"):
            return f"pf_{fn}{f}({args[0]}, {args[1]})"
        if fn == "rsqrt":
            return f"({one} / sqrt{f}({args[0]}))"
        if fn == "sigmoid":
            return f"({one} / ({one} + exp{f}(-{args[0]})))"
        if fn == "fdivide" and double:
            return f"({args[0]} / {args[1]})"
        if fn == "fmod":
            return f"fmod{f}({args[0]}, {args[1]})"
        if fn == "floordiv":
            return f"floor{f}({args[0]} / {args[1]})"
        if fn == "floormod":
            return f"pf_fmod{f}({args[0]}, {args[1]})"
        if fn == "tf32":
            return f"(double)pf_tf32((float){args[0]})" if double else f"pf_tf32({args[0]})"
        if fn in _MATH:
            return f"{_MATH[fn]}{f}({', '.join(args)})"
        raise CodegenError(f"no CUDA code generator for builtin '{fn}' on {e.dtype}")
