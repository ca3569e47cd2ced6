"""FlexAttention (ai.onnx.preview): softmax(score_mod(Q Kᵀ · scale)) with prob_mod
applied to the probabilities, times V, expanded into graph nodes the planner fuses.

The modifier subgraphs (``score_mod``, ``prob_mod``: one rank-4 tensor in, one of the
same shape and type out) are inlined between the nodes, all in one fusion group: where
every node lowers to a kernel (elementwise modifiers do) the planner composes them into
one attention kernel, else it plans them one by one; a modifier op polyfuse cannot lower
is refused as its inlined node (named ``<node>/score_mod/...``). Grouped-query heads
read key head ``h / (query heads / key heads)`` through a Gather. As in the ONNX
reference, Q and K are each scaled by ``sqrt(scale)`` (rounded to the input type), the
scores and the softmax are in the softmax precision (float32 for narrower inputs), and
the output is rounded to the input type.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from polyfuse.ir.control import ControlParts
from polyfuse.ir.graph import Graph, Node
from polyfuse.ir.types import DType
from polyfuse.lowering.inline_control import Inlined, inline_body
from polyfuse.lowering.ops import Expanded, OpContext, register

_PRECISIONS = {1: DType.FLOAT32, 10: DType.FLOAT16, 11: DType.FLOAT64, 16: DType.BFLOAT16}


def _precision(ctx: OpContext, dt: DType) -> DType:
    code = ctx.attr("softmax_precision")
    if code is None:
        return DType.FLOAT64 if dt is DType.FLOAT64 else DType.FLOAT32
    if int(code) not in _PRECISIONS:
        raise ctx.malformed(f"softmax_precision {code} must be float, float16, bfloat16 or "
                            "double (1, 10, 16 or 11)")
    return _PRECISIONS[int(code)]


def _check_shapes(ctx: OpContext) -> tuple[int, int]:
    """(query heads, key heads), after checking Q, K and V fit."""
    for i in range(3):
        ctx.rank(i, 4, 4)
    (b, hq, _, e), (bk, hk, s, ek), (bv, hv, sv, _) = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if b != bk or b != bv or hk != hv or s != sv or e != ek or hk < 1 or hq % hk:
        raise ctx.malformed(f"Q {ctx.shape(0)}, K {ctx.shape(1)} and V {ctx.shape(2)} do not "
                            "fit: they need one batch, K and V one number of heads (dividing "
                            "Q's) and of positions, and Q and K one head size")
    return hq, hk


def _modifier(ctx: OpContext, key: str, value: str, out: Inlined) -> str:
    """``value`` through the subgraph attribute ``key`` (inlined into ``out``), if any."""
    body = ctx.attr(key)
    if body is None:
        return value
    name = ctx.node.name
    if not isinstance(body, Graph) or len(body.inputs) != 1 or len(body.outputs) != 1:
        raise ctx.malformed(f"its {key} must be a graph of one input and one output")
    if body.captures:
        raise ctx.unsupported(f"its {key} reads values of the enclosing graph "
                              f"({', '.join(body.captures)}); polyfuse inlines modifiers that "
                              "read only their input and their own constants")
    parts = ControlParts((), (), 0, 0, 0)
    return inline_body(ctx.node, body, parts, {body.inputs[0].name: value},
                   f"{name}/{key}/", out)[0]


@register("FlexAttention", expands=True)
def _flex_attention(ctx: OpContext) -> Expanded:
    hq, hk = _check_shapes(ctx)
    dt = ctx.dtype(0)
    acc = _precision(ctx, dt)
    name = ctx.node.name
    out = Inlined([], {})

    def add(op: str, label: str, *inputs: str, **attrs: object) -> str:
        value = f"{name}:{label}"
        out.nodes.append(Node(op, f"{name}/{label}", inputs, (value,), tuple(attrs.items())))
        return value

    scale = ctx.attr("scale")
    scale = 1 / np.sqrt(ctx.shape(0)[3]) if scale is None else float(scale)
    root = f"{name}:sqrt_scale"
    out.constants[root] = np.asarray(np.sqrt(np.float32(scale))).astype(dt.numpy)
    q, k, v = ctx.node.inputs[:3]
    if hq != hk:
        heads = f"{name}:kv_heads"
        out.constants[heads] = np.arange(hq, dtype=np.int64) // (hq // hk)
        k = add("Gather", "k_heads", k, heads, axis=1)
        v = add("Gather", "v_heads", v, heads, axis=1)
    def cast(label: str, value: str, to: DType, have: DType) -> str:
        return value if to is have else add("Cast", label, value, to=to.value)

    k, q = add("Mul", "k_scaled", k, root), add("Mul", "q_scaled", q, root)
    scores = add("Einsum", "qk", q, k, equation="bhld,bhsd->bhls")
    scores = _modifier(ctx, "score_mod", cast("scores", scores, acc, dt), out)
    probs = _modifier(ctx, "prob_mod", add("Softmax", "probs", scores, axis=-1), out)
    mixed = add("MatMul", "pv", probs, cast("v_cast", v, acc, dt))
    if acc is not dt:
        mixed = add("Cast", "y", mixed, to=dt.value)
    last = out.nodes[-1]
    out.nodes[-1] = replace(last, outputs=ctx.node.outputs[:1])
    # one fusion group: the planner composes the nodes into one kernel where each lowers
    # to a kernel (elementwise modifiers included), else plans them one by one
    group = f"{name}/attention"
    return Expanded(tuple(replace(n, group=group) for n in out.nodes), out.constants)
