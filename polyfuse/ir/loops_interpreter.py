"""Interpreter of the loop IR: runs a kernel element by element with numpy scalars.

Slow by design (one Python step per statement instance) and written independently of
any target, so it checks the scheduler on small sizes: loop order, guards, tiling and
fusion are all visible in its results. Integer expressions are evaluated as Python
ints (exact, like the 64-bit arithmetic of the targets); values follow the same
rules as the comprehension interpreter (16-bit floats computed in float32).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from polyfuse.ir.builtins import reinterpreted
from polyfuse.ir.comprehension import (Binary, BinaryOp, Call, Cast, Expr, IndexVar, Literal,
                                       LocalRef, Read, ScalarRef, Select, SizeVar, Unary, UnaryOp)
from polyfuse.ir.comprehension_interpreter import FUNCTIONS
from polyfuse.ir.loops import ERROR_BUFFER, Assign, For, If, LoopKernel, Stmt, Store, TileProduct, shape_at
from polyfuse.ir.types import DType, float_to_int, reinterpret

_ARITH = {BinaryOp.ADD: lambda a, b: a + b, BinaryOp.SUB: lambda a, b: a - b,
          BinaryOp.MUL: lambda a, b: a * b, BinaryOp.MOD: lambda a, b: _mod(a, b) if b != 0 else 0 * a,  # floats; integers truncate
          BinaryOp.LT: lambda a, b: a < b, BinaryOp.LE: lambda a, b: a <= b,
          BinaryOp.GT: lambda a, b: a > b, BinaryOp.GE: lambda a, b: a >= b,
          BinaryOp.EQ: lambda a, b: a == b, BinaryOp.NE: lambda a, b: a != b,
          BinaryOp.BIT_AND: lambda a, b: a & b, BinaryOp.BIT_OR: lambda a, b: a | b,
          BinaryOp.BIT_XOR: lambda a, b: a ^ b}


def _wrap(v: int, dtype: np.dtype) -> int:
    """An exact integer narrowed to ``dtype`` the way 64-bit registers are: modulo 2**64."""
    return int(np.uint64(v % 2**64).astype(dtype))


def _mod(a, b):  # type: ignore[no-untyped-def]
    """Floored modulo; exact Python ints stay Python ints (uint64 values exceed int64)."""
    return a % b if isinstance(a, int) and isinstance(b, int) else np.mod(a, b)


def _shift(op: BinaryOp, x: int, y: int, dt: DType) -> int:
    """``x << y`` or ``x >> y`` in the width of ``dt`` (a count outside [0, bits) leaves
    the sign fill)."""
    x, y = _wrap(x, dt.numpy), _wrap(y, dt.numpy)
    if not 0 <= y < dt.bits:
        return -1 if op is BinaryOp.SHR and x < 0 else 0
    return _wrap(x << y, dt.numpy) if op is BinaryOp.SHL else x >> y


def _reinterpret(v: object, src: DType, dst: DType) -> object:
    """``v`` (a value of ``src``, or of any integer type as wide as ``dst``) read as ``dst``."""
    if src.is_int:
        src = DType(f"uint{dst.bits}")
        v = _wrap(int(v), src.numpy)  # type: ignore[call-overload]
    out = reinterpret(v, src, dst)
    return bool(out) if dst.is_bool else int(out) if dst.is_int else dst.compute.numpy.type(out)


def _truncated_div(a: int, b: int) -> int:
    """C's integer division, rounding toward zero; a divisor 0 gives 0."""
    if b == 0:
        return 0
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


