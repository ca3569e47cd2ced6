"""MaxUnpool, Det and FlexAttention against onnxruntime where it runs the op and the
ONNX reference implementation otherwise, at shapes the node suite does not cover;
bad input gives polyfuse errors."""

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import polyfuse as pf
from polyfuse.errors import BoundsError, ModelError, UnsupportedOpError
from tests.onnx.ort_compare import (assert_matches_onnxruntime, one_node_model,
                                    onnxruntime_outputs)

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT
TARGETS = ["host", "reference"]


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def node_model(op, feeds, constants=None, opset=22, out=F, **attrs):
    inputs = list(feeds) + list(constants or {})
    node = helper.make_node(op, inputs, ["y"], name="n", **attrs)
    return one_node_model(node, feeds, {"y": out}, constants, opset)


def pooled(x, **attrs):
    """onnxruntime's MaxPool of ``x``: the maxima and their flat indices."""
    m = one_node_model(helper.make_node("MaxPool", ["x"], ["p", "i"], **attrs), {"x": x},
                       {"p": F, "i": TensorProto.INT64}, opset=22)
    return onnxruntime_outputs(m, {"x": x})


# sizes the pools cover exactly, so the unpooled shape is the pooled input's
UNPOOLS = [((2, 3, 9, 8), dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 0])),
           ((1, 2, 7, 5), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
           ((2, 2, 11), dict(kernel_shape=[3], strides=[2]))]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape, attrs", UNPOOLS)
def test_max_unpool_inverts_max_pool(target, shape, attrs):
    # overlapping windows name some elements twice: the same value lands there
    p, i = pooled(randn(*shape), **attrs)
    feeds = {"x": p, "i": i}
    assert_matches_onnxruntime(node_model("MaxUnpool", feeds, **attrs), feeds, target=target)


@pytest.mark.unit
def test_max_unpool_into_a_larger_output_shape():
    # the indices count in the unpooled shape, which lands at the start of output_shape
    # (the ONNX reference and node suite; onnxruntime counts them in output_shape)
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
    p, i = pooled(randn(2, 3, 6, 4), **attrs)
    feeds = {"x": p, "i": i}
    m = node_model("MaxUnpool", feeds, {"s": np.array([2, 3, 7, 6], np.int64)}, **attrs)
    want = ReferenceEvaluator(m).run(None, feeds)[0]
    np.testing.assert_array_equal(pf.compile(m).run(feeds)["y"], want)


@pytest.mark.unit
def test_max_unpool_index_outside_its_window_fails_at_run_time():
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
    p, i = pooled(randn(1, 2, 4, 4), **attrs)
    i[0, 1, 0, 0] = i[0, 1, 1, 1]      # a position no window of (0, 0) covers
    with pytest.raises(BoundsError, match="out of bounds"):
        pf.compile(node_model("MaxUnpool", {"x": p, "i": i}, **attrs)).run({"x": p, "i": i})


@pytest.mark.unit
def test_max_unpool_output_shape_smaller_than_unpooled_is_malformed():
    feeds = {"x": randn(1, 1, 2, 2), "i": np.zeros((1, 1, 2, 2), np.int64)}
    m = node_model("MaxUnpool", feeds, {"s": np.array([1, 1, 3, 3], np.int64)},
                   kernel_shape=[2, 2], strides=[2, 2])
    with pytest.raises(ModelError, match="output_shape"):
        pf.compile(m).run(feeds)


def det_model(x):
    return node_model("Det", {"x": x}, out=helper.np_dtype_to_tensor_dtype(x.dtype))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", [(3, 5, 5), (2, 1, 7, 7), (2, 2)])
def test_det_random_batches(target, shape):
    x = randn(*shape)
    assert_matches_onnxruntime(det_model(x), {"x": x}, rtol=1e-4, atol=1e-5, target=target)


@pytest.mark.unit
def test_det_double_needs_pivoting():
    # permuted (signed) identities: every leading element is zero until rows swap
    x = np.stack([np.eye(6)[RNG.permutation(6)] * RNG.choice([-2.0, 0.5], 6)
                  for _ in range(4)])
    x[:, 0, :] += 1e-3 * randn(6, dtype=np.float64)
    want = ReferenceEvaluator(det_model(x)).run(None, {"x": x})[0]
    np.testing.assert_allclose(pf.compile(det_model(x)).run({"x": x})["y"], want, rtol=1e-12)


@pytest.mark.unit
def test_det_singular_and_near_singular():
    x = randn(5, 4, 4)
    x[0, 3] = x[0, 1]                   # repeated row
    x[1, :, 2] = 0                      # zero column: a zero pivot
    x[2, 3] = 2 * x[2, 0] - x[2, 1]     # a combination of rows
    x[3, 2] = x[3, 0] + 1e-4 * randn(4)  # nearly repeated
    got = pf.compile(det_model(x)).run({"x": x})["y"]
    want = np.linalg.det(x.astype(np.float64))
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert got[1] == 0


