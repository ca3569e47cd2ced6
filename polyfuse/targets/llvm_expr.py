"""Loop-IR expressions -> LLVM IR values (llvmlite.ir).

Register types: every integer is an i64 (narrowed only when stored or cast; uint64 keeps
its bits, so its division, comparisons, max/min and float conversions are unsigned; a
shift's operands are values of its type, sign- or zero-extended), bool is
i1, float16 and bfloat16 are computed as float. Integer division and modulo round
toward minus infinity and give 0 for a zero divisor instead of trapping. A select
whose sides read memory branches, so the side not chosen is never loaded.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from llvmlite import ir

from polyfuse.errors import CodegenError
from polyfuse.ir.builtins import reinterpreted
from polyfuse.ir.comprehension import (Binary, BinaryOp, Call, Cast, Expr, IndexVar, Literal,
                                       LocalRef, Read, ScalarRef, Select, SizeVar, Unary, UnaryOp, walk)
from polyfuse.ir.types import DType
from polyfuse.targets import llvm_dot, llvm_gamma, llvm_math, llvm_special

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
CONTRACT = ("contract",)   # fast-math flag: the only one polyfuse gives float arithmetic


def register_type(dt: DType) -> ir.Type:
    if dt.is_bool:
        return I1
    if dt.is_int:
        return I64
    return F64 if dt is DType.FLOAT64 else F32


def storage_type(dt: DType) -> ir.Type:
    return {DType.BOOL: I8, DType.INT8: I8, DType.UINT8: I8, DType.INT16: I16, DType.INT32: I32,
            DType.INT64: I64, DType.UINT16: I16, DType.UINT32: I32, DType.UINT64: I64,
            DType.FLOAT16: F16, DType.BFLOAT16: I16, DType.FLOAT32: F32, DType.FLOAT64: F64}[dt]


_FCMP = {BinaryOp.LT: "<", BinaryOp.LE: "<=", BinaryOp.GT: ">", BinaryOp.GE: ">=",
         BinaryOp.EQ: "==", BinaryOp.NE: "!="}

# builtin -> LLVM intrinsic (same for float and double)
_INTRINSICS = {"sqrt": "llvm.sqrt", "fabs": "llvm.fabs", "floor": "llvm.floor", "ceil": "llvm.ceil",
               "trunc": "llvm.trunc", "round": "llvm.round", "rint": "llvm.roundeven",
               "copysign": "llvm.copysign", "fma": "llvm.fma", "fmax": "llvm.maxnum",
               "fmin": "llvm.minnum", "pow": "llvm.pow", "exp2": "llvm.exp2", "log2": "llvm.log2",
               "log10": "llvm.log10", "sin": "llvm.sin", "cos": "llvm.cos", "exp": "llvm.exp",
               "log": "llvm.log"}
# builtin -> libm function name for double (float adds an "f")
_LIBM = {"cbrt": "cbrt", "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan",
         "atan2": "atan2", "sinh": "sinh", "cosh": "cosh", "erfc": "erfc", "expm1": "expm1",
         "log1p": "log1p", "fmod": "fmod", "tanh": "tanh", "erf": "erf", "j0": "j0", "j1": "j1",
         "y0": "y0", "y1": "y1"}
# float32 builtins emitted as inlined straight-line code, so that their loops vectorize
VECTOR_BODIES = {**llvm_special.BODIES, **llvm_gamma.BODIES}
# on float32 these are VECTOR_BODIES, on float64 libm's
_LIBM_DOUBLE = {n: n for n in "acosh asinh atanh exp10 fdim hypot logb nextafter remainder lgamma "
                "tgamma".split()}


def clamp_chain(e: Expr) -> tuple[Expr, list[tuple[str, Literal]]]:
    """``e`` as float ``max``/``min`` of constants around an operand (``min(max(x, lo),
    hi)``, as a saturating conversion is written): the operand, and each ``max`` or
    ``min`` with its constant, innermost first."""
    chain: list[tuple[str, Literal]] = []
    while isinstance(e, Call) and e.fn in ("max", "min") and e.dtype.is_float and len(e.args) == 2:
        constant = [a for a in e.args if isinstance(a, Literal)]
        if not constant:
            break
        chain.append((e.fn, constant[0]))
        e = e.args[1] if e.args[0] is constant[0] else e.args[0]
    return e, chain[::-1]


def clamped_range(e: Expr) -> tuple[float, float] | None:
    """The range ``e``'s clamp (:func:`clamp_chain`) keeps it to, NaN aside; None if
    either end is open."""
    lo, hi = -float("inf"), float("inf")
    for fn, c in clamp_chain(e)[1]:
        v = float(c.value)
        lo, hi = (max(lo, v), max(hi, v)) if fn == "max" else (min(lo, v), min(hi, v))
    return (lo, hi) if -float("inf") < lo and hi < float("inf") else None


def calls_libm(e: Call, *, scalable: bool = False) -> bool:
    """Whether the call becomes a scalar libm call, which keeps its loop from vectorizing
    (for ``scalable`` vectors, as SVE's are, or fixed-width ones)."""
    if not e.dtype.is_float:
        return False
    if register_type(e.dtype) is F32 and e.fn in VECTOR_BODIES:
        return scalable and e.fn in llvm_special.NOT_SCALABLE
    if register_type(e.dtype) is F32 and e.fn in llvm_math.SUPPORTED:
        return False
    return e.fn in _LIBM or (e.dtype is DType.FLOAT64 and e.fn in _LIBM_DOUBLE)


class ExprEmitter:
    """Emits expressions with ``builder``; ``load(read, builder)`` returns a register value."""

    def __init__(self, module: ir.Module, env: dict[str, ir.Value],
                 load: Callable[[Read, ir.IRBuilder], ir.Value],
                 locals_: dict[str, ir.Value] | None = None, scale: bool = False,
                 native: frozenset[str] = frozenset()) -> None:
        self.module = module
        self.env = env
        self.load = load
        self.locals = locals_ or {}
        self.scale = scale     # math functions scale by 2^n with llvm.ldexp (see llvm_math)
        self.native = native   # dot products with vector versions of instructions (llvm_dot)

    def intrinsic(self, name: str, ty: ir.Type, nargs: int) -> ir.Function:
        suffix = {F32: "f32", F64: "f64", I64: "i64"}[ty]
        full = f"{name}.{suffix}"
        fn = self.module.globals.get(full)
        return fn or ir.Function(self.module, ir.FunctionType(ty, [ty] * nargs), full)

    def libm(self, name: str, ty: ir.Type, nargs: int) -> ir.Function:
        full = name + ("f" if ty is F32 else "")
        fn = self.module.globals.get(full)
        return fn or ir.Function(self.module, ir.FunctionType(ty, [ty] * nargs), full)

    def emit(self, e: Expr, b: ir.IRBuilder) -> ir.Value:
        match e:
            case Literal(value=v, dtype=dt):
                ty = register_type(dt)
                return ir.Constant(ty, float(v) if isinstance(ty, (ir.FloatType, ir.DoubleType))
                                   else int(bool(v)) if ty is I1 else _signed64(int(v)))
            case IndexVar(name=n) | ScalarRef(name=n):
                return self.env[n]
            case LocalRef(name=n):
                return b.load(self.locals[n])
            case SizeVar(name=n):
                raise CodegenError(f"size '{n}' is not bound to a value")
            case Read():
                return self.load(e, b)
            case Cast(dtype=dt, operand=a):
                within = clamped_range(a)
                x = self.clamped(a, b) if within is not None and dt.is_int else self.emit(a, b)
                return self.convert(x, a.dtype, dt, b, within)
            case Unary(op=UnaryOp.NEG, operand=a):
                x = self.emit(a, b)
                return b.fneg(x) if e.dtype.is_float else b.sub(ir.Constant(I64, 0), x)
            case Unary(op=UnaryOp.NOT | UnaryOp.BIT_NOT, operand=a):
                return b.not_(self.emit(a, b))
            case Select(cond=c, then=t, other=o):
                return self.select(c, t, o, b)
            case Binary():
                return self.binary(e, b)
            case Call():
                return self.call(e, b)
        raise CodegenError(f"cannot generate code for {e}")

    def convert(self, x: ir.Value, src: DType, dst: DType, b: ir.IRBuilder,
                within: tuple[float, float] | None = None) -> ir.Value:
        """``x`` of type ``src`` as ``dst``; ``within``: bounds a float ``x`` is known to
        keep to, NaN aside (see :func:`clamped_range`)."""
        if dst.is_bool:
            if src.is_bool:
                return x
            return b.fcmp_unordered("!=", x, ir.Constant(x.type, 0.0)) if src.is_float \
                else b.icmp_signed("!=", x, ir.Constant(I64, 0))
        if dst.is_int:
            if src.is_bool:
                return b.zext(x, I64)
            if src.is_float and dst is not DType.UINT64 and within is not None and \
                    -2.0 ** 31 <= within[0] and within[1] < 2.0 ** 31:
                # 32 bits convert it exactly: a quarter of the vector work of 64
                whole = b.sext(b.fptosi(x, I32), I64)
                x = b.select(b.fcmp_unordered("uno", x, x), ir.Constant(I64, 0), whole)
            elif src.is_float:
                x = self.saturated(x, dst is DType.UINT64, b)
            if dst.bits == 64:
                return x
            narrow = b.trunc(x, storage_type(dst))
            return b.zext(narrow, I64) if dst.is_unsigned else b.sext(narrow, I64)
        ty = register_type(dst)
        if src.is_bool or src is DType.UINT64:
            x = b.uitofp(x, ty)
        elif src.is_int:
            x = b.sitofp(x, ty)
        elif x.type != ty:
            x = b.fpext(x, ty) if ty is F64 else b.fptrunc(x, ty)
        return round_to_storage(x, dst, b)

    def clamped(self, e: Expr, b: ir.IRBuilder) -> ir.Value:
        """A clamp (:func:`clamp_chain`) on its way to an integer, as compares and selects
        (``c > x ? c : x``): one maxps or minps each on x86, where llvm.maximum's order of
        signed zeros and NaNs takes three instructions. NaN stays NaN; only the sign of a
        zero may differ, which no integer keeps."""
        inner, chain = clamp_chain(e)
        x = self.emit(inner, b)
        for fn, c in chain:
            bound = self.emit(c, b)
            x = b.select(b.fcmp_ordered(">" if fn == "max" else "<", bound, x), bound, x)
        return x

    def saturated(self, x: ir.Value, unsigned: bool, b: ir.IRBuilder) -> ir.Value:
        """Float ``x`` toward zero into 64 bits, saturating (NaN is 0), as
        ir.types.float_to_int defines it: clamped to the floats inside the range, converted,
        then the ends chosen by compares. LLVM scalarizes its own ``fptosi.sat`` on vectors
        (a compare and two moves a lane); these are vector instructions."""
        ty = x.type
        top = 2.0 ** (64 if unsigned else 63)
        below = float(np.nextafter(np.asarray(top, np.float32 if ty is F32 else np.float64), 0))
        lowest = 0.0 if unsigned else -2.0 ** 63
        clamped = b.call(self.intrinsic("llvm.minnum", ty, 2),
                         [b.call(self.intrinsic("llvm.maxnum", ty, 2),
                                 [x, ir.Constant(ty, lowest)]), ir.Constant(ty, below)])
        whole = b.fptoui(clamped, I64) if unsigned else b.fptosi(clamped, I64)
        high = b.fcmp_ordered(">=", x, ir.Constant(ty, top))
        whole = b.select(high, ir.Constant(I64, -1 if unsigned else 2 ** 63 - 1), whole)
        if unsigned:   # maxnum already made NaN 0
            return whole
        return b.select(b.fcmp_unordered("uno", x, x), ir.Constant(I64, 0), whole)

    def select(self, c: Expr, t: Expr, o: Expr, b: ir.IRBuilder) -> ir.Value:
        cond = self.emit(c, b)
        if not any(isinstance(n, Read) for side in (t, o) for n in walk(side)):
            return b.select(cond, self.emit(t, b), self.emit(o, b))
        with b.if_else(cond) as (then, other):
            with then:
                a = self.emit(t, b)
                a_block = b.block
            with other:
                c2 = self.emit(o, b)
                c_block = b.block
        phi = b.phi(a.type)
        phi.add_incoming(a, a_block)
        phi.add_incoming(c2, c_block)
        return phi

    def binary(self, e: Binary, b: ir.IRBuilder) -> ir.Value:
        if e.op is BinaryOp.ADD and isinstance(e.rhs, Call) and e.rhs.fn in llvm_dot.DOTS:
            # an accumulation, which the dot-product instructions include
            fn = e.rhs.fn
            a, w = (self.emit(x, b) for x in e.rhs.args)
            return llvm_dot.dot(fn, self.module, self.emit(e.lhs, b), a, w, b, fn in self.native)
        x, y = self.emit(e.lhs, b), self.emit(e.rhs, b)
        op, operand = e.op, e.lhs.dtype
        if op in (BinaryOp.AND, BinaryOp.BIT_AND):
            return b.and_(x, y)
        if op in (BinaryOp.OR, BinaryOp.BIT_OR):
            return b.or_(x, y)
        if op is BinaryOp.BIT_XOR:
            return b.xor(x, y)
        if op.is_shift:
            return _shift(x, y, op is BinaryOp.SHL, e.dtype, b)
        if op.is_comparison:
            if operand.is_float:
                return b.fcmp_unordered("!=", x, y) if op is BinaryOp.NE else b.fcmp_ordered(_FCMP[op], x, y)
            if x.type is I1:
                x, y = b.zext(x, I64), b.zext(y, I64)
            if operand is DType.UINT64:
                return b.icmp_unsigned(_FCMP[op], x, y)
            return b.icmp_signed(_FCMP[op], x, y)
        if e.dtype.is_float:
            if op is BinaryOp.MOD:
                return _float_mod(x, y, b)
            if op is BinaryOp.DIV:
                return b.fdiv(x, y)
            # a multiply feeding an add or subtract may fuse into one FMA (one rounding),
            # as C compilers and the cuda target (--fmad) do
            fn = {BinaryOp.ADD: b.fadd, BinaryOp.SUB: b.fsub, BinaryOp.MUL: b.fmul}[op]
            return fn(x, y, flags=CONTRACT)
        if op in (BinaryOp.DIV, BinaryOp.MOD) and operand is DType.UINT64:
            return _uint_divmod(x, y, op is BinaryOp.DIV, b)
        if op in (BinaryOp.DIV, BinaryOp.MOD):
            return _int_divmod(x, y, op is BinaryOp.DIV, b, floor=False)
        return {BinaryOp.ADD: b.add, BinaryOp.SUB: b.sub, BinaryOp.MUL: b.mul}[op](x, y)

    def call(self, e: Call, b: ir.IRBuilder) -> ir.Value:
        args = [self.emit(a, b) for a in e.args]
        dt, fn = e.dtype, e.fn
        if reinterpreted(fn):
            return from_bits(to_bits(args[0], e.args[0].dtype, b), dt, b)
        if fn in llvm_dot.DOTS:
            return llvm_dot.dot(fn, self.module, llvm_dot.zero(fn), *args, b, fn in self.native)
        if dt.is_bool:  # computed on 0/1 integers
            return b.icmp_signed("!=", _int_call(fn, args, b), ir.Constant(I64, 0))
        if dt.is_int:
            return _int_call(fn, args, b, unsigned=dt is DType.UINT64)
        ty = register_type(dt)
        if ty is F32 and fn in llvm_math.SUPPORTED:
            return b.call(llvm_math.math_function(self.module, fn, 1, self.scale), args)
        if ty is F32 and fn in VECTOR_BODIES:
            arity, body = VECTOR_BODIES[fn]
            return b.call(llvm_math.define_function(self.module, fn, body, 1, arity, self.scale), args)
        if fn == "fdivide":
            return b.fdiv(args[0], args[1])
        if ty is F64 and fn in _LIBM_DOUBLE:
            return b.call(self.libm(_LIBM_DOUBLE[fn], ty, len(args)), args)
        if fn in ("max", "min"):
            name = "llvm.maximum" if fn == "max" else "llvm.minimum"
            return b.call(self.intrinsic(name, ty, 2), args)
        if fn == "abs":
            return b.call(self.intrinsic("llvm.fabs", ty, 1), args)
        if fn == "floordiv":
            return b.call(self.intrinsic("llvm.floor", ty, 1), [b.fdiv(args[0], args[1])])
        if fn == "floormod":
            return _float_mod(args[0], args[1], b)
        if fn == "rsqrt":
            return b.fdiv(ir.Constant(ty, 1.0), b.call(self.intrinsic("llvm.sqrt", ty, 1), args))
        if fn == "sigmoid":
            ex = b.call(self.intrinsic("llvm.exp", ty, 1), [b.fneg(args[0])])
            return b.fdiv(ir.Constant(ty, 1.0), b.fadd(ir.Constant(ty, 1.0), ex))
        if fn in _INTRINSICS:
            return b.call(self.intrinsic(_INTRINSICS[fn], ty, len(args)), args)
        if fn in _LIBM:
            return b.call(self.libm(_LIBM[fn], ty, len(args)), args)
        if fn in VECTOR_BODIES:
            raise CodegenError(f"builtin '{fn}' has only a float32 implementation on CPU targets "
                               f"(it is one of CUDA's single-precision functions); cast its "
                               f"argument to float")
        raise CodegenError(f"no code generator for builtin '{fn}' on {dt}")


def _shift(x: ir.Value, y: ir.Value, left: bool, dt: DType, b: ir.IRBuilder) -> ir.Value:
    """``x << y`` or ``x >> y`` on values of ``dt`` (sign- or zero-extended registers): a
    count outside [0, bits) gives the sign fill, never LLVM's poison."""
    zero = ir.Constant(I64, 0)
    outside = b.icmp_unsigned(">=", y, ir.Constant(I64, dt.bits))
    if not left and not dt.is_unsigned:  # a count of bits - 1 is the sign fill
        return b.ashr(x, b.select(outside, ir.Constant(I64, dt.bits - 1), y))
    count = b.select(outside, zero, y)
    value = b.select(outside, zero, b.shl(x, count) if left else b.lshr(x, count))
    if not left or dt.bits == 64:
        return value
    narrow = b.trunc(value, storage_type(dt))
    return b.zext(narrow, I64) if dt.is_unsigned else b.sext(narrow, I64)


def to_bits(x: ir.Value, dt: DType, b: ir.IRBuilder) -> ir.Value:
    """The storage bits of a register value of ``dt`` in the low bits of an i64 (an
    integer register is its own bits)."""
    if dt.is_bool:
        return b.zext(x, I64)
    if dt.is_int:
        return x
    if dt is DType.FLOAT16:
        x = b.bitcast(b.fptrunc(x, F16), I16)
    elif dt is DType.BFLOAT16:
        x = f32_to_bf16(x, b)
    else:
        x = b.bitcast(x, ir.IntType(dt.bits))
    return b.zext(x, I64) if dt.bits < 64 else x


def from_bits(bits: ir.Value, dt: DType, b: ir.IRBuilder) -> ir.Value:
    """The register value of ``dt`` whose storage is the low bits of the i64 ``bits``."""
    narrow = bits if dt.bits == 64 else b.trunc(bits, ir.IntType(dt.bits))
    if dt.is_bool:
        return b.icmp_unsigned("!=", narrow, ir.Constant(narrow.type, 0))
    if dt.is_int:
        return narrow if dt.bits == 64 else b.zext(narrow, I64) if dt.is_unsigned else b.sext(narrow, I64)
    if dt is DType.FLOAT16:
        return b.fpext(b.bitcast(narrow, F16), F32)
    if dt is DType.BFLOAT16:
        return bf16_to_f32(narrow, b)
    return b.bitcast(narrow, register_type(dt))


def round_to_storage(x: ir.Value, dt: DType, b: ir.IRBuilder) -> ir.Value:
    """Round a float register to a 16-bit storage type and back (a cast to float16/bfloat16)."""
    if dt is DType.FLOAT16:
        return b.fpext(b.fptrunc(x, F16), F32)
    if dt is DType.BFLOAT16:
        return bf16_to_f32(f32_to_bf16(x, b), b)
    return x


def f32_to_bf16(x: ir.Value, b: ir.IRBuilder) -> ir.Value:
    """Round to nearest even; NaN stays NaN."""
    bits = b.bitcast(x, I32)
    lsb = b.and_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 1))
    rounded = b.add(bits, b.add(ir.Constant(I32, 0x7FFF), lsb))
    is_nan = b.fcmp_unordered("uno", x, x)
    quiet = b.or_(bits, ir.Constant(I32, 0x00400000))
    return b.trunc(b.lshr(b.select(is_nan, quiet, rounded), ir.Constant(I32, 16)), I16)


