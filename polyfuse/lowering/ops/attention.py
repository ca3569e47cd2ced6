"""Attention (opsets 23-25): softmax(Q Kᵀ · scale + bias) V in one kernel; and the
RotaryEmbedding applied to its queries and keys.

Indices: ``i0`` batch, ``i1`` query head, ``i2`` query position, ``i3`` key position
(or value channel for the output), ``d`` the contracted head channel. 3-D inputs
(batch, sequence, heads · channels) are read in place, never transposed. The key and
value caches, when given, are concatenated with the new keys and values into the
``present`` outputs (two statements over the two ranges of positions). Grouped-query
attention reads key head ``i1 / (query heads / key heads)``.

The additive bias is one expression: the attention mask's value (a float mask, or 0 for
a true boolean one) where the causal frontier, the sliding window and the padding
length allow the key, else -inf. A mask shorter than the keys is padded with -inf
(false), as ONNX defines. The softmax runs in float32 (float64 when softmax_precision
asks), a row whose bias is -inf everywhere gives probabilities 0 (so its output is 0),
and the probabilities are rounded to the input type before multiplying V, as the
ONNX reference does.
"""

from __future__ import annotations

import numpy as np

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import (INDEX, OpContext, TCKernel, access, broadcast_indices,
                                   literal, register, tensor_param)
from polyfuse.lowering.ops.movement import definition, statement

_Q, _K, _V, _MASK, _PAST_K, _PAST_V, _NONPAD = range(7)
B, H, S, J = INDEX[:4]


class _Operand:
    """How to read Q, K or V at (batch, head, position, channel) from a 3-D or 4-D input."""

    def __init__(self, name: str, shape: tuple[int, ...], heads: int) -> None:
        self.name, self.flat = name, len(shape) == 3
        self.length = shape[1] if self.flat else shape[2]
        self.channels = shape[2] // heads if self.flat else shape[3]

    def read(self, b: str, h: str, pos: str, c: str) -> str:
        if self.flat:
            return f"{self.name}({b}, {pos}, {h} * {self.channels} + {c})"
        return f"{self.name}({b}, {h}, {pos}, {c})"


def _heads(ctx: OpContext, rank: int) -> tuple[int, int]:
    q, kv = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
    if rank == 4:
        return ctx.shape(_Q)[1], ctx.shape(_K)[1]
    if q is None or kv is None:
        raise ctx.malformed("3-D inputs need the q_num_heads and kv_num_heads attributes")
    q, kv = int(q), int(kv)
    for i, heads in ((_Q, q), (_K, kv), (_V, kv)):
        if heads <= 0 or ctx.shape(i)[2] % heads:
            raise ctx.malformed(f"input {i}'s hidden size {ctx.shape(i)[2]} does not divide into "
                                f"{heads} heads")
    return q, kv


def _allowed(ctx: OpContext, length: int, past: int) -> list[str]:
    """Conditions under which query ``S`` may attend key ``J`` (beside the mask)."""
    if ctx.has(_NONPAD):
        offset = f"NonPad({B}) - {length}"       # the external cache's frontier per batch
    else:
        offset = str(past)
    at = f"int64({S}) + {offset}"
    conds = [f"int64({J}) <= {at}"] if ctx.flag("is_causal", 0) else []
    left, right = int(ctx.attr("left_window_size", -1)), int(ctx.attr("right_window_size", -1))
    if left >= 0:
        conds.append(f"{at} - int64({J}) <= {left}")
    if right >= 0:
        conds.append(f"int64({J}) - ({at}) <= {right}")
    if ctx.has(_NONPAD):
        conds.append(f"int64({J}) < NonPad({B})")
    return conds


