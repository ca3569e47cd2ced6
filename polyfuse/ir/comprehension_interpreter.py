"""Reference interpreter of the comprehension IR, vectorized with numpy.

It is the oracle of every backend and the ``reference`` target. Each statement is
evaluated over its whole rectangular iteration box at once (each index a broadcast
``arange``), reduced over its reduction axes, and combined into the output; boxes
larger than :data:`MAX_BOX` elements are split into chunks. Semantics:

* outputs start zero-filled (or from the arrays given for them); ``op=!`` first sets
  the written region to the identity;
* 16-bit floats are stored as such but computed in float32;
* integer ``/`` and ``%`` truncate toward zero as in C (``-7 / 2 == -3``, ``-7 % 2 == -1``),
  ``floordiv`` and ``floormod`` round toward minus infinity; an integer divisor 0 gives 0;
* bitwise operators and shifts compute in their type's width;
* in ``c ? a : b`` only the chosen side is read, so only its reads are bounds-checked;
  every other read outside its tensor raises :class:`BoundsError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from polyfuse.errors import BoundsError
from polyfuse.ir import special_functions
from polyfuse.ir.builtins import reinterpreted
from polyfuse.ir.comprehension import (Binary, BinaryOp, Call, Cast, Definition, Expr, IndexVar,
                                       Literal, Read, ReduceOp, ScalarRef, Select, SizeVar,
                                       Statement, Unary, UnaryOp)
from polyfuse.ir.symbolic import evaluate_int
from polyfuse.ir.types import DType, float_to_int, reinterpret

MAX_BOX = 1 << 22  # elements of one evaluated chunk

_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])

FUNCTIONS: dict[str, Callable[..., np.ndarray]] = {
    "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log2": np.log2,
    "log10": np.log10, "log1p": np.log1p, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "cbrt": np.cbrt, "tanh": np.tanh, "sinh": np.sinh, "cosh": np.cosh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "erf": lambda x: _erf(x).astype(x.dtype), "erfc": lambda x: _erfc(x).astype(x.dtype),
    "fabs": np.fabs, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "fmax": np.fmax, "fmin": np.fmin, "pow": np.power, "atan2": np.arctan2,
    "fmod": np.fmod, "abs": np.abs, "max": np.maximum, "min": np.minimum,
    "floordiv": lambda x, y: np.floor_divide(x, y) if np.asarray(x).dtype.kind in "iub" else np.floor(x / y),
    "floormod": np.mod,
    **special_functions.FUNCTIONS,   # round (half away from zero), rint, and the rest of TC's
}

_BINARY = {
    BinaryOp.ADD: np.add, BinaryOp.SUB: np.subtract, BinaryOp.MUL: np.multiply,
    BinaryOp.LT: np.less, BinaryOp.LE: np.less_equal,
    BinaryOp.GT: np.greater, BinaryOp.GE: np.greater_equal, BinaryOp.EQ: np.equal,
    BinaryOp.NE: np.not_equal, BinaryOp.AND: np.logical_and, BinaryOp.OR: np.logical_or,
    BinaryOp.BIT_AND: np.bitwise_and, BinaryOp.BIT_OR: np.bitwise_or,
    BinaryOp.BIT_XOR: np.bitwise_xor, BinaryOp.SHL: np.left_shift, BinaryOp.SHR: np.right_shift,
}

_REDUCE = {ReduceOp.ADD: np.add, ReduceOp.MUL: np.multiply, ReduceOp.MAX: np.maximum,
           ReduceOp.MIN: np.minimum}


def truncated_div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Integer division rounding toward zero, as in C; a divisor 0 gives 0."""
    q = np.floor_divide(x, y)
    return np.where((np.fmod(x, y) != 0) & ((x < 0) != (y < 0)), q + 1, q)


def identity(op: ReduceOp, dtype: DType) -> int | float | bool:
    """The value ``op=!`` starts from."""
    if op is ReduceOp.ADD:
        return 0
    if op is ReduceOp.MUL:
        return 1
    if dtype.is_float:
        return -np.inf if op is ReduceOp.MAX else np.inf
    if dtype.is_bool:
        return op is ReduceOp.MIN
    info = np.iinfo(dtype.numpy)
    return info.min if op is ReduceOp.MAX else info.max


def _compute(dt: DType) -> np.dtype:
    return dt.compute.numpy