def bf16_to_f32(x: ir.Value, b: ir.IRBuilder) -> ir.Value:
    return b.bitcast(b.shl(b.zext(x, I32), ir.Constant(I32, 16)), F32)


def _int_divmod(x: ir.Value, y: ir.Value, quotient: bool, b: ir.IRBuilder, *,
                floor: bool) -> ir.Value:
    """C's truncating ``/`` and ``%``, or with ``floor`` floordiv and floormod; a divisor 0
    gives 0 and -1 gives ``-x`` and 0 (no trap on INT64_MIN / -1)."""
    zero, one = ir.Constant(I64, 0), ir.Constant(I64, 1)
    bad = b.or_(b.icmp_signed("==", y, zero), b.icmp_signed("==", y, ir.Constant(I64, -1)))
    safe = b.select(bad, one, y)   # no trap on /0 or on INT64_MIN / -1
    q, r = b.sdiv(x, safe), b.srem(x, safe)
    if not floor:
        if quotient:
            return b.select(b.icmp_signed("==", y, zero), zero, b.select(bad, b.sub(zero, x), q))
        return b.select(bad, zero, r)
    adjust = b.and_(b.icmp_signed("!=", r, zero),
                    b.icmp_signed("!=", b.icmp_signed("<", r, zero), b.icmp_signed("<", y, zero)))
    if quotient:
        floor_q = b.select(adjust, b.sub(q, one), q)
        by_minus_one = b.sub(zero, x)
        return b.select(b.icmp_signed("==", y, zero), zero,
                        b.select(b.icmp_signed("==", y, ir.Constant(I64, -1)), by_minus_one, floor_q))
    floor_r = b.select(adjust, b.add(r, y), r)
    return b.select(bad, zero, floor_r)


