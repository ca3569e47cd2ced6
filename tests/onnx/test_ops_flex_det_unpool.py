"""MaxUnpool, Det and FlexAttention against onnxruntime where it runs the op and the
ONNX reference implementation otherwise, at shapes the node suite does not cover;
bad input gives polyfuse errors."""

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import polyfuse as pf
from polyfuse.errors import BoundsError, ModelError
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
