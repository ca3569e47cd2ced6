"""Vectorizable float32 transcendental functions, emitted as LLVM IR.

The CPU code generators call :func:`math_function` instead of libm so that loops over
``exp``, ``tanh``, ... vectorize: every function here is straight-line code (selects,
no branches, no calls but always-lowered intrinsics) on ``float`` or
``<width x float>``, and is inlined into the kernel. The algorithms are Cephes'
single-precision ones (exp, exp2, log, log2, tanh), Juffa's erff, and
compositions of those. Measured over all 2^32 float32 inputs against float64
numpy rounded to float32, the largest errors are 1 ulp (exp, exp2, log, log2,
tanh, erf) and 2 ulp (log1p, sigmoid); tests/targets/test_llvm_math.py checks
bounds of 2 ulp, or 1e-7 absolute where a result is within 1e-3 of zero.

Nothing relies on fast-math flags: the instructions emitted here carry none, and
the caller's flags stay on the caller's instructions. Polynomials use
``llvm.fmuladd`` so that FMA targets fuse them while others get a multiply and an
add rather than a call to ``fmaf``; the range reductions use Cody-Waite splits of
ln 2 whose first products are exact, so they are accurate with or without FMA.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llvmlite import ir

from polyfuse.errors import TargetError

_F32 = ir.FloatType()
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)

# 1.5 * 2^23: adding it to |v| < 2^22 rounds v to an integer held in the low
# mantissa bits, which gives both the rounded float and its int32 value without
# fptosi (poison on NaN) or a roundeven intrinsic (a libm call without SSE4.1).
_ROUND_MAGIC = 12582912.0
_LN2_HI = 0.693359375            # 9 significant bits: n * _LN2_HI is exact for |n| < 2^15
_LN2_LO = -2.12194440e-4         # ln 2 - _LN2_HI
_LOG2E = 1.44269504088896341
_EXP_ZERO_BELOW = -103.97207641601562   # float32(-103.97208): exp(x) rounds to 0 below it
_SQRT_HALF = 0.707106781186547524

_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3,
             4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
_EXP2_POLY = (1.535336188319500e-4, 1.339887440266574e-3, 9.618437357674640e-3,
              5.550332471162809e-2, 2.402264791363012e-1, 6.931472028550421e-1)
_LOG_POLY = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1,
             -1.2420140846e-1, 1.4249322787e-1, -1.6668057665e-1,
             2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)
_TANH_POLY = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2,
              1.33314422036e-1, -3.33332819422e-1)
# Norbert Juffa's erff (as shipped in MLX), each branch within 1 ulp with FMA:
# erf x = x + x P(x^2) up to 0.927734375, 1 - exp(Q(|x|)) beyond.
_ERF_SPLIT = 0.927734375
_ERF_SMALL = (-5.96761703e-4, 4.99119423e-3, -2.67681349e-2,
              1.12819925e-1, -3.76125336e-1, 1.28379166e-1)
_ERF_LARGE_HIGH = (-1.72853470e-5, 3.83197126e-4)  # Q's top four terms, Estrin-style:
_ERF_LARGE_LOW = (-3.88396438e-3, 2.42546219e-2)   # (a t + b) t^2 + (c t + d)
_ERF_LARGE = (-1.06777877e-1, -6.34846687e-1, -1.28717512e-1)


def _type_suffix(ty: ir.Type) -> str:
    """LLVM's overload suffix: ``f32``, ``v8f32``, ``f64``... (llvmlite has none for vectors)."""
    element = ty.element if isinstance(ty, ir.VectorType) else ty
    name = "f64" if isinstance(element, ir.DoubleType) else "f32"
    return f"v{ty.count}{name}" if isinstance(ty, ir.VectorType) else name


