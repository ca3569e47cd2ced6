"""Elementwise ops with numpy broadcasting."""

from __future__ import annotations

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import (INDEX, OpContext, TCKernel, access, broadcast_indices,
                                   broadcast_shape, literal, ranges, register, tensor_param)


def elementwise(ctx: OpContext, expr: str, out_dtype: DType | None = None,
                positions: tuple[int, ...] | None = None) -> TCKernel:
    """A kernel computing ``expr`` (with ``{0}``, ``{1}``... for the broadcast inputs)."""
    positions = positions if positions is not None else tuple(
        i for i in range(len(ctx.types)) if ctx.has(i))
    shapes = [ctx.shape(i) for i in positions]
    out = broadcast_shape(*shapes)
    params = ", ".join(tensor_param(f"X{k}", ctx.types[i]) for k, i in enumerate(positions))  # type: ignore[arg-type]
    reads = [access(f"X{k}", broadcast_indices(s, out)) for k, s in enumerate(shapes)]
    body = expr.format(*reads)
    if out_dtype is not None:
        body = f"{out_dtype}({body})"
    out_type = f"{out_dtype}({', '.join(map(str, out))}) Y" if out_dtype else "Y"
    src = (f"def k({params}) -> ({out_type}) {{\n"
           f"  Y({', '.join(INDEX[:len(out)])}) = {body}{ranges(out)}\n}}\n")
    return TCKernel(src, positions)


_BINARY = {"Add": "{0} + {1}", "Sub": "{0} - {1}", "Mul": "{0} * {1}"}


@register(*_BINARY)
def _binary(ctx: OpContext) -> TCKernel:
    return elementwise(ctx, _BINARY[ctx.node.op], ctx.dtype(0))


@register("Div")
def _div(ctx: OpContext) -> TCKernel:
    dt = ctx.dtype(0)
    if dt.is_int:  # ONNX integer division truncates toward zero; TC's '/' floors
        q = "{0} / {1}"
        fix = "(({0} % {1} != " + literal(0, dt) + ") && (({0} < " + literal(0, dt) + \
              ") != ({1} < " + literal(0, dt) + ")) ? " + literal(1, dt) + " : " + literal(0, dt) + ")"
        return elementwise(ctx, f"{q} + {fix}", dt)
    return elementwise(ctx, "{0} / {1}", dt)


_UNARY = {
    "Relu": "fmax({0}, 0.0)", "Neg": "-{0}", "Abs": "abs({0})", "Sqrt": "sqrt({0})",
    "Exp": "exp({0})", "Log": "log({0})", "Tanh": "tanh({0})", "Sigmoid": "sigmoid({0})",
    "Erf": "erf({0})", "Reciprocal": "1.0 / {0}", "Identity": "{0}",
}


@register(*_UNARY)
def _unary(ctx: OpContext) -> TCKernel:
    expr = _UNARY[ctx.node.op]
    dt = ctx.dtype(0)
    if dt.is_int and ctx.node.op == "Relu":
        expr = "max({0}, " + literal(0, dt) + ")"
    return elementwise(ctx, expr, dt, positions=(0,))
