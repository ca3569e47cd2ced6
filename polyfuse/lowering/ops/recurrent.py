"""Stateful sequence ops of recurrent models (Mamba, Gated DeltaNet): CausalConvWithState
and LinearAttention. Each takes the state its last call left (or starts from zeros) and
returns the state after the new positions as ``present_state``.

Indices: ``i0`` batch, ``i1`` channel or head, ``i2`` position or key channel, ``i3``
value channel. Sums run in float32 for 16-bit inputs.
"""

from __future__ import annotations

import numpy as np

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import INDEX, OpContext, TCKernel, literal, register, tensor_param
from polyfuse.lowering.ops.movement import definition, statement

_ACTIVATIONS = {"none": "y", "silu": "y * sigmoid(y)", "swish": "y * sigmoid(y)"}


@register("CausalConvWithState")
def _causal_conv(ctx: OpContext) -> TCKernel:
    """A depthwise 1-D convolution over the past state followed by the input (which
    together are ``Padded``), each output reading its position and the k - 1 before."""
    ctx.rank(0, 3)
    (batch, channels, length), dt = ctx.shape(0), ctx.dtype(0)
    weight = ctx.shape(1)
    if len(weight) != 3 or weight[:2] != (channels, 1) or weight[2] < 1:
        raise ctx.malformed(f"the weight has shape {weight}; it must be ({channels}, 1, k) "
                            "with k >= 1")
    k = weight[2]
    state = (batch, channels, k - 1)
    for i, want in ((2, (channels,)), (3, state)):
        if ctx.has(i) and ctx.shape(i) != want:
            raise ctx.malformed(f"input {i} has shape {ctx.shape(i)}; it must have shape {want}")
    activation = ctx.attr("activation", "none")
    if activation not in _ACTIVATIONS:
        raise ctx.malformed(f"activation '{activation}' is not one of {sorted(_ACTIVATIONS)}")
    acc, at = dt.compute, INDEX[:3]
    params = [tensor_param("X", ctx.type(0)), tensor_param("W", ctx.type(1))]
    inputs = [0, 1]
    bias = ""
    if ctx.has(2):
        params.append(tensor_param("B", ctx.type(2)))
        inputs.append(2)
        bias = f" + {acc}(B(i1))"
    past = literal(0, dt)
    if ctx.has(3):
        params.append(tensor_param("Past", ctx.type(3)))
        inputs.append(3)
        past = "Past(i0, i1, i2)"
    padded = (batch, channels, length + k - 1)
    lines = [statement("Padded", at, past, state),
             statement("Padded", at, f"X(i0, i1, i2 - {k - 1})",
                       [batch, channels, f"{k - 1}:{padded[2]}"]),
             statement("Conv", at, f"{acc}(Padded(i0, i1, i2 + j)) * {acc}(W(i1, 0, j))",
                       ctx.shape(0), [f"j in 0:{k}"], op="+=!"),
             # the convolution is rounded to the input type before the activation
             statement("Y", at, f"{dt}({_ACTIVATIONS[activation]})", ctx.shape(0),
                       [f"y = {acc}({dt}(Conv(i0, i1, i2){bias}))"]),
             statement("Present", at, f"Padded(i0, i1, i2 + {length})", state)]
    outs = [tensor_param("Y", ctx.type(0)), tensor_param("Present", (dt, state)),
            tensor_param("Padded", (dt, padded)), tensor_param("Conv", (acc, ctx.shape(0)))]
    return TCKernel(definition(params, outs, lines), tuple(inputs), (0, 1))


_Q, _K, _V, _PAST, _DECAY, _BETA = range(6)
_RULES = {"linear": (False, False), "gated": (True, False), "delta": (False, True),
          "gated_delta": (True, True)}
# the recurrence is unrolled, a few statements per position: longer prefills need a
# chunked form polyfuse does not have yet
_MAX_STEPS = 64


def _linear_attention_shapes(ctx: OpContext, gated: bool, delta: bool) -> tuple[int, int, int, int]:
    """The query heads, key heads, key channels and value channels, with every input's
    shape checked against them."""
    for i in (_Q, _K, _V):
        ctx.rank(i, 3)
    hq, hk = (ctx.ints(ctx.attr(a), a, 1, least=1)[0] for a in ("q_num_heads", "kv_num_heads"))
    (batch, steps, width), kw, vw = ctx.shape(_Q), ctx.shape(_K)[2], ctx.shape(_V)[2]
    if hq % hk or width % hq or kw % hk or vw % hk or width // hq != kw // hk or \
            ctx.shape(_K)[:2] != (batch, steps) or ctx.shape(_V)[:2] != (batch, steps):
        raise ctx.malformed(f"query {ctx.shape(_Q)}, key {ctx.shape(_K)} and value "
                            f"{ctx.shape(_V)} do not split into {hq} query and {hk} key heads "
                            "(a multiple of them) with one key width")
    dk, dv = kw // hk, vw // hk
    for i, need, lasts in ((_DECAY, gated, (hk, hk * dk)), (_BETA, delta, (hk, 1))):
        if ctx.has(i) != need:
            raise ctx.malformed(f"update_rule '{ctx.attr('update_rule', 'gated_delta')}' "
                                f"{'needs' if need else 'takes no'} input {i}")
        if need and (len(ctx.shape(i)) != 3 or ctx.shape(i)[:2] != (batch, steps)
                     or ctx.shape(i)[2] not in lasts):
            raise ctx.malformed(f"input {i} has shape {ctx.shape(i)}; it must be ({batch}, "
                                f"{steps}, n) with n one of {lasts}")
    if ctx.has(_PAST) and ctx.shape(_PAST) != (batch, hk, dk, dv):
        raise ctx.malformed(f"past_state has shape {ctx.shape(_PAST)}; it must have shape "
                            f"{(batch, hk, dk, dv)}")
    return hq, hk, dk, dv


