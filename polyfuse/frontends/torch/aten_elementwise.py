"""Elementwise ATen ops: arithmetic, comparisons, activations, casts, where, clamp.

Operands are cast to the dtype torch computes in (the output's for arithmetic, the
promoted inputs' for comparisons); Python numbers become 0-d constants of that dtype.
"""

from __future__ import annotations

import math
from typing import Any

from polyfuse.frontends.torch.builder import Builder, Size, Tensor, Unsupported
from polyfuse.frontends.torch.registry import register
from polyfuse.ir.types import DType


def _kind(dt: DType) -> int:
    return 0 if dt.is_bool else 1 if dt.is_int else 2


def promoted(*xs: Any) -> DType:
    """torch's result dtype of operands (tensors of any rank count alike; a Python
    number only lifts the category: bool < int < float)."""
    tensors = [x.dtype for x in xs if isinstance(x, Tensor)]
    best = max(tensors, key=lambda d: (_kind(d), d.bits)) if tensors else DType.INT64
    numbers = [x for x in xs if not isinstance(x, Tensor)]
    for n in numbers:
        kind = 0 if isinstance(n, bool) else 2 if isinstance(n, float) else 1
        if kind > _kind(best):
            best = DType.FLOAT32 if kind == 2 else DType.INT64
    return best


def binary(b: Builder, op: str, x: Any, y: Any, dtype: DType) -> str:
    return b.op(op, [b.operand(x, dtype), b.operand(y, dtype)])


def _scaled(b: Builder, y: Any, alpha: Any, dtype: DType) -> Any:
    return y if alpha == 1 else binary(b, "Mul", y, alpha, dtype)


def _add_sub(op: str):
    def lower(b: Builder, out: Tensor, x: Any, y: Any, alpha: Any = 1) -> str:
        return binary(b, op, x, _scaled(b, y, alpha, out.dtype), out.dtype)
    return lower


register("aten.add.Tensor", "aten.add.Scalar")(_add_sub("Add"))
register("aten.sub.Tensor", "aten.sub.Scalar")(_add_sub("Sub"))


