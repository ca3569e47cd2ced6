"""Normalizations: BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, RMSNormalization, LpNormalization, MeanVarianceNormalization and LRN.

Statistics are reductions (see :mod:`reductions`) into temporaries ``Mean``, ``Var``
and ``Inv`` (the inverse standard deviation), computed in float32 for 16-bit inputs or
in the stash type where the op has one; the output is then one elementwise statement.
"""

from __future__ import annotations

from collections.abc import Sequence

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import (INDEX, OpContext, TCKernel, access, broadcast_indices,
                                   broadcast_shape, literal, register, tensor_param)
from polyfuse.lowering.ops.reductions import Reduced, tc_kernel

# ONNX TensorProto element types a stash_type attribute may name
_STASH = {1: DType.FLOAT32, 10: DType.FLOAT16, 11: DType.FLOAT64, 16: DType.BFLOAT16}


def _stash(ctx: OpContext) -> DType:
    code = int(ctx.attr("stash_type", 1))
    if code not in _STASH:
        raise ctx.unsupported(f"stash_type {code} is not a floating-point type")
    return _STASH[code].compute


def _check_params(ctx: OpContext, inputs: Sequence[int], shape: Sequence[int], what: str) -> None:
    """Inputs ``inputs`` (scale, bias, statistics), where given, have ``shape``."""
    for i in inputs:
        if ctx.has(i) and ctx.shape(i) != tuple(shape):
            raise ctx.malformed(f"input {i} has shape {ctx.shape(i)}; it must have shape "
                                f"{tuple(shape)} ({what})")


def moments(x: str, lhs: Sequence[str], count: int, eps: float, acc: DType,
            where: str = "") -> list[str]:
    """Statements setting ``Mean(lhs)``, ``Var(lhs)`` and ``Inv(lhs)`` to the mean of
    ``x`` over its reduction indices, its biased variance (as ONNX uses) and
    1 / sqrt(variance + eps)."""
    mean, var, inv = access("Mean", lhs), access("Var", lhs), access("Inv", lhs)
    n = literal(count, acc)
    return [f"{mean} +=! {x}{where}",
            f"{mean} = {mean} / {n}",
            f"{var} +=! ({x} - {mean}) * ({x} - {mean}){where}",
            f"{var} = {var} / {n}",
            f"{inv} = {literal(1, acc)} / sqrt({var} + {literal(eps, acc)})"]


def statistics(acc: DType, shape: Sequence[int]) -> list[str]:
    """Declarations of the temporaries ``moments`` writes (Mean, Var, Inv)."""
    return [tensor_param(n, (acc, shape)) for n in ("Mean", "Var", "Inv")]


def _normalize(dt: DType, x: str, mean: str, inv: str, scale: str, bias: str) -> str:
    return f"{dt}(({x} - {mean}) * {inv} * {scale} + {bias})"


