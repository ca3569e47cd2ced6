"""The graph pass ``use_bfloat16_products``: products with constant weights on bfloat16.

``compile(..., precision="bf16")`` runs it. Each MatMul, Gemm and (ungrouped) Conv of a
float32 input by float32 constant weights becomes polyfuse's BFloat16MatMul,
BFloat16Gemm or BFloat16Conv, whose lowerings (``ops/bfloat16.py``) round the input to
bfloat16 and sum its products with the weights, rounded to bfloat16 once at compile
time, in float32: 2 reduction elements per ``bfdot2`` step (AVX512-BF16's
``vdpbf16ps``). Inputs, attributes and outputs stay as they were, and everything else
(bias, activations, normalizations, attention's products of two activations) stays in
float32, so the result is the float32 model's up to the rounding of the products'
operands to 8 significant bits (about 3 decimal digits).
"""

from __future__ import annotations

from dataclasses import replace

from polyfuse.ir.graph import Graph, Node, TensorType
from polyfuse.ir.types import DType

BFLOAT16_OPS = {"MatMul": "BFloat16MatMul", "Gemm": "BFloat16Gemm", "Conv": "BFloat16Conv"}
# ops that keep a constant's type and rank (torch's exports transpose a Linear's weights)
PERMUTING = frozenset({"Transpose", "Identity"})


def use_bfloat16_products(g: Graph) -> Graph:
    """Run ``g``'s products of float32 values by constant float32 weights on bfloat16
    (module docstring). Weights are constants, or constants moved by :data:`PERMUTING`
    ops, which the planner folds at compile time."""
    fixed = {c.name: c.type for c in g.constants}
    for n in g.nodes:
        if n.op in PERMUTING and n.inputs and n.inputs[0] in fixed and n.outputs:
            fixed[n.outputs[0]] = fixed[n.inputs[0]]
    nodes = tuple(replace(n, op=BFLOAT16_OPS[n.op]) if _weighted(g, n, fixed) else n
                  for n in g.nodes)
    return replace(g, nodes=nodes)


def _weighted(g: Graph, n: Node, fixed: dict[str, TensorType]) -> bool:
    """Whether ``n`` multiplies a float32 value by float32 weights known at compile time
    (``fixed``, by their types), as the bfloat16 lowerings can: a matrix (MatMul, Gemm),
    or a convolution's filters when it has one group (a depthwise one sums too few
    products per output to gain)."""
    if n.op not in BFLOAT16_OPS or len(n.inputs) < 2 or n.inputs[1] not in fixed:
        return False
    x, w = g.type_of(n.inputs[0]), fixed[n.inputs[1]]
    # (an input of unknown type has the weights' type: the ops' schemas say so)
    if w.dtype is not DType.FLOAT32 or x is not None and x.dtype is not DType.FLOAT32:
        return False
    if n.op == "Conv":
        return n.attr("group", 1) == 1 and w.rank >= 3
    return w.rank == 2