def _uint_divmod(x: ir.Value, y: ir.Value, quotient: bool, b: ir.IRBuilder) -> ir.Value:
    """uint64 ``/`` and ``%`` (floor and truncation agree); 0 for a zero divisor, like ints."""
    zero = ir.Constant(I64, 0)
    is_zero = b.icmp_unsigned("==", y, zero)
    safe = b.select(is_zero, ir.Constant(I64, 1), y)
    value = b.udiv(x, safe) if quotient else b.urem(x, safe)
    return b.select(is_zero, zero, value)


def _signed64(v: int) -> int:
    """A uint64 constant at or above 2**63 as the i64 with the same bits."""
    return v - 2**64 if v >= 2**63 else v


def _float_mod(x: ir.Value, y: ir.Value, b: ir.IRBuilder) -> ir.Value:
    zero = ir.Constant(x.type, 0.0)
    r = b.frem(x, y)
    adjust = b.and_(b.fcmp_ordered("!=", r, zero),
                    b.icmp_signed("!=", b.fcmp_ordered("<", r, zero), b.fcmp_ordered("<", y, zero)))
    return b.select(adjust, b.fadd(r, y), r)


def _int_call(fn: str, args: list[ir.Value], b: ir.IRBuilder, *, unsigned: bool = False) -> ir.Value:
    """``unsigned``: the i64 registers hold uint64 bit patterns."""
    if args and args[0].type is I1:
        args = [b.zext(a, I64) for a in args]
    compare = b.icmp_unsigned if unsigned else b.icmp_signed
    if fn == "max":
        return b.select(compare(">", args[0], args[1]), args[0], args[1])
    if fn == "min":
        return b.select(compare("<", args[0], args[1]), args[0], args[1])
    if fn == "abs" and unsigned:
        return args[0]
    if fn == "abs":
        return b.select(b.icmp_signed("<", args[0], ir.Constant(I64, 0)),
                        b.sub(ir.Constant(I64, 0), args[0]), args[0])
    if fn in ("floordiv", "floormod") and unsigned:
        return _uint_divmod(args[0], args[1], fn == "floordiv", b)
    if fn in ("floordiv", "floormod"):
        return _int_divmod(args[0], args[1], fn == "floordiv", b, floor=True)
    raise CodegenError(f"builtin '{fn}' has no integer form")