@register("LinearAttention")
def _linear_attention(ctx: OpContext) -> TCKernel:
    """The recurrence unrolled over the positions: state ``S<t>`` (batch, key head, key
    channel, value channel) after position t - 1, ``S0`` the past state or zeros. Each
    step decays the state, writes the key ⊗ value (for delta rules the value less what
    the state retrieves for the key, times beta) and reads it with the query."""
    rule = ctx.attr("update_rule", "gated_delta")
    if rule not in _RULES:
        raise ctx.malformed(f"update_rule '{rule}' is not one of {sorted(_RULES)}")
    gated, delta = _RULES[rule]
    hq, hk, dk, dv = _linear_attention_shapes(ctx, gated, delta)
    (batch, steps, _), dt = ctx.shape(_Q), ctx.dtype(_Q)
    if steps > _MAX_STEPS:
        raise ctx.unsupported(f"{steps} positions in one call; polyfuse unrolls the recurrence "
                              f"and takes at most {_MAX_STEPS}")
    acc = DType.FLOAT32
    sdt = ctx.dtype(_PAST) if ctx.has(_PAST) else dt
    scale = float(ctx.attr("scale", 0.0)) or 1 / np.sqrt(dk)
    inputs = [i for i in range(6) if ctx.has(i)]
    names = {_Q: "Q", _K: "K", _V: "V", _PAST: "Past", _DECAY: "G", _BETA: "Beta"}
    params = [tensor_param(names[i], ctx.type(i)) for i in inputs]
    state, heads_out = (batch, hk, dk, dv), (batch, steps, hq * dv)
    at = INDEX[:4]
    lines: list[str] = []
    temps: list[str] = []
    prev = "Past(i0, i1, {d}, i3)" if ctx.has(_PAST) else None
    for t in range(steps):
        key = f"{acc}(K(i0, {t}, i1 * {dk} + {{d}}))"
        value = f"{acc}(V(i0, {t}, i1 * {dv} + i3))"
        old = None if prev is None else f"{acc}({prev})"
        if old is not None and gated:
            per_channel = ctx.shape(_DECAY)[2] != hk
            g = f"G(i0, {t}, i1 * {dk} + {{d}})" if per_channel else f"G(i0, {t}, i1)"
            old = f"{old} * exp({acc}({g}))"
        if delta:
            if old is not None:
                lines.append(statement(f"R{t}", ["i0", "i1", "i3"],
                                       f"{old.format(d='j')} * {key.format(d='j')}",
                                       [batch, hk, dv], ["j in 0:" + str(dk)], op="+=!"))
                value = f"({value} - R{t}(i0, i1, i3))"
                temps.append(tensor_param(f"R{t}", (acc, (batch, hk, dv))))
            beta = "0" if ctx.shape(_BETA)[2] == 1 else "i1"
            value = f"{acc}(Beta(i0, {t}, {beta})) * {value}"
        update = f"{key.format(d='i2')} * {value}"
        rhs = update if old is None else f"{old.format(d='i2')} + {update}"
        lines.append(statement(f"S{t + 1}", at, rhs, state))
        temps.append(tensor_param(f"S{t + 1}", (acc, state)))
        prev = f"S{t + 1}(i0, i1, {{d}}, i3)"
        head = f"i2 / {dv}" if hq == hk else f"i2 / {dv * (hq // hk)}"
        lines.append(statement("Out", INDEX[:3], f"{acc}(Q(i0, i1, i2 / {dv} * {dk} + j)) * "
                               f"S{t + 1}(i0, {head}, j, i2 % {dv})",
                               [batch, f"{t}:{t + 1}", hq * dv], [f"j in 0:{dk}"], op="+=!"))
    lines.append(statement("Y", INDEX[:3], f"{dt}(Out(i0, i1, i2) * {literal(scale, acc)})",
                           heads_out))
    lines.append(statement("Present", at, f"{sdt}(S{steps}(i0, i1, i2, i3))", state))
    outs = [tensor_param("Y", (dt, heads_out)), tensor_param("Present", (sdt, state)),
            tensor_param("Out", (acc, heads_out))]
    return TCKernel(definition(params, outs + temps, lines), tuple(inputs), (0, 1))
