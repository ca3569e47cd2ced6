"""Loss ops: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (inference only).

Both pick, per sample element ``(n, d1, ...)``, the log-probability of its target class
``t`` (an indirect read along the class axis 1), weighted by ``W(t)``; an element whose
target is ``ignore_index`` counts zero and its class index is read as 0, so an ignored
target outside the classes never reads out of bounds. ``mean`` divides the sum by the
sum of the weights of the elements not ignored, as ONNX defines it.
"""

from __future__ import annotations

import math

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import INDEX, OpContext, TCKernel, access, literal, register, tensor_param
from polyfuse.lowering.ops.reductions import tc_kernel

_REDUCTIONS = ("none", "sum", "mean")


def _loss_lines(ctx: OpContext, logp: str, shape: tuple[int, ...], acc: DType,
                dt: DType) -> tuple[list[str], list[str]]:
    """Statements computing the loss from the log-probabilities in tensor ``logp`` (of
    ``shape``, classes on axis 1) with the targets ``T`` and weights ``W`` (input 2),
    and the declarations of the loss output and its temporaries."""
    reduction = ctx.attr("reduction", "mean")
    if reduction not in _REDUCTIONS:
        raise ctx.malformed(f"reduction is {reduction!r}; it must be one of {', '.join(_REDUCTIONS)}")
    target = ctx.shape(1)
    if len(shape) < 2 or target != shape[:1] + shape[2:]:
        raise ctx.malformed(f"the input has shape {shape} and the target {target}; the input "
                            "must be (N, C, d1, ...) and the target (N, d1, ...)")
    if ctx.has(2) and ctx.shape(2) != shape[1:2]:
        raise ctx.malformed(f"the weight has shape {ctx.shape(2)}; it must have one value per "
                            f"class {shape[1:2]}")
    tdt = ctx.dtype(1)
    sample = [INDEX[0]] + list(INDEX[2:len(shape)])
    t = access("T", sample)
    ignore = ctx.attr("ignore_index")
    kept = f"{t} != {literal(ignore, tdt)}" if ignore is not None else None
    cls = f"({kept} ? {t} : {literal(0, tdt)})" if kept else t
    weight = f"{acc}(W({cls}))" if ctx.has(2) else literal(1, acc)
    if kept:
        weight = f"({kept} ? {weight} : {literal(0, acc)})"
    picked = access(logp, [INDEX[0], cls] + sample[1:])
    loss = f"-{acc}({picked}) * {weight}"
    if reduction == "none":
        return [f"{access('L', sample)} = {dt}({loss})"], [tensor_param("L", (dt, target))]
    lines = [f"Sum() +=! {loss}"]
    decls = [tensor_param("L", (dt, ())), tensor_param("Sum", (acc, ()))]
    if reduction == "sum":
        return lines + [f"L() = {dt}(Sum())"], decls
    if not (kept or ctx.has(2)):   # every weight is 1: the count of sample elements
        return lines + [f"L() = {dt}(Sum() / {literal(math.prod(target), acc)})"], decls
    lines += [f"Weight() +=! {weight}", f"L() = {dt}(Sum() / Weight())"]
    return lines, decls + [tensor_param("Weight", (acc, ()))]


def _params(ctx: OpContext) -> tuple[list[str], tuple[int, ...]]:
    positions = (0, 1, 2) if ctx.has(2) else (0, 1)
    return [tensor_param(n, ctx.type(k)) for n, k in zip("XTW", positions)], positions


@register("NegativeLogLikelihoodLoss")
def _nll(ctx: OpContext) -> TCKernel:
    shape, dt = ctx.shape(0), ctx.dtype(0)
    lines, decls = _loss_lines(ctx, "X", shape, dt.compute, dt)
    params, positions = _params(ctx)
    return tc_kernel(params, decls, lines, positions)


@register("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(ctx: OpContext) -> TCKernel:
    """The log-softmax along the classes (output 1 when asked), then the NLL loss of it."""
    shape, dt = ctx.shape(0), ctx.dtype(0)
    acc = dt.compute
    full = INDEX[:len(shape)]
    rest = [INDEX[0]] + list(INDEX[2:len(shape)])
    over = [INDEX[0], "c"] + rest[1:]
    lines = [f"{access('M', rest)} max=! {access('X', over)}",
             f"{access('S', rest)} +=! exp({acc}({access('X', over)}) - {access('M', rest)})",
             f"{access('P', full)} = {acc}({access('X', full)}) - {access('M', rest)} - "
             f"log({access('S', rest)})"]
    loss, decls = _loss_lines(ctx, "P", shape, acc, dt)
    temps = [tensor_param(n, (acc, shape[:1] + shape[2:])) for n in "MS"]
    wanted = tuple(k for k, name in enumerate(ctx.node.outputs) if name)
    if 1 in wanted:
        lines.append(f"{access('LogProb', full)} = {dt}({access('P', full)})")
        decls = decls[:1] + [tensor_param("LogProb", (dt, shape))] + decls[1:]
    params, positions = _params(ctx)
    return tc_kernel(params, decls + temps + [tensor_param("P", (acc, shape))], lines + loss,
                     positions, wanted)
