"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against onnxruntime."""

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.onnx.ort_compare import assert_matches_onnxruntime, one_node_model

RNG = np.random.default_rng(0)


def _feeds(shape, weighted, ignore):
    x = RNG.standard_normal(shape).astype(np.float32)
    t = RNG.integers(0, shape[1], (shape[0],) + shape[2:]).astype(np.int64)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore     # some targets ignored (one outside the classes)
    feeds = {"x": x, "t": t}
    if weighted:
        feeds["w"] = RNG.uniform(0.2, 2, shape[1]).astype(np.float32)
    return feeds


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("shape,reduction,weighted,ignore", [
    ((5, 7), "mean", False, None), ((3, 4, 5), "none", True, 11), ((2, 3, 3, 5), "mean", True, 1),
    ((6, 3, 7), "sum", False, -1)])
def test_loss_matches_onnxruntime(op, shape, reduction, weighted, ignore):
    feeds = _feeds(shape, weighted, ignore)
    attrs = {"reduction": reduction} | ({"ignore_index": ignore} if ignore is not None else {})
    outputs = {"loss": TensorProto.FLOAT}
    if op == "SoftmaxCrossEntropyLoss":
        outputs["log_prob"] = TensorProto.FLOAT
    node = helper.make_node(op, list(feeds), list(outputs), **attrs)
    assert_matches_onnxruntime(one_node_model(node, feeds, outputs), feeds, rtol=1e-5, atol=1e-5)
