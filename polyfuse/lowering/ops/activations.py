"""Activation functions: one expression over ``x`` per op, attributes substituted in;
SwiGLU gates a second input with one."""

from __future__ import annotations

import math

from polyfuse.lowering.ops import OpContext, TCKernel, register
from polyfuse.lowering.ops.elementwise import X, elementwise, number

# log(1 + exp(x)) without overflow for large x
SOFTPLUS = "max(x, 0) + log1p(exp(-abs(x)))"

# op -> (expression over x with {attribute} fields, the attributes' defaults)
ACTIVATIONS: dict[str, tuple[str, dict[str, float]]] = {
    "Relu": ("max(x, 0)", {}),
    "LeakyRelu": ("x >= 0 ? x : {alpha} * x", {"alpha": 0.01}),
    "Elu": ("x >= 0 ? x : {alpha} * expm1(x)", {"alpha": 1.0}),
    "Selu": ("x > 0 ? {gamma} * x : {gamma} * ({alpha} * exp(x) - {alpha})",
             {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}),
    "Celu": ("x > 0 ? x : {alpha} * expm1(x / {alpha})", {"alpha": 1.0}),
    "HardSigmoid": ("max(0, min(1, {alpha} * x + {beta}))", {"alpha": 0.2, "beta": 0.5}),
    "HardSwish": ("x * max(0, min(1, x / 6 + 0.5))", {}),
    "Softplus": (SOFTPLUS, {}),
    "Softsign": ("x / (1 + abs(x))", {}),
    "Mish": (f"x * tanh({SOFTPLUS})", {}),
    "Swish": ("x * sigmoid({alpha} * x)", {"alpha": 1.0}),
    "ThresholdedRelu": ("x > {alpha} ? x : 0", {"alpha": 1.0}),
    "Shrink": ("x < -{lambd} ? x + {bias} : (x > {lambd} ? x - {bias} : 0)",
               {"lambd": 0.5, "bias": 0.0}),
}

_GELU = {
    "none": f"0.5 * x * (1 + erf(x * {math.sqrt(0.5)!r}))",
    "tanh": f"0.5 * x * (1 + tanh({math.sqrt(2 / math.pi)!r} * (x + 0.044715 * x * x * x)))",
}


@register(*ACTIVATIONS)
def _activation(ctx: OpContext) -> TCKernel:
    expr, defaults = ACTIVATIONS[ctx.node.op]
    dt = ctx.dtype(0)
    values = {k: number(ctx.attr(k, d), dt) for k, d in defaults.items()}
    return elementwise(ctx, expr.format(**values), dt, X)


@register("Gelu")
def _gelu(ctx: OpContext) -> TCKernel:
    approximate = ctx.attr("approximate", "none")
    if approximate not in _GELU:
        raise ctx.unsupported(f"approximate='{approximate}' is not one of {sorted(_GELU)}")
    return elementwise(ctx, _GELU[approximate], ctx.dtype(0), X)


@register("PRelu")
def _prelu(ctx: OpContext) -> TCKernel:
    """``slope`` broadcasts to ``x``; before opset 7 a vector slope runs along channels."""
    shape, slope = ctx.shape(0), ctx.shape(1)
    channels = ctx.opset < 7 and len(slope) == 1 and len(shape) >= 2 and slope[0] == shape[1] > 1
    return elementwise(ctx, "x >= 0 ? x : s * x", ctx.dtype(0), {"x": 0, "s": 1},
                       trailing={1: len(shape) - 2} if channels else None)


@register("SwiGLU")
def _swiglu(ctx: OpContext) -> TCKernel:
    """Swish(A) * B; A and B have one shape (the op does not broadcast)."""
    if ctx.shape(0) != ctx.shape(1):
        raise ctx.malformed(f"A has shape {ctx.shape(0)} and B {ctx.shape(1)}; they must be equal")
    dt = ctx.dtype(0)
    alpha = number(ctx.attr("alpha", 1.0), dt)
    return elementwise(ctx, f"a * sigmoid({alpha} * a) * b", dt, {"a": 0, "b": 1})