def _mask(ctx: OpContext, out: tuple[int, ...], acc: DType, params: list[str],
          lines: list[str], temps: list[str]) -> str | None:
    """The mask's value at (B, H, S, J) (padded to the keys), or None without a mask."""
    if not ctx.has(_MASK):
        return None
    shape, mdt = ctx.shape(_MASK), ctx.dtype(_MASK)
    if not shape or len(shape) > 4 or shape[-1] > out[3]:
        raise ctx.malformed(f"the attention mask has shape {shape}; it must have rank 1 to 4 "
                            f"and at most {out[3]} keys")
    params.append(tensor_param("Mask", ctx.type(_MASK)))
    padded = shape[:-1] + (out[3],)
    try:
        np.broadcast_shapes(padded, out)
    except ValueError:
        raise ctx.malformed(f"the attention mask of shape {shape} does not broadcast to the "
                            f"scores {out}") from None
    idx = broadcast_indices(padded, out)
    names = list(INDEX[4 - len(shape):4])
    if shape[-1] < out[3]:
        fill = "bool(0)" if mdt.is_bool else literal(float("-inf"), mdt)
        lines.append(statement("Padded", names, access("Mask", names), shape))
        lines.append(statement("Padded", names, fill, list(shape[:-1]) + [f"{shape[-1]}:{out[3]}"]))
        temps.append(tensor_param("Padded", (mdt, padded)))
        read = access("Padded", idx)
    else:
        read = access("Mask", idx)
    return read if mdt.is_bool else f"{acc}({read})"


