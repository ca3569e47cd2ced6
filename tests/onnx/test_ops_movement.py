"""Data-movement ops (shapes, slicing, gathers, padding, resizing, TopK) on native
code against onnxruntime.

Data tensors are graph inputs, so each node becomes a compiled kernel; the values a
lowering needs at compile time (shapes, pads, indices of a slice, scales) are
initializers, as exporters write them.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.onnx.ort_compare import assert_matches_onnxruntime

RNG = np.random.default_rng(0)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def model(nodes, feeds, outputs, constants=None, opset=19):
    """A graph of ``nodes`` reading ``feeds`` (inputs) and ``constants`` (initializers);
    ``outputs`` maps names to element types."""
    graph = helper.make_graph(
        nodes, "movement",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in feeds.items()],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs.items()],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in (constants or {}).items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10  # what the installed onnxruntime reads
    return onnx.shape_inference.infer_shapes(m)


def check(m, feeds):
    assert_matches_onnxruntime(m, feeds)


F = TensorProto.FLOAT


def test_exporter_shape_subgraph_feeds_a_reshape():
    # torch.onnx's x.view(x.size(0), -1): the target shape folds at compile time
    feeds = {"x": randn(2, 3, 4)}
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus_one"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["flat"]),
             helper.make_node("Transpose", ["flat"], ["y"])]
    constants = {"zero": np.array(0, np.int64), "axes": np.array([0], np.int64),
                 "minus_one": np.array([-1], np.int64)}
    check(model(nodes, feeds, {"y": F}, constants), feeds)


def test_transpose_then_concat():
    feeds = {"a": randn(2, 3, 4), "b": randn(4, 3, 5)}
    nodes = [helper.make_node("Transpose", ["a"], ["at"], perm=[2, 1, 0]),
             helper.make_node("Concat", ["at", "b"], ["y"], axis=-1)]
    check(model(nodes, feeds, {"y": F}), feeds)


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ([1, 10], [100, -1], [0, 2], [2, 3]),          # clamped end, negative end
    ([-1, 4], [-100, 0], [1, 2], [-1, -2]),        # negative steps run backwards
])
def test_slice_with_steps(starts, ends, axes, steps):
    feeds = {"x": randn(5, 4, 12)}
    constants = {k: np.array(v, np.int64) for k, v in
                 dict(starts=starts, ends=ends, axes=axes, steps=steps).items()}
    node = helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])
    check(model([node], feeds, {"y": F}, constants), feeds)


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap", "constant"])
def test_pad_modes(mode):
    feeds = {"x": randn(2, 3, 5)}
    constants = {"pads": np.array([0, 2, 3, 0, 1, -1], np.int64), "value": np.float32(1.5)}
    inputs = ["x", "pads"] + (["value"] if mode == "constant" else [])
    node = helper.make_node("Pad", inputs, ["y"], mode=mode)
    check(model([node], feeds, {"y": F}, constants), feeds)


def test_gather_negative_indices():
    feeds = {"x": randn(4, 6, 3), "i": np.array([[-1, 0], [5, -6]], np.int64)}
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=1)
    check(model([node], feeds, {"y": F}), feeds)


def test_split_then_topk():
    feeds = {"x": randn(3, 10)}
    nodes = [helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=1),
             helper.make_node("TopK", ["b", "k"], ["v", "i"], axis=1, largest=0)]
    constants = {"sizes": np.array([4, 6], np.int64), "k": np.array([3], np.int64)}
    check(model(nodes, feeds, {"a": F, "v": F, "i": TensorProto.INT64}, constants), feeds)


@pytest.mark.parametrize("mode, transform", [("nearest", "asymmetric"),
                                             ("linear", "half_pixel")])
def test_resize(mode, transform):
    feeds = {"x": randn(1, 2, 3, 4)}
    constants = {"scales": np.array([1, 1, 2, 1.5], np.float32)}
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode,
                            coordinate_transformation_mode=transform)
    check(model([node], feeds, {"y": F}, constants), feeds)
