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


def test_max_unpool_into_a_larger_output_shape():
    # the indices count in the unpooled shape, which lands at the start of output_shape
    # (the ONNX reference and node suite; onnxruntime counts them in output_shape)
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
    p, i = pooled(randn(2, 3, 6, 4), **attrs)
    feeds = {"x": p, "i": i}
    m = node_model("MaxUnpool", feeds, {"s": np.array([2, 3, 7, 6], np.int64)}, **attrs)
    want = ReferenceEvaluator(m).run(None, feeds)[0]
    np.testing.assert_array_equal(pf.compile(m).run(feeds)["y"], want)


def test_max_unpool_index_outside_its_window_fails_at_run_time():
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
    p, i = pooled(randn(1, 2, 4, 4), **attrs)
    i[0, 1, 0, 0] = i[0, 1, 1, 1]      # a position no window of (0, 0) covers
    with pytest.raises(BoundsError, match="out of bounds"):
        pf.compile(node_model("MaxUnpool", {"x": p, "i": i}, **attrs)).run({"x": p, "i": i})


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


def test_det_double_needs_pivoting():
    # permuted (signed) identities: every leading element is zero until rows swap
    x = np.stack([np.eye(6)[RNG.permutation(6)] * RNG.choice([-2.0, 0.5], 6)
                  for _ in range(4)])
    x[:, 0, :] += 1e-3 * randn(6, dtype=np.float64)
    want = ReferenceEvaluator(det_model(x)).run(None, {"x": x})[0]
    np.testing.assert_allclose(pf.compile(det_model(x)).run({"x": x})["y"], want, rtol=1e-12)


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


def test_det_half_is_computed_in_float():
    x = randn(3, 6, 6, dtype=np.float16)
    got = pf.compile(det_model(x)).run({"x": x})["y"]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, np.linalg.det(x.astype(np.float64)), rtol=5e-3, atol=1e-3)


def test_det_refuses_large_matrices():
    x = randn(65, 65)
    with pytest.raises(UnsupportedOpError, match="'n'.*up to 64"):
        pf.compile(det_model(x)).run({"x": x})