@register("BatchNormalization")
def _batch_norm(ctx: OpContext) -> TCKernel:
    shape, dt = ctx.shape(0), ctx.dtype(0)
    if len(shape) < 2:
        raise ctx.unsupported("the input needs a batch and a channel dimension")
    eps, momentum = float(ctx.attr("epsilon", 1e-5)), float(ctx.attr("momentum", 0.9))
    wanted = tuple(k for k, name in enumerate(ctx.node.outputs) if name)
    # before opset 14 a node with the statistics outputs normalizes with the batch's
    # statistics, as onnxruntime runs it (opset 6 and earlier: unless is_test)
    if ctx.opset >= 14:
        training = bool(ctx.attr("training_mode", 0))
    else:
        training = wanted != (0,) and not (ctx.opset < 7 and ctx.attr("is_test", 0))
    if training and any(k > 4 for k in wanted):
        raise ctx.malformed(f"it has {len(ctx.node.outputs)} outputs; BatchNormalization has "
                            "at most 5")
    acc = dt.compute
    full = INDEX[:len(shape)]
    # before opset 9, spatial=0 gives the statistics a value per element of (C, D1, ...)
    _check_params(ctx, range(1, 5), shape[1:1 + max(1, len(ctx.shape(1)))], "one value per channel")
    p = [INDEX[1 + k] for k in range(len(ctx.shape(1)))]
    params = [tensor_param(n, ctx.types[k]) for k, n in  # type: ignore[arg-type]
              enumerate(("X", "Scale", "B", "RunMean", "RunVar"))]
    x = access("X", full)
    out = [tensor_param("Y", (dt, shape))]
    if not training:
        inv = f"{literal(1, acc)} / sqrt({access('RunVar', p)} + {literal(eps, acc)})"
        lines = [f"{access('Y', full)} = " + _normalize(
            dt, x, access("RunMean", p), inv, access("Scale", p), access("B", p))]
        return tc_kernel(params, out, lines, (0, 1, 2, 3, 4))
    red = Reduced(len(shape), tuple(d for d in range(len(shape)) if d != 1), False)
    count = red.count(shape)
    lines = moments(access("X", red.reduction), ["i1"], count, eps, acc)
    lines.append(f"{access('Y', full)} = " + _normalize(
        dt, x, "Mean(i1)", "Inv(i1)", "Scale(i1)", "B(i1)"))
    m, keep = literal(momentum, acc), literal(1 - momentum, acc)
    running = {1: f"RunMean(i1) * {m} + Mean(i1) * {keep}",
               2: f"RunVar(i1) * {m} + Var(i1) * {keep}"}
    # saved statistics (opsets 7-13): the batch mean and, as onnxruntime saves it, the
    # inverse standard deviation
    running.update({3: "Mean(i1)", 4: "Inv(i1)"})
    names = {1: "OutMean", 2: "OutVar", 3: "SavedMean", 4: "SavedInv"}
    for k in wanted[1:]:
        lines.append(f"{names[k]}(i1) = {dt}({running[k]})")
        out.append(tensor_param(names[k], (dt, (shape[1],))))
    out += statistics(acc, (shape[1],))
    return tc_kernel(params, out, lines, (0, 1, 2, 3, 4), wanted)


@register("InstanceNormalization")
def _instance_norm(ctx: OpContext) -> TCKernel:
    shape, dt = ctx.shape(0), ctx.dtype(0)
    ctx.rank(0, least=2)
    _check_params(ctx, (1, 2), shape[1:2], "one value per channel")
    acc = dt.compute
    red = Reduced(len(shape), tuple(range(2, len(shape))), False)
    full = INDEX[:len(shape)]
    lines = moments(access("X", red.reduction), ["i0", "i1"], red.count(shape),
                    float(ctx.attr("epsilon", 1e-5)), acc)
    lines.append(f"{access('Y', full)} = " + _normalize(
        dt, access("X", full), "Mean(i0, i1)", "Inv(i0, i1)", "Scale(i1)", "B(i1)"))
    params = [tensor_param(n, ctx.types[k]) for k, n in  # type: ignore[arg-type]
              enumerate(("X", "Scale", "B"))]
    out = [tensor_param("Y", (dt, shape)), *statistics(acc, shape[:2])]
    return tc_kernel(params, out, lines, (0, 1, 2))


@register("LayerNormalization")
def _layer_norm(ctx: OpContext) -> TCKernel:
    shape, dt = ctx.shape(0), ctx.dtype(0)
    axis = ctx.axis(ctx.attr("axis", -1), len(shape))
    for i in (1, 2):
        if ctx.has(i) and broadcast_shape(ctx.shape(i), shape[axis:]) != shape[axis:]:
            raise ctx.malformed(f"input {i} has shape {ctx.shape(i)}, which does not broadcast "
                                f"to the normalized dimensions {shape[axis:]}")
    acc = _stash(ctx)
    red = Reduced(len(shape), tuple(range(axis, len(shape))), True)
    full = INDEX[:len(shape)]
    lines = moments(access("X", red.reduction), red.lhs, red.count(shape),
                    float(ctx.attr("epsilon", 1e-5)), acc)
    scale = access("Scale", broadcast_indices(ctx.shape(1), shape))
    inputs: tuple[int, ...] = (0, 1)
    bias = literal(0, acc)
    if ctx.has(2):
        bias = access("B", broadcast_indices(ctx.shape(2), shape))
        inputs = (0, 1, 2)
    lines.append(f"{access('Y', full)} = " + _normalize(
        dt, access("X", full), access("Mean", red.spread), access("Inv", red.spread), scale, bias))
    params = [tensor_param(n, ctx.types[k])  # type: ignore[arg-type]
              for k, n in zip(inputs, ("X", "Scale", "B"))]
    # Mean and InvStdDev are optional outputs: declare the wanted ones first
    mean, var, inv = statistics(acc, red.shape(shape))
    declared = {0: tensor_param("Y", (dt, shape)), 1: mean, 2: inv}
    wanted = tuple(k for k, name in enumerate(ctx.node.outputs) if name and k < 3)
    out = [declared[k] for k in wanted] + [declared[k] for k in (1, 2) if k not in wanted]
    out.append(var)
    return tc_kernel(params, out, lines, inputs, wanted)


