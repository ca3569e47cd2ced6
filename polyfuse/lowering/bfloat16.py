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

import numpy as np

from polyfuse.ir.graph import Graph, Node
from polyfuse.ir.types import DType

BFLOAT16_OPS = {"MatMul": "BFloat16MatMul", "Gemm": "BFloat16Gemm", "Conv": "BFloat16Conv"}


def use_bfloat16_products(g: Graph) -> Graph:
    """Run ``g``'s products of float32 values by constant float32 weights on bfloat16
    (module docstring)."""
    nodes = tuple(replace(n, op=BFLOAT16_OPS[n.op]) if _weighted(g, n) else n for n in g.nodes)
    return replace(g, nodes=nodes)


def _weighted(g: Graph, n: Node) -> bool:
    """Whether ``n`` multiplies a float32 value by float32 constant weights, as the
    bfloat16 lowerings can: a matrix (MatMul, Gemm), or a convolution's filters when it
    has one group (a depthwise one sums too few products per output to gain)."""
    if n.op not in BFLOAT16_OPS or len(n.inputs) < 2:
        return False
    x, w = g.type_of(n.inputs[0]), g.constant(n.inputs[1])
    if x is None or x.dtype is not DType.FLOAT32 or w is None or w.array.dtype != np.float32:
        return False
    if n.op == "Conv":
        return n.attr("group", 1) == 1 and w.array.ndim >= 3
    return w.array.ndim == 2