class _Interpreter:
    def __init__(self, kernel: LoopKernel, buffers: dict[str, np.ndarray],
                 scalars: Mapping[str, object]) -> None:
        self.kernel = kernel
        self.buffers = buffers
        self.scalars = scalars
        self.env: dict[str, object] = {}

    def element(self, r: Read) -> tuple[int, ...]:
        """The element ``r`` reads; as on the targets, a checked index outside its
        dimension sets the error buffer and reads element 0 instead."""
        shape = self.buffers[r.tensor].shape
        out = []
        for dim, i in enumerate(r.indices):
            k = int(self.eval(i))
            if not 0 <= k < shape[dim] and r.is_checked(dim):
                self.buffers[ERROR_BUFFER][0] = 1
                k = 0
            out.append(k)
        return tuple(out)

    def eval(self, e: Expr):  # type: ignore[no-untyped-def]
        match e:
            case Literal(value=v, dtype=dt):
                return int(v) if dt.is_int else dt.compute.numpy.type(v)
            case IndexVar(name=n) | LocalRef(name=n):
                return self.env[n]
            case SizeVar(name=n):
                raise KeyError(f"unbound size {n} in loop IR")
            case ScalarRef(name=n, dtype=dt):
                return self.scalars[n] if dt.is_int else dt.compute.numpy.type(self.scalars[n])
            case Read(tensor=t, dtype=dt):
                value = self.buffers[t][self.element(e)]
                return int(value) if dt.is_int else dt.compute.numpy.type(value)
            case Cast(dtype=dt, operand=a):
                v = self.eval(a)
                if dt.is_int:
                    if isinstance(v, int):
                        return _wrap(v, dt.numpy)
                    array = np.asarray(v)
                    return int(float_to_int(array, dt) if array.dtype.kind == "f" else array.astype(dt.numpy))
                return dt.numpy.type(v).astype(dt.compute.numpy) if dt.is_float else dt.numpy.type(v)
            case Unary(op=UnaryOp.BIT_NOT, operand=a, dtype=dt):
                return ~int(self.eval(a)) % 2**64 if dt is DType.UINT64 else ~int(self.eval(a))
            case Unary(op=UnaryOp.NEG, operand=a, dtype=DType.UINT64):
                return -self.eval(a) % 2**64
            case Unary(op=UnaryOp.NEG, operand=a):
                return -self.eval(a)
            case Unary(op=UnaryOp.NOT, operand=a):
                return not self.eval(a)
            case Binary(op=BinaryOp.AND, lhs=a, rhs=b):
                return bool(self.eval(a)) and bool(self.eval(b))
            case Binary(op=BinaryOp.OR, lhs=a, rhs=b):
                return bool(self.eval(a)) or bool(self.eval(b))
            case Binary(op=op, lhs=a, rhs=b, dtype=dt) if op.is_shift:
                return _shift(op, int(self.eval(a)), int(self.eval(b)), dt)
            case Binary(op=BinaryOp.DIV, lhs=a, rhs=b, dtype=dt):
                x, y = self.eval(a), self.eval(b)
                if dt.is_int or dt.is_bool:
                    return _truncated_div(int(x), int(y))
                return np.true_divide(x, y)
            case Binary(op=BinaryOp.MOD, lhs=a, rhs=b, dtype=dt) if dt.is_int or dt.is_bool:
                x, y = int(self.eval(a)), int(self.eval(b))  # C's remainder: the dividend's sign
                r = x - y * _truncated_div(x, y) if y != 0 else 0
                return r % 2**64 if dt is DType.UINT64 else r
            case Binary(op=op, lhs=a, rhs=b, dtype=DType.UINT64):
                return _ARITH[op](self.eval(a), self.eval(b)) % 2**64
            case Binary(op=op, lhs=a, rhs=b):
                return _ARITH[op](self.eval(a), self.eval(b))
            case Select(cond=c, then=a, other=b):
                return self.eval(a) if self.eval(c) else self.eval(b)
            case Call(fn=fn, args=(a,), dtype=dt) if reinterpreted(fn):
                return _reinterpret(self.eval(a), a.dtype, dt)
            case Call(fn=fn, args=args, dtype=dt):
                values = [self.eval(a) for a in args]
                if dt.is_int:
                    return int(FUNCTIONS[fn](*(np.asarray(v, dt.numpy) for v in values)))
                return dt.compute.numpy.type(FUNCTIONS[fn](*(np.asarray(v, dt.compute.numpy) for v in values)))
        raise TypeError(f"cannot interpret {e!r}")

    def run(self, body: tuple[Stmt, ...]) -> None:
        for s in body:
            match s:
                case For(var=v, lo=lo, hi=hi, body=inner, step=step):
                    for value in range(int(self.eval(lo)), int(self.eval(hi)), step):
                        self.env[v] = value
                        self.run(inner)
                    self.env.pop(v, None)
                case If(cond=c, then=then, other=other):
                    self.run(then if self.eval(c) else other)
                case TileProduct(nest=nest):
                    self.run(nest)
                case Assign(var=v, value=value):
                    self.env[v] = self.eval(value)
                case Store(buffer=b, indices=ix, value=value):
                    out = self.buffers[b]
                    v = self.eval(value)
                    out[tuple(int(self.eval(i)) for i in ix)] = np.asarray(v).astype(out.dtype) \
                        if not isinstance(v, int) else _wrap(v, out.dtype)


def interpret_kernel(kernel: LoopKernel, args: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Run ``kernel`` on input arrays and scalars by name; outputs start zero-filled, packed
    inputs not given are made from their sources."""
    buffers: dict[str, np.ndarray] = {}
    for b in kernel.buffers:
        shape = shape_at(b.shape, args)   # (a symbolic kernel's sizes are scalars of args)
        if b.name in args:
            buffers[b.name] = np.asarray(args[b.name])
        elif b.packing is not None:
            buffers[b.name] = b.packing.apply(np.asarray(args[b.packing.source]), shape)
        else:
            buffers[b.name] = np.zeros(shape, b.dtype.numpy)
    scalars = {s.name: args[s.name] for s in kernel.scalars}
    with np.errstate(all="ignore"):
        _Interpreter(kernel, buffers, scalars).run(kernel.body)
    return {b.name: buffers[b.name] for b in kernel.parameters
            if b.name not in args and b.packing is None}