@dataclass(frozen=True, slots=True)
class _Box:
    """A chunk of a statement's iteration space: per index its (lo, hi) and axis."""

    names: tuple[str, ...]
    bounds: tuple[tuple[int, int], ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(max(0, hi - lo) for lo, hi in self.bounds)

    def split(self, axis: int) -> list[_Box]:
        lo, hi = self.bounds[axis]
        mid = (lo + hi) // 2
        return [_Box(self.names, self.bounds[:axis] + ((a, b),) + self.bounds[axis + 1:])
                for a, b in ((lo, mid), (mid, hi))]


class _StatementEval:
    def __init__(self, st: Statement, env: Mapping[str, np.ndarray],
                 scalars: Mapping[str, object], sizes: Mapping[str, int]) -> None:
        self.st = st
        self.env = env
        self.scalars = scalars
        self.sizes = sizes
        self.box: _Box | None = None

    def index(self, name: str) -> np.ndarray:
        assert self.box is not None
        axis = self.box.names.index(name)
        lo, hi = self.box.bounds[axis]
        shape = [1] * len(self.box.names)
        shape[axis] = max(0, hi - lo)
        return np.arange(lo, max(lo, hi), dtype=np.int64).reshape(shape)

    def eval(self, e: Expr, mask: np.ndarray | None) -> np.ndarray:
        match e:
            case Literal(value=v, dtype=dt):
                return np.asarray(v, dtype=_compute(dt))
            case IndexVar(name=n):
                return self.index(n)
            case SizeVar(name=n):
                return np.asarray(self.sizes[n], dtype=np.int64)
            case ScalarRef(name=n, dtype=dt):
                return np.asarray(self.scalars[n], dtype=_compute(dt))
            case Read():
                return self.read(e, mask)
            case Cast(dtype=dt, operand=a):
                value = self.eval(a, mask)
                if dt.is_int and value.dtype.kind == "f":
                    return float_to_int(value, dt).astype(_compute(dt))
                return value.astype(dt.numpy).astype(_compute(dt)) if dt.compute is not dt \
                    else value.astype(_compute(dt))
            case Unary(op=UnaryOp.NEG, operand=a):
                return np.negative(self.eval(a, mask))
            case Unary(op=UnaryOp.NOT, operand=a):
                return np.logical_not(self.eval(a, mask))
            case Unary(op=UnaryOp.BIT_NOT, operand=a, dtype=dt):
                return np.invert(self.eval(a, mask).astype(dt.numpy))
            case Binary(op=op, lhs=a, rhs=b, dtype=dt) if op.is_bitwise:
                # in the operands' own width: numpy shifts as the IR defines (a count
                # outside [0, bits) leaves the sign fill)
                return _BINARY[op](self.eval(a, mask).astype(dt.numpy), self.eval(b, mask).astype(dt.numpy))
            case Binary(op=op, lhs=a, rhs=b, dtype=dt):
                x, y = self.eval(a, mask), self.eval(b, mask)
                if op is BinaryOp.DIV:
                    return truncated_div(x, y) if dt.is_int or dt.is_bool else np.true_divide(x, y)
                if op is BinaryOp.MOD:  # C's remainder for integers; floats keep the divisor's sign
                    return np.fmod(x, y) if dt.is_int or dt.is_bool else np.mod(x, y)
                return _BINARY[op](x, y)
            case Select(cond=c, then=a, other=b):
                cond = self.eval(c, mask)
                yes = cond if mask is None else np.logical_and(mask, cond)
                no = np.logical_not(cond) if mask is None else np.logical_and(mask, np.logical_not(cond))
                return np.where(cond, self.eval(a, yes), self.eval(b, no))
            case Call(fn=fn, args=(a,), dtype=dt) if reinterpreted(fn):
                return reinterpret(self.eval(a, mask), a.dtype, dt).astype(_compute(dt))
            case Call(fn=fn, args=args, dtype=dt):
                out = FUNCTIONS[fn](*(self.eval(a, mask) for a in args))
                return np.asarray(out).astype(_compute(dt), copy=False)
        raise TypeError(f"cannot interpret {e!r}")

    def read(self, e: Read, mask: np.ndarray | None) -> np.ndarray:
        tensor = self.env[e.tensor]
        idx: list[np.ndarray] = []
        for dim, ix in enumerate(e.indices):
            values = self.eval(ix, mask).astype(np.int64)
            size = tensor.shape[dim]
            bad = (values < 0) | (values >= size)
            if mask is not None:
                bad = bad & mask
            if np.any(bad):
                raise self.bounds_error(e, dim, values, bad)
            if size == 0:
                shape = np.broadcast_shapes(*(np.shape(i) for i in idx), values.shape)
                return np.zeros(shape, dtype=_compute(e.dtype))
            idx.append(np.clip(values, 0, size - 1) if mask is not None else values)
        return tensor[tuple(idx)].astype(_compute(e.dtype), copy=False)

    def bounds_error(self, e: Read, dim: int, values: np.ndarray, bad: np.ndarray) -> BoundsError:
        assert self.box is not None
        shape = self.box.shape
        at = np.unravel_index(int(np.argmax(np.broadcast_to(bad, shape))), shape)
        value = np.broadcast_to(values, shape)[at]
        point = ", ".join(f"{n}={lo + k}" for n, (lo, _), k in zip(self.box.names, self.box.bounds, at))
        st = self.st
        return BoundsError(
            f"statement '{st.tensor}({', '.join(st.indices)}) {st.op.token(st.init)} ...' reads "
            f"{e} out of bounds: index {value} in dimension {dim} of '{e.tensor}', whose size is "
            f"{self.env[e.tensor].shape[dim]} (at {point})")

    def run(self) -> None:
        st = self.st
        bounds = {r.index: (evaluate_int(r.lo, self.sizes), evaluate_int(r.hi, self.sizes))
                  for r in st.ranges}
        names = st.indices + st.reduction_indices
        box = _Box(names, tuple(bounds[n] for n in names))
        out = self.env[st.tensor]
        for dim, name in enumerate(st.indices):
            lo, hi = bounds[name]
            if lo < hi and (lo < 0 or hi > out.shape[dim]):
                raise BoundsError(
                    f"statement '{st}' writes '{st.tensor}' out of bounds: index {name} runs over "
                    f"{lo}:{hi} but dimension {dim} has size {out.shape[dim]}")
        if st.init:
            out[self.region(box)] = identity(st.op, _dtype_of(out))
        if 0 in box.shape:
            return
        self.run_box(box)

    def region(self, box: _Box) -> tuple[slice, ...]:
        return tuple(slice(lo, hi) for lo, hi in box.bounds[:len(self.st.indices)])

    def run_box(self, box: _Box) -> None:
        size = math.prod(box.shape)
        if size > MAX_BOX:
            axis = max(range(len(box.shape)), key=lambda a: box.shape[a])
            for part in box.split(axis):
                self.run_box(part)
            return
        st = self.st
        self.box = box
        out = self.env[st.tensor]
        value = np.broadcast_to(self.eval(st.rhs, None), box.shape)
        n_out = len(st.indices)
        region = self.region(box)
        cdt = _compute(_dtype_of(out))
        if st.op is ReduceOp.ASSIGN:
            out[region] = value.astype(out.dtype)
            return
        reduce_fn = _REDUCE[st.op]
        axes = tuple(range(n_out, len(box.shape)))
        value = reduce_fn.reduce(value, axis=axes, dtype=cdt) if axes else value.astype(cdt)
        out[region] = reduce_fn(out[region].astype(cdt), value).astype(out.dtype)


def _dtype_of(array: np.ndarray) -> DType:
    dt = DType.from_numpy(array.dtype)
    assert dt is not None
    return dt


def interpret(d: Definition, args: Mapping[str, object], sizes: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Run ``d`` on ``args`` (input arrays and scalars by name) for the given size values.

    Arguments must already be checked against the definition; returns the outputs by name.
    An output given in ``args`` (checked, writable) is updated in place from its contents
    (TC's in-place form, ``out=``); the others start zero-filled.
    """
    env: dict[str, np.ndarray] = {t.name: np.asarray(args[t.name]) for t in d.inputs}
    for t in d.outputs:
        given = args.get(t.name)
        if given is not None:
            env[t.name] = given  # type: ignore[assignment]
            continue
        shape = tuple(evaluate_int(s, sizes) for s in t.shape)
        env[t.name] = np.zeros(shape, dtype=t.dtype.numpy)
    scalars = {s.name: args[s.name] for s in d.scalars}
    with np.errstate(all="ignore"):
        for st in d.statements:
            _StatementEval(st, env, scalars, sizes).run()
    return {t.name: env[t.name] for t in d.outputs}