@register("GroupNormalization")
def _group_norm(ctx: OpContext) -> TCKernel:
    shape, dt = ctx.shape(0), ctx.dtype(0)
    groups = ctx.ints(ctx.attr("num_groups"), "num_groups", 1)[0]
    if len(shape) < 2 or groups <= 0 or shape[1] % groups:
        raise ctx.unsupported(f"{shape[1] if len(shape) > 1 else 0} channels do not split "
                              f"into {groups} groups")
    per = shape[1] // groups
    _check_params(ctx, (1, 2), (shape[1] if ctx.opset >= 21 else groups,),
                  "one value per channel" if ctx.opset >= 21 else "one value per group")
    acc = _stash(ctx) if ctx.opset >= 21 else dt.compute
    rest = [f"r{d}" for d in range(2, len(shape))]
    x = access("X", ["i0", f"g * {per} + c", *rest])
    count = per * Reduced(len(shape), tuple(range(2, len(shape))), False).count(shape)
    lines = moments(x, ["i0", "g"], count, float(ctx.attr("epsilon", 1e-5)), acc,
                    where=f" where c in 0:{per}")
    full = INDEX[:len(shape)]
    group = f"i1 / {per}"
    # opset 18 scales and shifts per group, opset 21 per channel
    channel = "i1" if ctx.opset >= 21 else group
    lines.append(f"{access('Y', full)} = " + _normalize(
        dt, access("X", full), f"Mean(i0, {group})", f"Inv(i0, {group})",
        f"Scale({channel})", f"B({channel})"))
    params = [tensor_param(n, ctx.types[k]) for k, n in  # type: ignore[arg-type]
              enumerate(("X", "Scale", "B"))]
    out = [tensor_param("Y", (dt, shape)), *statistics(acc, (shape[0], groups))]
    return tc_kernel(params, out, lines, (0, 1, 2))


@register("LRN")
def _lrn(ctx: OpContext) -> TCKernel:
    shape, dt = ctx.shape(0), ctx.dtype(0)
    ctx.rank(0, least=2)
    size = ctx.ints(ctx.attr("size"), "size", 1, least=1)[0]
    alpha, beta = float(ctx.attr("alpha", 1e-4)), float(ctx.attr("beta", 0.75))
    bias = float(ctx.attr("bias", 1.0))
    acc = dt.compute
    channels, before = shape[1], (size - 1) // 2
    full = INDEX[:len(shape)]
    # the window c - before .. c - before + size - 1, clipped to the channels; the clamp
    # keeps range inference from shrinking i1 to the channels with a full window
    near = access("X", ["i0", f"min(max(i1 + j - {before}, 0), {channels - 1})", *full[2:]])
    inside = f"i1 + j >= {before} && i1 + j < {channels + before}"
    lines = [f"{access('S', full)} +=! ({inside}) ? {acc}({near}) * {acc}({near}) : "
             f"{literal(0, acc)} where j in 0:{size}",
             f"{access('Y', full)} = {dt}({access('X', full)} / pow({literal(bias, acc)} + "
             f"{literal(alpha / size, acc)} * {access('S', full)}, {literal(beta, acc)}))"]
    out = [tensor_param("Y", (dt, shape)), tensor_param("S", (acc, shape))]
    return tc_kernel([tensor_param("X", (dt, shape))], out, lines, (0,))