@register("Attention")
def _attention(ctx: OpContext) -> TCKernel:
    rank = ctx.rank(_Q, 3, 4)
    if ctx.rank(_K, rank) != rank or ctx.rank(_V, rank) != rank:
        raise ctx.malformed("Q, K and V must have one rank")
    hq, hk = _heads(ctx, rank)
    dt = ctx.dtype(_Q)
    q = _Operand("Q", ctx.shape(_Q), hq)
    k, v = _Operand("K", ctx.shape(_K), hk), _Operand("V", ctx.shape(_V), hk)
    batch, length = ctx.shape(_Q)[0], q.length
    if hq % hk or k.channels != q.channels or k.length != v.length:
        raise ctx.malformed(f"{hq} query heads of {q.channels} channels cannot attend {hk} key "
                            f"heads of {k.channels} channels ({k.length} keys, {v.length} values)")
    if ctx.has(_PAST_K) != ctx.has(_PAST_V) or (ctx.has(_PAST_K) and ctx.has(_NONPAD)):
        raise ctx.malformed("past_key and past_value come together, and not with nonpad_kv_seqlen")
    past = ctx.shape(_PAST_K)[2] if ctx.has(_PAST_K) else 0
    keys = past + k.length
    at, cell, row = INDEX[:4], f"{B}, {H}, {S}, {J}", f"{B}, {H}, {S}"   # a score's indices, a row's
    precision = ctx.attr("softmax_precision")
    acc = DType.FLOAT64 if precision == 11 or dt is DType.FLOAT64 else DType.FLOAT32
    params = [tensor_param(n, ctx.type(i)) for n, i in (("Q", _Q), ("K", _K), ("V", _V))]
    inputs = [_Q, _K, _V]
    lines: list[str] = []
    temps: list[str] = []
    mask = _mask(ctx, (batch, hq, length, keys), acc, params, lines, temps)
    if mask is not None:
        inputs.append(_MASK)
    wanted = tuple(o for o, name in enumerate(ctx.node.outputs) if name)
    outs: dict[int, str] = {}
    present = {1: ("PresentK", k, _PAST_K, k.channels), 2: ("PresentV", v, _PAST_V, v.channels)}
    reads = {}
    for o, (name, op, past_input, channels) in present.items():
        if past or o in wanted:
            shape = (batch, hk, keys, channels)
            ranges: list[int | str] = [batch, hk, f"{past}:{keys}", channels]
            if past:
                params.append(tensor_param(f"Past{name[7]}", ctx.type(past_input)))
                inputs.append(past_input)
                lines.append(statement(name, at, access(f"Past{name[7]}", at),
                                       [batch, hk, past, channels]))
            lines.append(statement(name, at, op.read(B, H, f"{S} - {past}" if past else S, J), ranges))
            outs[o] = tensor_param(name, (dt, shape))
            reads[o] = lambda b, h, pos, c, name=name: f"{name}({b}, {h}, {pos}, {c})"
        else:
            reads[o] = op.read
    if ctx.has(_NONPAD):
        params.append(tensor_param("NonPad", ctx.type(_NONPAD)))
        inputs.append(_NONPAD)
    # the ONNX reference scales Q and K each by sqrt(scale), rounded to the input type
    scale = ctx.attr("scale")
    scale = 1 / np.sqrt(q.channels) if scale is None else float(scale)
    root = float(dt.numpy.type(np.sqrt(scale))) if dt is not DType.BFLOAT16 else float(np.sqrt(scale))
    kv_head = H if hq == hk else f"{H} / {hq // hk}"
    scores = (batch, hq, length, keys)
    lines.append(statement("Score", at, f"{acc}({q.read(B, H, S, 'd')}) * "
                           f"{acc}({reads[1](B, kv_head, J, 'd')})", scores,
                           [f"d in 0:{q.channels}"], op="+=!"))
    logit = f"Score({cell}) * {literal(root * root, acc)}"
    softcap = float(ctx.attr("softcap", 0.0))
    if softcap > 0:
        logit = f"{literal(softcap, acc)} * tanh({logit} / {literal(softcap, acc)})"
    lines.append(statement("Capped", at, logit, scores))
    neg_inf = literal(float("-inf"), acc)
    conds = _allowed(ctx, length, past)
    value = literal(0, acc)
    if mask is not None and ctx.dtype(_MASK).is_bool:
        conds.append(mask)
    elif mask is not None:
        value = mask
    bias = f"({' && '.join(conds)}) ? {value} : {neg_inf}" if conds else value
    lines.append(statement("Bias", at, bias, scores))
    lines.append(statement("Logit", at, f"Capped({cell}) + Bias({cell})", scores))
    lines += [f"Max({row}) max=! Logit({cell})",
              f"Open({row}) max=! Bias({cell})",
              f"Exp({cell}) = exp(Logit({cell}) - "
              f"(Max({row}) == {neg_inf} ? {literal(0, acc)} : Max({row})))",
              f"Sum({row}) +=! Exp({cell})",
              f"Prob({cell}) = Open({row}) == {neg_inf} ? {literal(0, dt)} : "
              f"{dt}(Exp({cell}) / (Sum({row}) == {literal(0, acc)} ? {literal(1, acc)} : Sum({row})))"]
    heads_out = (batch, hq, length, v.channels)
    lines.append(statement("Out", at, f"{acc}(Prob({row}, j)) * "
                           f"{acc}({reads[2](B, kv_head, 'j', J)})", heads_out,
                           [f"j in 0:{keys}"], op="+=!"))
    if rank == 4:
        lines.append(statement("Y", at, f"{dt}(Out({cell}))", heads_out))
        y_shape: tuple[int, ...] = heads_out
    else:
        y_shape = (batch, length, hq * v.channels)
        lines.append(statement("Y", INDEX[:3], f"{dt}(Out({B}, i2 / {v.channels}, i1, "
                               f"i2 % {v.channels}))", y_shape))
    outs[0] = tensor_param("Y", (dt, y_shape))
    if 3 in wanted:
        mode = int(ctx.attr("qk_matmul_output_mode", 0))
        source = {0: "Capped", 1: "Capped", 2: "Logit", 3: "Prob"}.get(mode)
        if source is None:
            raise ctx.malformed(f"qk_matmul_output_mode is {mode}; it must be 0, 1, 2 or 3")
        lines.append(statement("QK", at, f"{dt}({source}({cell}))", scores))
        outs[3] = tensor_param("QK", (dt, scores))
    declared = [outs[o] for o in sorted(outs)]
    temps += [tensor_param(n, (acc, scores)) for n in ("Score", "Capped", "Bias", "Logit", "Exp")]
    temps += [tensor_param(n, (acc, scores[:3])) for n in ("Max", "Open", "Sum")]
    temps += [tensor_param("Prob", (dt, scores)), tensor_param("Out", (acc, heads_out))]
    return TCKernel(definition(params, declared + temps, lines), tuple(inputs), tuple(sorted(outs)))


