"""Graph passes on graphs written as text: the graph each pass gives back, as text, and
its outputs against numpy (run on the reference evaluator, which compiles nothing)."""

import numpy as np
import pytest

from polyfuse.driver import compile_graph
from polyfuse.frontends.graph_text import parse_graph
from polyfuse.ir.graph import Constant
from polyfuse.lowering.graph_passes import (eliminate_common_subexpressions, eliminate_dead_nodes,
                                            fold_batch_norms, simplify_movement)

pytestmark = pytest.mark.unit

RNG = np.random.default_rng(0)


def run(graph, **feeds):
    return compile_graph(graph, "reference").run(feeds)


def text(body: str, inputs="%x: float32[2, 3]", outputs="%y: float32[2, 3]") -> str:
    return f"graph g({inputs}) -> ({outputs}) opset 17 {{\n{body}\n}}"


def test_dead_nodes_and_their_constants_go():
    g = parse_graph(text("""\
  %c = constant float32[3] [1.0, 2.0, 3.0]
  %y = Relu(%x)  # relu
  %z = Add(%x, %c)  # unused"""))
    assert str(eliminate_dead_nodes(g)) == text("  %y = Relu(%x)  # relu")


def test_common_subexpressions_merge_and_keep_what_the_graph_returns():
    g = parse_graph(text("""\
  %a = Relu(%x)  # a
  %b = Relu(%x)  # b
  %c = Sigmoid(%x)  # c
  %d = Sigmoid(%x)  # d
  %s = Add(%a, %b)  # s
  %y = Mul(%s, %c)  # y
  %w = Mul(%s, %d)  # w""", outputs="%y: float32[2, 3], %w: float32[2, 3]"))
    merged = eliminate_common_subexpressions(g)
    assert str(merged) == text("""\
  %a = Relu(%x)  # a
  %c = Sigmoid(%x)  # c
  %s = Add(%a, %a)  # s
  %y = Mul(%s, %c)  # y
  %w = Mul(%s, %c)  # w""", outputs="%y: float32[2, 3], %w: float32[2, 3]")
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    want = 2 * np.maximum(x, 0) / (1 + np.exp(-x))
    for name, got in run(merged, x=x).items():
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=name)


def test_a_batch_norm_after_a_convolution_folds_into_its_weights_and_bias():
    c, m = 3, 2
    w = RNG.standard_normal((m, c, 1, 1)).astype(np.float32)
    scale, bias = np.array([1.5, -0.5], np.float32), np.array([0.1, 0.2], np.float32)
    mean, var = np.array([0.3, -0.2], np.float32), np.array([2.0, 0.5], np.float32)
    g = parse_graph(text("""\
  %w = constant float32[2, 3, 1, 1] sha:w
  %scale = constant float32[2] [1.5, -0.5]
  %bias = constant float32[2] [0.1, 0.2]
  %mean = constant float32[2] [0.3, -0.2]
  %var = constant float32[2] [2.0, 0.5]
  %h = Conv(%x, %w)  # conv
  %y = BatchNormalization(%h, %scale, %bias, %mean, %var, epsilon=1e-05)  # bn""",
        inputs="%x: float32[1, 3, 4, 4]", outputs="%y: float32[1, 2, 4, 4]").replace(
        "sha:w", "sha:" + Constant("w", w).digest()), {"w": w})
    folded = fold_batch_norms(g)
    assert [n.op for n in folded.nodes] == ["Conv"], str(folded)
    x = RNG.standard_normal((1, c, 4, 4)).astype(np.float32)
    conv = np.einsum("nchw,mc->nmhw", x.astype(np.float64), w[:, :, 0, 0].astype(np.float64))
    s = scale / np.sqrt(var.astype(np.float64) + 1e-5)
    want = conv * s[None, :, None, None] + (bias - mean * s)[None, :, None, None]
    np.testing.assert_allclose(run(folded, x=x)["y"], want, rtol=1e-5, atol=1e-5)


def test_transposes_that_cancel_and_reshape_chains_simplify():
    g = parse_graph(text("""\
  %shape1 = constant int64[2] [3, 2]
  %shape2 = constant int64[2] [6, 1]
  %t1 = Transpose(%x, perm=[1, 0])  # t1
  %t2 = Transpose(%t1, perm=[1, 0])  # t2
  %r1 = Reshape(%t2, %shape1)  # r1
  %r2 = Reshape(%r1, %shape2)  # r2
  %y = Relu(%r2)  # relu""", outputs="%y: float32[6, 1]"))
    simple = simplify_movement(g)
    assert str(simple) == text("""\
  %shape2 = constant int64[2] [6, 1]
  %r2 = Reshape(%x, %shape2)  # r2
  %y = Relu(%r2)  # relu""", outputs="%y: float32[6, 1]")
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(run(simple, x=x)["y"], np.maximum(x.reshape(6, 1), 0))