@register("RMSNormalization")
def _rms_norm(ctx: OpContext) -> TCKernel:
    """X / sqrt(mean(X²) + eps) over the axes from ``axis`` on, in the stash type, rounded
    to X's type and then scaled (the output has the scale's type)."""
    shape, dt, out = ctx.shape(0), ctx.dtype(0), ctx.dtype(1)
    axis = ctx.axis(ctx.attr("axis", -1), len(shape))
    if len(ctx.shape(1)) > len(shape) or any(
            w not in (1, d) for w, d in zip(reversed(ctx.shape(1)), reversed(shape))):
        raise ctx.malformed(f"the scale has shape {ctx.shape(1)}, which does not broadcast "
                            f"to the input's {shape}")
    acc = _stash(ctx)
    red = Reduced(len(shape), tuple(range(axis, len(shape))), True)
    full = INDEX[:len(shape)]
    x = f"{acc}({access('X', red.reduction)})"
    inv, scale = access("Inv", red.lhs), access("Scale", broadcast_indices(ctx.shape(1), shape))
    lines = [f"{inv} +=! {x} * {x}",
             f"{inv} = {literal(1, acc)} / sqrt({inv} / {literal(red.count(shape), acc)} + "
             f"{literal(float(ctx.attr('epsilon', 1e-5)), acc)})",
             f"{access('Y', full)} = {out}({out}({dt}({acc}({access('X', full)}) * "
             f"{access('Inv', red.spread)})) * {scale})"]
    params = [tensor_param("X", ctx.type(0)), tensor_param("Scale", ctx.type(1))]
    outs = [tensor_param("Y", (out, shape)), tensor_param("Inv", (acc, red.shape(shape)))]
    return tc_kernel(params, outs, lines, (0, 1))


@register("LpNormalization")
def _lp_norm(ctx: OpContext) -> TCKernel:
    """X divided by its L1 or L2 norm along ``axis``; a zero norm gives 0."""
    shape, dt = ctx.shape(0), ctx.dtype(0)
    axis = ctx.axis(ctx.attr("axis", -1), len(shape))
    p = ctx.ints(ctx.attr("p", 2), "p", 1)[0]
    if p not in (1, 2):
        raise ctx.malformed(f"p is {p}; it must be 1 or 2")
    acc = dt.compute
    red = Reduced(len(shape), (axis,), True)
    full = INDEX[:len(shape)]
    x = f"{acc}({access('X', red.reduction)})"
    norm = access("Norm", red.lhs)
    lines = [f"{norm} +=! " + (f"abs({x})" if p == 1 else f"{x} * {x}")]
    if p == 2:
        lines.append(f"{norm} = sqrt({norm})")
    spread = access("Norm", red.spread)
    lines.append(f"{access('Y', full)} = {spread} == {literal(0, acc)} ? {literal(0, dt)} : "
                 f"{dt}({acc}({access('X', full)}) / {spread})")
    outs = [tensor_param("Y", (dt, shape)), tensor_param("Norm", (acc, red.shape(shape)))]
    return tc_kernel([tensor_param("X", ctx.type(0))], outs, lines, (0,))


@register("MeanVarianceNormalization")
def _mean_variance_norm(ctx: OpContext) -> TCKernel:
    """(X - mean) / (standard deviation + 1e-9) over ``axes`` (default 0, 2, 3), as the
    op's function body defines it."""
    shape, dt = ctx.shape(0), ctx.dtype(0)
    axes = ctx.axes(ctx.attr("axes", [0, 2, 3]), len(shape))
    acc = dt.compute
    red = Reduced(len(shape), tuple(sorted(axes)), True)
    full = INDEX[:len(shape)]
    lines = moments(f"{acc}({access('X', red.reduction)})", red.lhs, red.count(shape), 0.0, acc)
    lines.append(f"{access('Y', full)} = {dt}(({acc}({access('X', full)}) - "
                 f"{access('Mean', red.spread)}) / (sqrt({access('Var', red.spread)}) + "
                 f"{literal(1e-9, acc)}))")
    outs = [tensor_param("Y", (dt, shape)), *statistics(acc, red.shape(shape))]
    return tc_kernel([tensor_param("X", ctx.type(0))], outs, lines, (0,))