@pytest.mark.unit
def test_det_half_is_computed_in_float():
    x = randn(3, 6, 6, dtype=np.float16)
    got = pf.compile(det_model(x)).run({"x": x})["y"]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, np.linalg.det(x.astype(np.float64)), rtol=5e-3, atol=1e-3)


@pytest.mark.unit
def test_det_refuses_large_matrices():
    x = randn(65, 65)
    with pytest.raises(UnsupportedOpError, match="'n'.*up to 64"):
        pf.compile(det_model(x)).run({"x": x})


def modifier(name, nodes, dtype=F, initializers=()):
    """A modifier subgraph from ``x`` to ``y`` (shape B, H, L, S)."""
    shape = ["B", "H", "L", "S"]
    return helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", dtype, shape)],
                             [helper.make_tensor_value_info("y", dtype, shape)],
                             list(initializers))


def scalar(name, value, dtype=F):
    return helper.make_tensor(name, dtype, [], [value])


def causal(length, keys):
    """score_mod: -inf above the diagonal, through a constant mask and Where."""
    mask = np.tril(np.ones((length, keys), bool))
    return modifier("causal", [helper.make_node("Where", ["m", "x", "ninf"], ["y"])],
                    initializers=[helper.make_tensor("m", TensorProto.BOOL, mask.shape,
                                                     mask.ravel()),
                                  scalar("ninf", float("-inf"))])


def soft_cap(dtype=F):
    """score_mod: c * tanh(x / c)."""
    return modifier("soft_cap", [helper.make_node("Div", ["x", "c"], ["t"]),
                                 helper.make_node("Tanh", ["t"], ["u"]),
                                 helper.make_node("Mul", ["u", "c"], ["y"])],
                    dtype, [scalar("c", 2.0, dtype)])


SOFT_CAP = soft_cap()
SQUARED = modifier("squared", [helper.make_node("Mul", ["x", "x"], ["y"])])


def flex_model(feeds, out=F, **attrs):
    node = helper.make_node("FlexAttention", list(feeds), ["y"], name="n",
                            domain="ai.onnx.preview", **attrs)
    (b, hq, length, _), ev = feeds["q"].shape, feeds["v"].shape[3]
    graph = helper.make_graph(
        [node], "flex",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in feeds.items()],
        [helper.make_tensor_value_info("y", out, (b, hq, length, ev))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23),
                                                   helper.make_opsetid("ai.onnx.preview", 1)])


def assert_flex_matches_reference(feeds, rtol=1e-5, atol=1e-6, **attrs):
    m = flex_model(feeds, out=helper.np_dtype_to_tensor_dtype(feeds["q"].dtype), **attrs)
    want = ReferenceEvaluator(m).run(None, feeds)[0]
    got = pf.compile(m).run(feeds)["y"]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol)


def qkv(b, hq, hk, length, keys, e, ev, dtype=np.float32):
    return {"q": randn(b, hq, length, e, dtype=dtype), "k": randn(b, hk, keys, e, dtype=dtype),
            "v": randn(b, hk, keys, ev, dtype=dtype)}


@pytest.mark.unit
@pytest.mark.parametrize("attrs", [
    {},
    {"score_mod": causal(5, 7), "scale": 0.3},
    {"score_mod": SOFT_CAP},
    {"prob_mod": SQUARED},
    {"score_mod": SOFT_CAP, "prob_mod": SQUARED},
], ids=["plain", "causal", "soft_cap", "prob_squared", "both"])
def test_flex_attention_modifiers_grouped_heads(attrs):
    # 6 query heads over 2 key heads, odd lengths and a value size unlike the key size
    assert_flex_matches_reference(qkv(2, 6, 2, 5, 7, 3, 5), **attrs)


@pytest.mark.unit
def test_flex_attention_double_and_half():
    assert_flex_matches_reference(qkv(1, 2, 2, 4, 6, 8, 8, np.float64), rtol=1e-12,
                                  score_mod=soft_cap(TensorProto.DOUBLE))
    assert_flex_matches_reference(qkv(1, 4, 1, 3, 9, 4, 2, np.float16), rtol=2e-3, atol=2e-3,
                                  prob_mod=SQUARED)


@pytest.mark.unit
def test_flex_attention_elementwise_modifiers_fuse_into_one_kernel():
    feeds = qkv(1, 4, 2, 3, 5, 4, 6)
    m = flex_model(feeds, score_mod=SOFT_CAP, prob_mod=SQUARED)
    compiled = pf.compile(m)
    np.testing.assert_allclose(compiled.run(feeds)["y"], ReferenceEvaluator(m).run(None, feeds)[0],
                               rtol=1e-5, atol=1e-6)
    kernels = compiled.dump("kernels")
    assert kernels.count("def ") == 1 and "n/score_mod/Tanh" in kernels


@pytest.mark.unit
def test_flex_attention_modifier_reading_the_enclosing_graph_is_refused():
    feeds = qkv(1, 2, 2, 3, 3, 4, 4)
    outer = modifier("outer", [helper.make_node("Add", ["x", "q"], ["y"])])
    with pytest.raises(UnsupportedOpError, match="'n'.*score_mod.*enclosing"):
        pf.compile(flex_model(feeds, score_mod=outer)).run(feeds)