@register("RotaryEmbedding")
def _rotary_embedding(ctx: OpContext) -> TCKernel:
    """Each head's first ``rotary_embedding_dim`` channels rotated in pairs (the two
    halves, or neighbours when interleaved) by the cos and sin of its position; the
    rest copied. 4-D inputs are (batch, heads, sequence, channels), 3-D ones (batch,
    sequence, heads · channels), read in place."""
    rank, shape, dt = ctx.rank(0, 3, 4), ctx.shape(0), ctx.dtype(0)
    if rank == 3:
        heads = ctx.ints(ctx.attr("num_heads", 0), "num_heads", 1)[0]
        if heads <= 0 or shape[2] % heads:
            raise ctx.malformed(f"3-D inputs need num_heads dividing the hidden size {shape[2]} "
                                f"(num_heads is {heads})")
        width, pos = shape[2] // heads, "i1"
        channel, read = f"i2 % {width}", lambda c: f"X(i0, i1, i2 / {width} * {width} + {c})"
    else:
        width, pos = shape[3], "i2"
        channel, read = "i3", lambda c: f"X(i0, i1, i2, {c})"
    rot = ctx.ints(ctx.attr("rotary_embedding_dim", 0), "rotary_embedding_dim", 1, least=0)[0]
    rot = rot or width
    if rot > width or rot % 2:
        raise ctx.malformed(f"rotary_embedding_dim {rot} must be even and at most the head size "
                            f"{width}")
    half, batch, length = rot // 2, shape[0], shape[1 if rank == 3 else 2]
    params = [tensor_param("X", ctx.type(0)), tensor_param("Cos", ctx.type(1)),
              tensor_param("Sin", ctx.type(2))]
    if ctx.has(3):
        caches, at = (ctx.shape(1)[0] if ctx.shape(1) else 0, half), f"P(i0, {pos}), "
        what = "(positions, rotary_embedding_dim / 2)"
        if ctx.shape(3) != (batch, length):
            raise ctx.malformed(f"position_ids have shape {ctx.shape(3)}; they must have shape "
                                f"{(batch, length)} (batch, sequence)")
        params.append(tensor_param("P", ctx.type(3)))
    else:
        caches, at = (batch, length, half), f"i0, {pos}, "
        what = "(batch, sequence, rotary_embedding_dim / 2)"
    for i in (1, 2):
        if ctx.shape(i) != caches:
            raise ctx.malformed(f"input {i} has shape {ctx.shape(i)}; it must have shape "
                                f"{caches} {what}")
    acc = dt.compute
    if int(ctx.attr("interleaved", 0)):
        pair, first = f"{channel} / 2 % {half}", f"{channel} % 2 == 0"
        x1, x2 = read(f"2 * ({pair})"), read(f"2 * ({pair}) + 1")
    else:
        pair, first = f"{channel} % {half}", f"{channel} < {half}"
        x1, x2 = read(pair), read(f"{pair} + {half}")
    lets = [f"x1 = {acc}({x1})", f"x2 = {acc}({x2})", f"c = {acc}(Cos({at}{pair}))",
            f"s = {acc}(Sin({at}{pair}))"]
    rotated = f"{dt}({first} ? c * x1 - s * x2 : s * x1 + c * x2)"
    if rot < width:
        rotated = f"{channel} < {rot} ? {rotated} : {read(channel)}"
    full = INDEX[:rank]
    lines = [statement("Y", full, rotated, shape, lets)]
    return TCKernel(definition(params, [tensor_param("Y", (dt, shape))], lines),
                    tuple(range(4 if ctx.has(3) else 3)))
