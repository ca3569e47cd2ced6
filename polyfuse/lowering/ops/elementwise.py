"""Elementwise ops with numpy broadcasting: arithmetic, comparisons, logic, bits, math
functions, variadic Max/Min/Sum/Mean, Where, Clip, Cast and the identities.

Each lowering is one expression over named operands; :func:`elementwise` binds every
name to its input's element under broadcasting (a ``where`` clause of the TC text) and
writes the expression at every element of the broadcast shape. Activations live in
``activations.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import (INDEX, OpContext, TCKernel, View, access, balanced,
                                   broadcast_indices, broadcast_shape, holding, literal, register,
                                   tensor_param)
from polyfuse.lowering.ops.narrow import ROUND_MODES, narrowed

X = {"x": 0}               # operands of a unary op
AB = {"a": 0, "b": 1}      # operands of a binary op


def elementwise(ctx: OpContext, expr: str, out_dtype: DType, operands: Mapping[str, int],
                *, lets: Mapping[str, str] | None = None,
                trailing: Mapping[int, int] | None = None) -> TCKernel:
    """A kernel writing ``expr`` (cast to ``out_dtype``) at every element of the broadcast
    shape of its operands.

    ``operands`` maps each name ``expr`` uses to the node input it reads; ``lets`` binds
    further names to expressions of those. ``trailing`` gives inputs extra trailing
    size-1 dimensions before broadcasting (ONNX's legacy ``axis`` broadcast).
    """
    return elementwise_outputs(ctx, [(expr, out_dtype)], operands, lets=lets, trailing=trailing)


def elementwise_outputs(ctx: OpContext, outputs: Sequence[tuple[str, DType]],
                        operands: Mapping[str, int], *, lets: Mapping[str, str] | None = None,
                        trailing: Mapping[int, int] | None = None) -> TCKernel:
    """:func:`elementwise` for several outputs (the node's first ones), one expression each."""
    trailing = trailing or {}
    positions = tuple(operands.values())
    shapes = [ctx.shape(i) for i in positions]
    aligned = [s + (1,) * trailing.get(i, 0) for s, i in zip(shapes, positions)]
    out = broadcast_shape(*aligned)
    params = ", ".join(tensor_param(f"X{k}", (ctx.dtype(i), s))
                       for k, (i, s) in enumerate(zip(positions, shapes)))
    reads = {name: access(f"X{k}", broadcast_indices(a, out)[:len(s)])
             for k, (name, s, a) in enumerate(zip(operands, shapes, aligned))}
    clauses = [f"{INDEX[d]} in 0:{n}" for d, n in enumerate(out)]
    clauses += [f"{name} = {e}" for name, e in {**reads, **(lets or {})}.items()]
    names = [f"Y{k}" if len(outputs) > 1 else "Y" for k in range(len(outputs))]
    decls = ", ".join(tensor_param(y, (dt, out)) for y, (_, dt) in zip(names, outputs))
    body = "".join(f"  {access(y, INDEX[:len(out)])} = {dt}({expr})\n"
                   f"    where {', '.join(clauses)}\n" for y, (expr, dt) in zip(names, outputs))
    return TCKernel(f"def k({params}) -> ({decls}) {{\n{body}}}\n", positions,
                    tuple(range(len(outputs))))


def number(value: float | int | bool, dtype: DType) -> str:
    """``value`` as TC text for an expression of ``dtype``: a finite float stays a weak
    literal (it takes the operands' type); anything else is cast explicitly."""
    if dtype.is_float and math.isfinite(float(value)):
        return f"({float(value)!r})" if float(value) < 0 else repr(float(value))
    return literal(value, dtype)


def identity(ctx: OpContext) -> View:
    return View(0, ctx.shape(0))


def legacy_trailing(ctx: OpContext) -> dict[int, int]:
    """Before opset 7, ``broadcast=1, axis=k`` aligns B with A's dimensions from ``k``."""
    axis = ctx.attr("axis")
    if ctx.opset >= 7 or not ctx.attr("broadcast", 0) or axis is None:
        return {}
    rank = len(ctx.shape(0))
    return {1: rank - (axis + rank if axis < 0 else axis) - len(ctx.shape(1))}


# --- arithmetic ---------------------------------------------------------------------------

_ARITHMETIC = {"Add": "a + b", "Sub": "a - b", "Mul": "a * b"}


@register(*_ARITHMETIC)
def _arithmetic(ctx: OpContext) -> TCKernel:
    return elementwise(ctx, _ARITHMETIC[ctx.node.op], ctx.dtype(0), AB,
                       trailing=legacy_trailing(ctx))


@register("Div")
def _div(ctx: OpContext) -> TCKernel:
    # ONNX integer division truncates toward zero (onnxruntime), as TC's '/' does
    return elementwise(ctx, "a / b", ctx.dtype(0), AB, trailing=legacy_trailing(ctx))


@register("Pow")
def _pow(ctx: OpContext) -> TCKernel:
    dt = ctx.dtype(0)
    # numpy (the spec's reference) computes mixed-type powers in float64
    same = dt.is_float and ctx.dtype(1) is dt
    expr = "pow(a, b)" if same else "pow(float64(a), float64(b))"
    return elementwise(ctx, expr, dt, AB, trailing=legacy_trailing(ctx))


@register("Mod")
def _mod(ctx: OpContext) -> TCKernel:
    """fmod=0 takes the divisor's sign (floor), fmod=1 the dividend's (C fmod)."""
    dt = ctx.dtype(0)
    c_fmod = bool(ctx.attr("fmod", 0))
    if dt.is_float:
        expr = "r" if c_fmod else "r != 0 && (r < 0) != (b < 0) ? r + b : r"
        return elementwise(ctx, expr, dt, AB, lets={"r": "fmod(a, b)"})
    # TC's integer '%' is C's (the dividend's sign); floormod takes the divisor's
    return elementwise(ctx, "a % b" if c_fmod else "floormod(a, b)", dt, AB)


# --- comparisons and logic ------------------------------------------------------------------

_PREDICATES = {
    "Equal": "a == b", "Less": "a < b", "Greater": "a > b", "LessOrEqual": "a <= b",
    "GreaterOrEqual": "a >= b", "And": "a && b", "Or": "a || b", "Xor": "a != b",
}


@register(*_PREDICATES)
def _predicate(ctx: OpContext) -> TCKernel:
    return elementwise(ctx, _PREDICATES[ctx.node.op], DType.BOOL, AB,
                       trailing=legacy_trailing(ctx))


@register("Not")
def _not(ctx: OpContext) -> TCKernel:
    return elementwise(ctx, "!x", DType.BOOL, X)


@register("IsNaN")
def _isnan(ctx: OpContext) -> TCKernel:
    return elementwise(ctx, "x != x", DType.BOOL, X)


@register("IsInf")
def _isinf(ctx: OpContext) -> TCKernel:
    inf = literal(math.inf, ctx.dtype(0))
    tests = ([f"x == {inf}"] if ctx.attr("detect_positive", 1) else []) + \
            ([f"x == -{inf}"] if ctx.attr("detect_negative", 1) else [])
    return elementwise(ctx, " || ".join(tests) or literal(False, DType.BOOL), DType.BOOL, X)


# --- bits -----------------------------------------------------------------------------------

_BITWISE = {"BitwiseAnd": "a & b", "BitwiseOr": "a | b", "BitwiseXor": "a ^ b"}


@register(*_BITWISE)
def _bitwise(ctx: OpContext) -> TCKernel:
    return elementwise(ctx, _BITWISE[ctx.node.op], ctx.dtype(0), AB)


@register("BitwiseNot")
def _bitwise_not(ctx: OpContext) -> TCKernel:
    return elementwise(ctx, "~x", ctx.dtype(0), X)


@register("BitShift")
def _bit_shift(ctx: OpContext) -> TCKernel:
    """A count outside [0, bits) gives the sign fill, as TC's shifts define it."""
    direction = ctx.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise ctx.malformed(f"attribute direction is {direction!r}; it must be 'LEFT' or 'RIGHT'")
    return elementwise(ctx, "a << b" if direction == "LEFT" else "a >> b", ctx.dtype(0), AB)


@register("BitCast")
def _bit_cast(ctx: OpContext) -> TCKernel | View:
    to, dt = ctx.element_type("to"), ctx.dtype(0)
    if to is None:
        raise ctx.malformed("BitCast needs the attribute 'to'")
    if to.is_narrow or ctx.element(0).is_narrow:
        raise ctx.unsupported(f"BitCast from {ctx.element(0)} to {to}: polyfuse holds the narrow "
                              "types (float8, float4, int4, int2) in wider types, not in their bits")
    if to.bits != dt.bits:
        raise ctx.malformed(f"BitCast from {dt} ({dt.bits} bits) to {to} ({to.bits} bits); the "
                            "types must be equally wide")
    return identity(ctx) if to is dt else elementwise(ctx, f"as_{to}(x)", to, X)


# --- unary math ---------------------------------------------------------------------------

_UNARY = {
    "Neg": "-x", "Abs": "abs(x)", "Reciprocal": "1.0 / x", "Sqrt": "sqrt(x)", "Exp": "exp(x)",
    "Log": "log(x)", "Erf": "erf(x)", "Tanh": "tanh(x)", "Sigmoid": "sigmoid(x)",
    "Floor": "floor(x)", "Ceil": "ceil(x)", "Round": "rint(x)", "Sin": "sin(x)",
    "Cos": "cos(x)", "Tan": "tan(x)", "Asin": "asin(x)", "Acos": "acos(x)", "Atan": "atan(x)",
    "Sinh": "sinh(x)", "Cosh": "cosh(x)",
    "Asinh": "(x < 0 ? -1 : 1) * log(abs(x) + sqrt(x * x + 1))",
    "Acosh": "log(x + sqrt(x * x - 1))", "Atanh": "0.5 * log((1 + x) / (1 - x))",
}


@register(*_UNARY)
def _unary(ctx: OpContext) -> TCKernel:
    return elementwise(ctx, _UNARY[ctx.node.op], ctx.dtype(0), X)


@register("Sign")
def _sign(ctx: OpContext) -> TCKernel:
    # x itself for zero (and NaN); unsigned types have no -1
    unsigned = np.issubdtype(ctx.dtype(0).numpy, np.unsignedinteger)
    expr = "x > 0 ? 1 : x" if unsigned else "x > 0 ? 1 : (x < 0 ? -1 : x)"
    return elementwise(ctx, expr, ctx.dtype(0), X)


# --- variadic, selection, clipping ------------------------------------------------------------

def _variadic(ctx: OpContext) -> dict[str, int]:
    return {f"x{k}": k for k in range(len(ctx.types)) if ctx.has(k)}


@register("Max", "Min")
def _max_min(ctx: OpContext) -> TCKernel | View:
    operands = _variadic(ctx)
    if len(operands) == 1:
        return identity(ctx)
    fn = ctx.node.op.lower()  # max/min propagate NaN, as numpy's maximum/minimum
    expr = balanced(list(operands), lambda a, b: f"{fn}({a}, {b})")
    return elementwise(ctx, expr, ctx.dtype(0), operands)


@register("Sum", "Mean")
def _sum_mean(ctx: OpContext) -> TCKernel | View:
    operands = _variadic(ctx)
    if len(operands) == 1:
        return identity(ctx)
    expr = balanced(list(operands), lambda a, b: f"({a} + {b})")
    if ctx.node.op == "Mean":
        expr = f"({expr}) / {number(len(operands), ctx.dtype(0))}"
    return elementwise(ctx, expr, ctx.dtype(0), operands)


@register("Where")
def _where(ctx: OpContext) -> TCKernel:
    return elementwise(ctx, "c ? a : b", ctx.dtype(1), {"c": 0, "a": 1, "b": 2})


@register("Clip")
def _clip(ctx: OpContext) -> TCKernel | View:
    """Bounds are attributes before opset 11, optional inputs since; min > max gives max."""
    dt = ctx.dtype(0)
    operands = dict(X)
    lo: str | None = None
    hi: str | None = None
    if ctx.opset < 11:
        lo = None if ctx.attr("min") is None else number(ctx.attr("min"), dt)
        hi = None if ctx.attr("max") is None else number(ctx.attr("max"), dt)
    else:
        if ctx.has(1):
            operands["lo"], lo = 1, "lo"
        if ctx.has(2):
            operands["hi"], hi = 2, "hi"
    if lo is None and hi is None:
        return identity(ctx)
    expr = "x" if lo is None else f"max(x, {lo})"
    expr = expr if hi is None else f"min({expr}, {hi})"
    return elementwise(ctx, expr, dt, operands)


# --- casts and identities -------------------------------------------------------------------

def _cast(ctx: OpContext, to: DType) -> TCKernel | View:
    """A value of a narrow type (float8, int4, ...) is its storage type's: casting from
    one reads it; casting to one rounds in the kernel (:mod:`.narrow`)."""
    saturate = ctx.flag("saturate", 1)
    # a saturating cast to e5m2 turns even e5m2's infinities into its largest value
    if to is ctx.element(0) and not (saturate and to is DType.FLOAT8E5M2) or \
            to is ctx.dtype(0) and not to.is_narrow:
        return holding(identity(ctx), to)
    if not to.is_narrow:
        return holding(elementwise(ctx, "x", to, X), to)
    mode = ctx.attr("round_mode", "up")
    if mode not in ROUND_MODES:
        raise ctx.malformed(f"round_mode is {mode!r}; it must be one of {', '.join(ROUND_MODES)}")
    expr, lets = narrowed("x", ctx.dtype(0), to, saturate=saturate, round_mode=mode)
    return holding(elementwise(ctx, expr, to.storage, X, lets=lets), to)


@register("Cast")
def _cast_to(ctx: OpContext) -> TCKernel | View:
    to = ctx.element_type("to")
    if to is None:
        raise ctx.malformed("Cast needs the attribute 'to'")
    return _cast(ctx, to)


@register("CastLike")
def _cast_like(ctx: OpContext) -> TCKernel | View:
    return _cast(ctx, ctx.element(1))


@register("Identity")
def _identity(ctx: OpContext) -> View:
    return identity(ctx)


@register("Dropout")
def _dropout(ctx: OpContext) -> TCKernel | View:
    """Inference passes ``x`` through (the optional mask is all true); training, when the
    ``training_mode`` input asks for it, drops elements (see :func:`_training_dropout`)."""
    mask = len(ctx.node.outputs) > 1 and bool(ctx.node.outputs[1])
    mask_dtype = DType.BOOL if ctx.opset >= 10 else ctx.dtype(0)
    ratio = ctx.values[1] if ctx.has(1) else None
    training = ctx.opset >= 12 and ctx.has(2) and (ctx.values[2] is None or bool(ctx.values[2]))
    if training and not (ratio is not None and float(ratio) == 0):
        if ctx.element(0).is_narrow:
            raise ctx.unsupported(f"training Dropout of {ctx.element(0)} values (the scaled "
                                  "values would need rounding to the type)")
        return _training_dropout(ctx, mask)
    if not mask:
        return identity(ctx)
    return elementwise_outputs(ctx, [("x", ctx.dtype(0)), ("1", mask_dtype)], X)


_PRIME = 2147483647  # 2**31 - 1: squares of residues fit in int64


def _training_dropout(ctx: OpContext, mask: bool) -> TCKernel:
    """Keeps an element when a hash of its flat position and the seed, mapped to [0, 1),
    is at least the ratio, and scales kept ones by 1 / (1 - ratio).

    The draw is deterministic per seed but is not numpy's stream, so it matches the
    spec in distribution only (the spec leaves the generator to the implementation).
    """
    shape, dt = ctx.shape(0), ctx.dtype(0)
    strides = [math.prod(shape[k + 1:]) for k in range(len(shape))]
    flat = " + ".join(f"int64({INDEX[k]}) * {s}" for k, s in enumerate(strides)) or "int64(0)"
    seed = (int(ctx.attr("seed", 0)) * 16807 + 12345) % _PRIME
    operands = {"x": 0, "r": 1, "t": 2} if ctx.has(1) else {"x": 0, "t": 2}
    lets = {
        "h0": f"(({flat}) * 48271 + {seed}) % {_PRIME}",
        "h1": f"(h0 * h0 + 11) % {_PRIME}",
        "u": f"float64((h1 * h1 + 7) % {_PRIME}) / {float(_PRIME)!r}",
        "keep": "!t || u >= float64(r)",
    }
    if not ctx.has(1):
        lets = {"r": "0.5", **lets}
    outputs = [(f"keep ? x * {dt}(1.0 / (1.0 - float64(r))) : 0", dt), ("keep", DType.BOOL)]
    return elementwise_outputs(ctx, outputs[:2 if mask else 1], operands, lets=lets)