class _Emit:
    """Float arithmetic on one value type (``float``, ``<w x float>``, or their doubles).

    Constants are splatted to the type, and integer views use the matching i32 (i64)
    type, so the algorithms below read the same for scalars and vectors.
    """

    def __init__(self, builder: ir.IRBuilder, ty: ir.Type, scale: bool = False) -> None:
        self.b = builder
        self.ty = ty
        self.scale = scale   # ldexp as llvm.ldexp (a vscalefps on AVX-512)
        vector = isinstance(ty, ir.VectorType)
        element = _I64 if isinstance(ty.element if vector else ty, ir.DoubleType) else _I32
        self.ity = ir.VectorType(element, ty.count) if vector else element
        self.suffix = _type_suffix(ty)

    def f(self, value: float) -> ir.Constant:
        return ir.Constant(self.ty, value)

    def i(self, value: int) -> ir.Constant:
        return ir.Constant(self.ity, value)

    def call(self, intrinsic: str, *args: ir.Value) -> ir.Value:
        """Call an overloaded float intrinsic (``llvm.fabs``, ``llvm.fmuladd``, ...)."""
        module = self.b.module
        symbol = f"{intrinsic}.{self.suffix}"
        if symbol not in module.globals:
            ir.Function(module, ir.FunctionType(self.ty, [self.ty] * len(args)), symbol)
        return self.b.call(module.globals[symbol], args)

    def mad(self, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        """``a * b + c``, fused where the target has FMA."""
        return self.call("llvm.fmuladd", a, b, c)

    def horner(self, x: ir.Value, coeffs: Sequence[float]) -> ir.Value:
        """The polynomial with ``coeffs`` (highest degree first) at ``x``."""
        acc = self.f(coeffs[0])
        for c in coeffs[1:]:
            acc = self.mad(acc, x, self.f(c))
        return acc

    def bits(self, x: ir.Value) -> ir.Value:
        return self.b.bitcast(x, self.ity)

    def from_bits(self, n: ir.Value) -> ir.Value:
        return self.b.bitcast(n, self.ty)

    def cmp(self, op: str, a: ir.Value, b: ir.Value) -> ir.Value:
        """An ordered comparison: false whenever either side is NaN."""
        return self.b.fcmp_ordered(op, a, b)

    def select(self, cond: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.select(cond, a, b)

    def clamp(self, x: ir.Value, lo: float, hi: float) -> ir.Value:
        """``x`` limited to [lo, hi]; NaN stays NaN (unlike minnum/maxnum)."""
        x = self.select(self.cmp("<", x, self.f(lo)), self.f(lo), x)
        return self.select(self.cmp(">", x, self.f(hi)), self.f(hi), x)

    def round(self, x: ir.Value) -> tuple[ir.Value, ir.Value]:
        """``x`` rounded to the nearest integer, as float and as i32 (needs |x| < 2^22)."""
        t = self.b.fadd(x, self.f(_ROUND_MAGIC))
        n = self.b.sub(self.bits(t), self.i(0x4B400000))  # the bit pattern of the magic
        return self.b.fsub(t, self.f(_ROUND_MAGIC)), n

    def ldexp(self, p: ir.Value, n: ir.Value) -> ir.Value:
        """``p * 2^n`` for i32 ``n`` in [-252, 254], with no range checks.

        ``2^n`` is built from exponent bits in two halves, each a normal float, so
        the second product overflows to inf or underflows to a subnormal or 0 on its
        own; for the |n| <= 151 used here the first product stays normal, so a
        subnormal result is rounded once. With ``scale``, ``llvm.ldexp`` (exact, one
        rounding), which AVX-512 does in one instruction (about a third of an exp's
        cost saved); elsewhere LLVM may expand it into a library call, which does not
        vectorize.
        """
        if self.scale:
            module = self.b.module
            count = f"v{self.ty.count}i{self.ity.element.width}" if isinstance(self.ty, ir.VectorType) \
                else f"i{self.ity.width}"
            symbol = f"llvm.ldexp.{self.suffix}.{count}"
            if symbol not in module.globals:
                ir.Function(module, ir.FunctionType(self.ty, [self.ty, self.ity]), symbol)
            return self.b.call(module.globals[symbol], [p, n])
        half = self.b.ashr(n, self.i(1))
        for k in (half, self.b.sub(n, half)):
            scale = self.from_bits(self.b.shl(self.b.add(k, self.i(127)), self.i(23)))
            p = self.b.fmul(p, scale)
        return p


def _exp(e: _Emit, x: ir.Value) -> ir.Value:
    """Cephes expf: x = n ln2 + r with |r| <= ln2/2, e^r = 1 + r + r^2 P(r), times 2^n.

    Clamping first keeps n within ldexp's range; beyond the clamp points exp is
    already inf or 0 in float32, and NaN passes through the clamp and the polynomial.
    Where the result rounds to 0 the scaling by 2^n is skipped and 0 chosen instead:
    a product that underflows costs x86 a microcode assist of about a hundred cycles
    per instruction, and masked attention scores (``finfo.min`` or -1e4 below the
    row's maximum) make every softmax vector underflow (GPT-2's: benchmarks/LOG.md).
    """
    zero = e.cmp("<", x, e.f(_EXP_ZERO_BELOW))
    x = e.clamp(x, -104.5, 89.0)
    n_float, n = e.round(e.b.fmul(x, e.f(_LOG2E)))
    r = e.b.fsub(x, e.b.fmul(n_float, e.f(_LN2_HI)))
    r = e.mad(n_float, e.f(-_LN2_LO), r)
    p = e.mad(e.b.fmul(r, r), e.horner(r, _EXP_POLY), r)
    scaled = e.ldexp(e.b.fadd(p, e.f(1.0)), e.select(zero, e.i(0), n))
    return e.select(zero, e.f(0.0), scaled)


def _exp2(e: _Emit, x: ir.Value) -> ir.Value:
    """Cephes exp2f: x = n + r with |r| <= 1/2 (exact), 2^r = 1 + r P(r), times 2^n."""
    x = e.clamp(x, -151.0, 129.0)
    n_float, n = e.round(x)
    r = e.b.fsub(x, n_float)
    return e.ldexp(e.mad(r, e.horner(r, _EXP2_POLY), e.f(1.0)), n)


def _log_parts(e: _Emit, x: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """Cephes logf's split: x = 2^k (1 + f), 1 + f in [sqrt(1/2), sqrt(2)).

    Returns ``k`` (as float), ``f`` (exact) and ``y``, where log(1 + f) = f + y with
    y = f^3 P(f) - f^2/2 small, so callers add the large terms last. Subnormal x
    are scaled by 2^23 first so the exponent field is meaningful.
    """
    tiny = e.cmp("<", x, e.f(1.1754943508222875e-38))
    x = e.select(tiny, e.b.fmul(x, e.f(8388608.0)), x)
    bits = e.bits(x)
    k = e.b.sub(e.b.lshr(bits, e.i(23)), e.select(tiny, e.i(126 + 23), e.i(126)))
    m = e.from_bits(e.b.or_(e.b.and_(bits, e.i(0x007FFFFF)), e.i(0x3F000000)))  # [1/2, 1)
    low = e.cmp("<", m, e.f(_SQRT_HALF))
    k = e.b.sub(k, e.b.zext(low, e.ity))
    f = e.b.fsub(e.select(low, e.b.fadd(m, m), m), e.f(1.0))
    z = e.b.fmul(f, f)
    y = e.mad(e.b.fmul(f, z), e.horner(f, _LOG_POLY), e.b.fmul(z, e.f(-0.5)))
    return e.b.sitofp(k, e.ty), f, y


def _log_specials(e: _Emit, x: ir.Value, result: ir.Value) -> ir.Value:
    """The IEEE results at 0 (-inf), +inf (inf), negatives and NaN (NaN)."""
    result = e.select(e.cmp("==", x, e.f(float("inf"))), x, result)
    result = e.select(e.cmp("==", x, e.f(0.0)), e.f(float("-inf")), result)
    return e.select(e.b.fcmp_unordered("<", x, e.f(0.0)), e.f(float("nan")), result)


def _log(e: _Emit, x: ir.Value) -> ir.Value:
    """log x = k ln2 + f + y, summed from the smallest term (k ln2 split Cody-Waite)."""
    k, f, y = _log_parts(e, x)
    small = e.b.fadd(f, e.mad(k, e.f(_LN2_LO), y))
    return _log_specials(e, x, e.mad(k, e.f(_LN2_HI), small))


def _log2(e: _Emit, x: ir.Value) -> ir.Value:
    """Cephes log2f: log2 x = k + (f + y) log2(e), with log2(e) - 1 applied separately."""
    k, f, y = _log_parts(e, x)
    excess = e.f(_LOG2E - 1.0)
    t = e.mad(f, excess, e.b.fmul(y, excess))
    t = e.b.fadd(e.b.fadd(t, y), f)
    return _log_specials(e, x, e.b.fadd(t, k))


def _log1p(e: _Emit, x: ir.Value) -> ir.Value:
    """log(1 + x) as log(u) * x / (u - 1) with u = 1 + x (Goldberg's correction).

    The factor x / (u - 1) undoes the rounding of u; where u rounds to 1 the answer
    is x itself, and at x = +inf the factor would be inf/inf.
    """
    u = e.b.fadd(x, e.f(1.0))
    result = e.b.fmul(_log(e, u), e.b.fdiv(x, e.b.fsub(u, e.f(1.0))))
    result = e.select(e.cmp("==", u, e.f(1.0)), x, result)
    return e.select(e.cmp("==", x, e.f(float("inf"))), x, result)


def _tanh(e: _Emit, x: ir.Value) -> ir.Value:
    """Cephes tanhf: x + x^3 P(x^2) below |x| = 0.625, 1 - 2/(e^{2|x|} + 1) above.

    The large form saturates to exactly 1 as e^{2|x|} overflows to inf; the sign
    is copied from x. NaN fails the ordered compare and takes the polynomial.
    """
    a = e.call("llvm.fabs", x)
    s = e.b.fadd(_exp(e, e.b.fadd(a, a)), e.f(1.0))
    large = e.b.fsub(e.f(1.0), e.b.fdiv(e.f(2.0), s))
    z = e.b.fmul(x, x)
    small = e.mad(e.b.fmul(x, z), e.horner(z, _TANH_POLY), x)
    # copysign also gives tanh(-0) = -0, which x + x^3 P(x^2) rounds to +0.
    return e.call("llvm.copysign", e.select(e.cmp(">=", a, e.f(0.625)), large, small), x)


def _sigmoid(e: _Emit, x: ir.Value) -> ir.Value:
    """1 / (1 + e^-x) for x >= 0 and e^x / (1 + e^x) below, with e^-|x| in [0, 1].

    Never forming e^{+|x|} means no inf/inf: the results are exactly 1 and 0 (or the
    correct subnormal) at the extremes, and tiny results keep their relative accuracy.
    """
    t = _exp(e, e.b.fneg(e.call("llvm.fabs", x)))
    numerator = e.select(e.cmp(">=", x, e.f(0.0)), e.f(1.0), t)
    return e.b.fdiv(numerator, e.b.fadd(t, e.f(1.0)))


def _erf(e: _Emit, x: ir.Value) -> ir.Value:
    """Juffa's erff: an odd polynomial near 0, 1 - e^{Q(|x|)} further out, sign copied.

    The large branch clamps |x| to 4, where float32 erf is already 1, so Q stays
    finite; NaN fails the ordered compare and takes the polynomial branch.
    """
    a = e.call("llvm.fabs", x)
    z = e.b.fmul(x, x)
    small = e.mad(e.horner(z, _ERF_SMALL), x, x)
    t = e.select(e.cmp(">", a, e.f(4.0)), e.f(4.0), a)
    q = e.mad(e.horner(t, _ERF_LARGE_HIGH), e.b.fmul(t, t), e.horner(t, _ERF_LARGE_LOW))
    for c in _ERF_LARGE:
        q = e.mad(q, t, e.f(c))
    q = e.mad(q, t, e.b.fneg(t))
    large = e.call("llvm.copysign", e.b.fsub(e.f(1.0), _exp(e, q)), x)
    return e.select(e.cmp(">", a, e.f(_ERF_SPLIT)), large, small)


_BODIES: dict[str, Callable[[_Emit, ir.Value], ir.Value]] = {
    "exp": _exp, "exp2": _exp2, "log": _log, "log2": _log2, "log1p": _log1p,
    "tanh": _tanh, "sigmoid": _sigmoid, "erf": _erf,
}

SUPPORTED: frozenset[str] = frozenset(_BODIES)


def math_function(module: ir.Module, name: str, width: int, scale: bool = False) -> ir.Function:
    """The function computing ``name`` elementwise on ``<width x float>`` (width 1: ``float``).

    It is emitted into ``module`` once, as ``polyfuse.math.<name>.<type>`` with internal
    linkage and ``alwaysinline``, and later calls with the same name and width return
    the same function. ``scale``: powers of two scale with ``llvm.ldexp`` (for AVX-512;
    see :meth:`_Emit.ldexp`).
    """
    if name not in _BODIES:
        raise TargetError(f"no vector implementation of {name!r}; "
                          f"supported: {', '.join(sorted(SUPPORTED))}")
    return define_function(module, name, _BODIES[name], width, scale=scale)


def define_function(module: ir.Module, name: str, body: Callable[..., ir.Value],
                    width: int, arity: int = 1, scale: bool = False) -> ir.Function:
    """``polyfuse.math.<name>.<type>``: ``body(emit, *args)`` as an inlined function of
    ``arity`` float arguments (see :func:`math_function`)."""
    if not isinstance(width, int) or width < 1:
        raise TargetError(f"vector width must be a positive integer, got {width!r}")
    ty = _F32 if width == 1 else ir.VectorType(_F32, width)
    symbol = f"polyfuse.math.{name}.{_type_suffix(ty)}"
    if symbol in module.globals:
        return module.globals[symbol]
    fn = ir.Function(module, ir.FunctionType(ty, [ty] * arity), symbol)
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    fn.attributes.add("nounwind")
    for arg, arg_name in zip(fn.args, "xyzw"):
        arg.name = arg_name
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    builder.ret(body(_Emit(builder, ty, scale), *fn.args))
    return fn