@register("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(b: Builder, out: Tensor, x: Any, y: Any, alpha: Any = 1) -> str:
    return binary(b, "Sub", y, _scaled(b, x, alpha, out.dtype), out.dtype)


_ARITHMETIC = {"mul": "Mul", "pow": "Pow", "maximum": "Max", "minimum": "Min"}
for _name, _op in _ARITHMETIC.items():
    register(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar", f"aten.{_name}.default",
             f"aten.{_name}.Tensor_Scalar", f"aten.{_name}.Tensor_Tensor", f"aten.{_name}.Scalar_Tensor"
             )(lambda b, out, x, y, _op=_op: binary(b, _op, x, y, out.dtype))


@register("aten.div.Tensor", "aten.div.Scalar")
def _div(b: Builder, out: Tensor, x: Any, y: Any) -> str:
    return binary(b, "Div", x, y, out.dtype)


@register("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div_mode(b: Builder, out: Tensor, x: Any, y: Any, *, rounding_mode: str | None = None) -> str:
    if rounding_mode is None:
        return binary(b, "Div", x, y, out.dtype)
    if out.dtype.is_int:
        if rounding_mode == "trunc":   # integer Div truncates
            return binary(b, "Div", x, y, out.dtype)
        raise Unsupported("integer division with rounding_mode='floor'")
    q = binary(b, "Div", x, y, out.dtype)
    return b.op("Floor", [q]) if rounding_mode == "floor" else _trunc(b, q, out.dtype)


def _trunc(b: Builder, q: str, dt: DType) -> str:
    zero = b.scalar(0, dt)
    return b.op("Where", [b.op("Less", [q, zero]), b.op("Ceil", [q]), b.op("Floor", [q])])


@register("aten.remainder.Tensor", "aten.remainder.Scalar")
def _remainder(b: Builder, out: Tensor, x: Any, y: Any) -> str:
    if out.dtype.is_int:
        return binary(b, "Mod", x, y, out.dtype)
    xs, ys = b.operand(x, out.dtype), b.operand(y, out.dtype)
    floor = b.op("Floor", [b.op("Div", [xs, ys])])
    return b.op("Sub", [xs, b.op("Mul", [floor, ys])])


_COMPARE = {"eq": ("Equal", False), "ne": ("Equal", True), "lt": ("Less", False),
            "le": ("LessOrEqual", False), "gt": ("Greater", False), "ge": ("GreaterOrEqual", False)}
for _name, (_op, _negate) in _COMPARE.items():
    def _compare(b: Builder, out: Tensor, x: Any, y: Any, _op: str = _op, _negate: bool = _negate) -> str:
        r = binary(b, _op, x, y, promoted(x, y))
        return b.op("Not", [r]) if _negate else r
    register(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(_compare)

for _name, _op in {"logical_and": "And", "logical_or": "Or", "logical_xor": "Xor",
                   "bitwise_and": "And", "bitwise_or": "Or", "bitwise_xor": "Xor"}.items():
    def _logical(b: Builder, out: Tensor, x: Any, y: Any, _op: str = _op, _name: str = _name) -> str:
        if _name.startswith("bitwise") and not out.dtype.is_bool:
            raise Unsupported(f"{_name} of {out.dtype} (only of bool)")
        r = binary(b, _op, x, y, DType.BOOL)
        return b.cast(r, DType.BOOL, out.dtype)
    register(f"aten.{_name}.default", f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(_logical)


@register("aten.logical_not.default", "aten.bitwise_not.default")
def _not(b: Builder, out: Tensor, x: Tensor) -> str:
    if not out.dtype.is_bool:
        raise Unsupported(f"bitwise_not of {out.dtype} (only of bool)")
    return b.op("Not", [b.operand(x, DType.BOOL)])


# unary ops computed in the output's dtype: aten name -> graph op
_UNARY = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "exp": "Exp", "log": "Log",
          "sqrt": "Sqrt", "neg": "Neg", "abs": "Abs", "reciprocal": "Reciprocal", "sin": "Sin",
          "cos": "Cos", "tan": "Tan", "erf": "Erf", "floor": "Floor", "ceil": "Ceil",
          "round": "Round", "sign": "Sign", "hardswish": "HardSwish", "asin": "Asin",
          "acos": "Acos", "atan": "Atan", "sinh": "Sinh", "cosh": "Cosh", "asinh": "Asinh",
          "acosh": "Acosh", "atanh": "Atanh", "silu": "Swish", "mish": "Mish",
          "isnan": "IsNaN", "isinf": "IsInf", "alias": "Identity", "clone": "Identity",
          "detach": "Identity", "lift_fresh_copy": "Identity", "relu6": None}
for _name, _op in _UNARY.items():
    if _op is None:
        continue

    def _unary(b: Builder, out: Tensor, x: Tensor, *args: Any, _op: str = _op, **kwargs: Any) -> str:
        dt = x.dtype if _op in ("IsNaN", "IsInf") else out.dtype
        return b.op(_op, [b.operand(x, dt)])
    register(f"aten.{_name}.default")(_unary)


@register("aten.relu6.default")
def _relu6(b: Builder, out: Tensor, x: Tensor) -> str:
    return b.op("Clip", [x, b.scalar(0, x.dtype), b.scalar(6, x.dtype)])


@register("aten.rsqrt.default")
def _rsqrt(b: Builder, out: Tensor, x: Tensor) -> str:
    return b.op("Reciprocal", [b.op("Sqrt", [b.operand(x, out.dtype)])])


@register("aten.log1p.default")
def _log1p(b: Builder, out: Tensor, x: Tensor) -> str:
    return b.op("Log", [binary(b, "Add", x, 1, out.dtype)])


@register("aten.expm1.default")
def _expm1(b: Builder, out: Tensor, x: Tensor) -> str:
    return b.op("Sub", [b.op("Exp", [b.operand(x, out.dtype)]), b.scalar(1, out.dtype)])


@register("aten.square.default")
def _square(b: Builder, out: Tensor, x: Tensor) -> str:
    return binary(b, "Mul", x, x, out.dtype)


@register("aten.gelu.default")
def _gelu(b: Builder, out: Tensor, x: Tensor, *, approximate: str = "none") -> str:
    return b.op("Gelu", [x], approximate=approximate)


@register("aten.hardsigmoid.default")
def _hardsigmoid(b: Builder, out: Tensor, x: Tensor) -> str:
    return b.op("HardSigmoid", [x], alpha=1 / 6, beta=0.5)


@register("aten.leaky_relu.default")
def _leaky_relu(b: Builder, out: Tensor, x: Tensor, negative_slope: float = 0.01) -> str:
    return b.op("LeakyRelu", [x], alpha=float(negative_slope))


@register("aten.elu.default")
def _elu(b: Builder, out: Tensor, x: Tensor, alpha: float = 1.0, scale: float = 1.0,
         input_scale: float = 1.0) -> str:
    if scale != 1 or input_scale != 1:
        raise Unsupported("elu with scale or input_scale other than 1")
    return b.op("Elu", [x], alpha=float(alpha))


@register("aten.softplus.default")
def _softplus(b: Builder, out: Tensor, x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> str:
    # above the threshold torch returns x, which log(1 + exp(x)) equals in float32
    if beta != 1 or threshold < 15:
        raise Unsupported(f"softplus with beta={beta}, threshold={threshold}")
    return b.op("Softplus", [x])


def _clip(b: Builder, out: Tensor, x: Tensor, lo: Any, hi: Any) -> str:
    dt = out.dtype
    return b.op("Clip", [b.operand(x, dt), None if lo is None else b.operand(lo, dt),
                         None if hi is None else b.operand(hi, dt)])


@register("aten.clamp.default", "aten.clamp.Tensor")
def _clamp(b: Builder, out: Tensor, x: Tensor, min: Any = None, max: Any = None) -> str:
    if isinstance(min, Tensor) or isinstance(max, Tensor):   # elementwise bounds
        r = b.operand(x, out.dtype)
        if min is not None:
            r = b.op("Max", [r, b.operand(min, out.dtype)])
        if max is not None:
            r = b.op("Min", [r, b.operand(max, out.dtype)])
        return r
    return _clip(b, out, x, min, max)


@register("aten.clamp_min.default")
def _clamp_min(b: Builder, out: Tensor, x: Tensor, min: Any) -> str:
    return _clamp(b, out, x, min, None)


@register("aten.clamp_max.default")
def _clamp_max(b: Builder, out: Tensor, x: Tensor, max: Any) -> str:
    return _clamp(b, out, x, None, max)


@register("aten.hardtanh.default")
def _hardtanh(b: Builder, out: Tensor, x: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> str:
    return _clip(b, out, x, min_val, max_val)


@register("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(b: Builder, out: Tensor, cond: Tensor, x: Any, y: Any) -> str:
    return b.op("Where", [b.operand(cond, DType.BOOL), b.operand(x, out.dtype), b.operand(y, out.dtype)])


@register("aten._to_copy.default", "aten.to.dtype", "aten._to_dtype.default")
def _to_copy(b: Builder, out: Tensor, x: Tensor, *args: Any, **kwargs: Any) -> str:
    device = kwargs.get("device")
    if device is not None and str(device) != "cpu":
        raise Unsupported(f"a copy to device {device}")
    return b.op("Identity", [x]) if x.dtype is out.dtype else b.cast(x, x.dtype, out.dtype)


@register("aten.threshold_backward.default")
def _threshold_backward(b: Builder, out: Tensor, grad: Tensor, x: Tensor, threshold: float) -> str:
    below = b.op("LessOrEqual", [x, b.scalar(threshold, x.dtype)])
    return b.op("Where", [below, b.scalar(0, out.dtype), b.operand(grad, out.dtype)])


@register("aten.sigmoid_backward.default")
def _sigmoid_backward(b: Builder, out: Tensor, grad: Tensor, y: Tensor) -> str:
    one_minus = binary(b, "Sub", 1, y, out.dtype)
    return b.op("Mul", [b.operand(grad, out.dtype), b.op("Mul", [y.name, one_minus])])


@register("aten.tanh_backward.default")
def _tanh_backward(b: Builder, out: Tensor, grad: Tensor, y: Tensor) -> str:
    one_minus = b.op("Sub", [b.scalar(1, out.dtype), b.op("Mul", [y.name, y.name])])
    return b.op("Mul", [b.operand(grad, out.dtype), one_minus])


@register("aten.gelu_backward.default")
def _gelu_backward(b: Builder, out: Tensor, grad: Tensor, x: Tensor, *, approximate: str = "none") -> str:
    if approximate != "none":
        raise Unsupported(f"gelu_backward with approximate='{approximate}'")
    dt = out.dtype
    # d/dx x*Phi(x) = Phi(x) + x*phi(x)
    cdf = b.op("Mul", [b.scalar(0.5, dt), binary(b, "Add", 1, b.op("Erf", [binary(
        b, "Mul", x, math.sqrt(0.5), dt)]), dt)])
    sq = b.op("Mul", [x.name, x.name])
    pdf = b.op("Mul", [b.scalar(1 / math.sqrt(2 * math.pi), dt),
                       b.op("Exp", [binary(b, "Mul", sq, -0.5, dt)])])
    return b.op("Mul", [grad.name, b.op("Add", [cdf, b.op("Mul", [x.name, pdf])])])


_SIZE_ARITHMETIC = {"mul": "Mul", "add": "Add", "sub": "Sub", "floordiv": "Div"}
for _name, _op in _SIZE_ARITHMETIC.items():
    def _size_arithmetic(b: Builder, out: Any, x: Any, y: Any, _op: str = _op) -> str:
        if not isinstance(out, Size):
            raise Unsupported("arithmetic on Python values that are not sizes")
        return b.op(_op, [_size(b, x), _size(b, y)])
    register(f"operator.{_name}", f"_operator.{_name}")(_size_arithmetic)


def _size(b: Builder, x: Any) -> str:
    if isinstance(x, Size):
        return x.name
    if isinstance(x, int):
        return b.ints([x])
    raise Unsupported(f"size arithmetic on {x!r}")
