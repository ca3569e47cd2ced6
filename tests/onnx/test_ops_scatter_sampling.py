"""Scatters, grid sampling and the ops beside them (Col2Im, CenterCropPad,
ReverseSequence) against onnxruntime, at shapes the ONNX node suite does not cover, on
native code and the reference interpreter; bad indices and shapes give polyfuse errors.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import polyfuse as pf
from tests.onnx.ort_compare import assert_matches_onnxruntime, one_node_model

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT
TARGETS = ["host", "reference"]


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def node_model(op, feeds, constants=None, opset=21, **attrs):
    inputs = list(feeds) + list(constants or {})
    node = helper.make_node(op, inputs, ["y"], name="n", **attrs)
    return one_node_model(node, feeds, {"y": F}, constants, opset)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_3d_middle_axis(target, reduction):
    # indices smaller than the data off the axis, negative ones, and (with a reduction)
    # repeats; without one each position is written once (ORT's rule for "none")
    if reduction == "none":
        indices = np.stack([RNG.permutation(7)[:4] for _ in range(6)]).reshape(2, 3, 4)
        indices = indices.transpose(0, 2, 1) - 7 * (RNG.random((2, 4, 3)) < 0.5)
    else:
        indices = RNG.integers(-7, 7, (2, 4, 3))
    indices = indices.astype(np.int64)
    feeds = {"x": randn(3, 7, 5), "i": indices, "u": randn(2, 4, 3)}
    m = node_model("ScatterElements", feeds, axis=1, reduction=reduction, opset=18)
    assert_matches_onnxruntime(m, feeds, target=target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_scatter_nd_tuples_into_slices(target, reduction):
    # 2-tuples index the first two dimensions of a 4-D tensor; the updates are slices
    positions = RNG.permutation(6 * 5)[:6]
    if reduction != "none":
        positions[3] = positions[0]
    indices = np.stack(np.unravel_index(positions, (6, 5)), -1).reshape(2, 3, 2)
    indices[0, 1] -= (6, 5)   # negative: counted from the end
    feeds = {"x": randn(6, 5, 2, 3), "i": indices.astype(np.int64), "u": randn(2, 3, 2, 3)}
    m = node_model("ScatterND", feeds, reduction=reduction, opset=18)
    assert_matches_onnxruntime(m, feeds, target=target)


def test_scatter_nd_integer_data_min():
    feeds = {"x": RNG.integers(-50, 50, (4, 3)).astype(np.int32),
             "i": np.array([[1], [3], [1]], np.int64),
             "u": RNG.integers(-50, 50, (3, 3)).astype(np.int32)}
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], name="n", reduction="min")
    m = one_node_model(node, feeds, {"y": TensorProto.INT32}, opset=18)
    assert_matches_onnxruntime(m, feeds)


@pytest.mark.parametrize("op,feeds", [
    ("ScatterElements", {"x": randn(2, 4), "i": np.array([[0, 4]], np.int64), "u": randn(1, 2)}),
    ("ScatterElements", {"x": randn(2, 4), "i": np.array([[-5, 0]], np.int64), "u": randn(1, 2)}),
    ("ScatterND", {"x": randn(3, 2), "i": np.array([[1], [3]], np.int64), "u": randn(2, 2)}),
])
@pytest.mark.parametrize("target", TARGETS)
def test_scatter_index_out_of_range_is_a_bounds_error(op, feeds, target):
    compiled = pf.compile(node_model(op, feeds, axis=1) if op == "ScatterElements"
                          else node_model(op, feeds), target=target)
    with pytest.raises(pf.BoundsError):
        compiled.run(feeds)
    good = {k: (np.zeros_like(v) if k == "i" else v) for k, v in feeds.items()}
    assert compiled.run(good)["y"].shape == feeds["x"].shape


@pytest.mark.unit
def test_scatter_shapes_that_disagree_name_the_node():
    # (found when the model compiles, or on the first run where its shapes are unknown)
    feeds = {"x": randn(4, 3), "i": np.zeros((2, 1), np.int64), "u": randn(2, 2)}
    with pytest.raises(pf.PolyfuseError, match=r"node 'n' \(ScatterND\).*updates of shape"):
        pf.compile(node_model("ScatterND", feeds)).run(feeds)
    feeds = {"x": randn(4, 3), "i": np.zeros((2, 5), np.int64), "u": randn(2, 5)}
    with pytest.raises(pf.PolyfuseError, match=r"node 'n' \(ScatterElements\)"):
        pf.compile(node_model("ScatterElements", feeds)).run(feeds)


def cache_model(mode, feeds):
    node = helper.make_node("TensorScatter", list(feeds), ["y"], name="n", mode=mode, axis=2)
    return one_node_model(node, feeds, {"y": F}, opset=24)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_against_a_loop(target, mode):
    cache, update = randn(3, 2, 6, 4), randn(3, 2, 3, 4)
    writes = np.array([0, 3, 5 if mode == "circular" else 2], np.int64)
    want = cache.copy()
    for b in range(3):
        for s in range(3):
            want[b, :, (writes[b] + s) % 6] = update[b, :, s]
    got = pf.compile(cache_model(mode, {"c": cache, "u": update, "w": writes}),
                     target=target).run({"c": cache, "u": update, "w": writes})["y"]
    np.testing.assert_array_equal(got, want)


@pytest.mark.unit
def test_tensor_scatter_linear_past_the_end_is_a_bounds_error():
    feeds = {"c": randn(2, 1, 6, 4), "u": randn(2, 1, 3, 4), "w": np.array([1, 4], np.int64)}
    compiled = pf.compile(cache_model("linear", feeds))
    with pytest.raises(pf.BoundsError):
        compiled.run(feeds)


def check_grid_sample(feeds, target="host", **attrs):
    m = node_model("GridSample", feeds, opset=22, **attrs)
    # onnxruntime pads cubic taps at the border its own way; the ONNX reference (which
    # the node suite follows, and polyfuse too) clamps the coordinate, then each tap
    want = ReferenceEvaluator(m).run(None, feeds) \
        if (attrs["mode"], attrs["padding_mode"]) == ("cubic", "border") else None
    assert_matches_onnxruntime(m, feeds, rtol=1e-4, atol=1e-5, want=want, target=target)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_2d_batched(mode, padding, align):
    # points well outside [-1, 1] exercise every padding rule
    feeds = {"x": randn(2, 3, 5, 7), "g": RNG.uniform(-1.6, 1.6, (2, 4, 6, 2)).astype(np.float32)}
    check_grid_sample(feeds, mode=mode, padding_mode=padding, align_corners=align)


@pytest.mark.unit
@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_grid_sample_2d_on_the_reference_interpreter(mode):
    feeds = {"x": randn(1, 2, 4, 3), "g": RNG.uniform(-1.8, 1.8, (1, 3, 5, 2)).astype(np.float32)}
    check_grid_sample(feeds, "reference", mode=mode, padding_mode="reflection", align_corners=1)


@pytest.mark.parametrize("mode,padding", [("linear", "zeros"), ("linear", "reflection"),
                                          ("nearest", "border"), ("nearest", "reflection")])
def test_grid_sample_3d(mode, padding):
    feeds = {"x": randn(1, 2, 3, 4, 5),
             "g": RNG.uniform(-1.3, 1.3, (1, 2, 3, 4, 3)).astype(np.float32)}
    check_grid_sample(feeds, mode=mode, padding_mode=padding, align_corners=0)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("size", [(2, 1, 3, 5), (2, 1, 2, 3, 4)])
def test_affine_grid(target, align, size):
    dims = len(size) - 2
    feeds = {"t": randn(2, dims, dims + 1)}
    m = node_model("AffineGrid", feeds, {"s": np.array(size, np.int64)}, opset=20,
                   align_corners=align)
    assert_matches_onnxruntime(m, feeds, target=target)


@pytest.mark.parametrize("target", TARGETS)
def test_col2im_3d_blocks_with_strides_pads_dilations(target):
    # image (5, 6), blocks (2, 3), strides (2, 1), pads (1, 0, 0, 2), dilations (1, 2)
    grid = [(5 + 1 - 1 - 1) // 2 + 1, (6 + 2 - 4 - 1) // 1 + 1]
    feeds = {"x": randn(2, 3 * 6, grid[0] * grid[1])}
    consts = {"image": np.array([5, 6], np.int64), "block": np.array([2, 3], np.int64)}
    m = node_model("Col2Im", feeds, consts, opset=18, strides=[2, 1], pads=[1, 0, 0, 2],
                   dilations=[1, 2])
    assert_matches_onnxruntime(m, feeds, target=target)


@pytest.mark.parametrize("target", TARGETS)
def test_center_crop_pad_mixed_axes(target):
    feeds = {"x": randn(3, 9, 4, 2)}
    m = node_model("CenterCropPad", feeds, {"s": np.array([6, 7, 1], np.int64)}, opset=18,
                   axes=[1, -2, 3])
    got = pf.compile(m, target=target).run(feeds)["y"]
    want = np.zeros((3, 6, 7, 1), np.float32)
    want[:, :, 1:5, :] = feeds["x"][:, 1:7, :, 0:1]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("batch_axis", [0, 1])
def test_reverse_sequence_3d(target, batch_axis):
    x = randn(5, 4, 3) if batch_axis == 1 else randn(4, 5, 3)
    feeds = {"x": x, "l": np.array([5, 0, 2, 1], np.int64)}
    m = node_model("ReverseSequence", feeds, batch_axis=batch_axis, time_axis=1 - batch_axis)
    assert_matches_onnxruntime(m, feeds, target=target)


@pytest.mark.unit
def test_reverse_sequence_too_long_is_a_bounds_error():
    feeds = {"x": randn(4, 2), "l": np.array([4, 5], np.int64)}
    compiled = pf.compile(node_model("ReverseSequence", feeds))
    with pytest.raises(pf.BoundsError):
        compiled.run(feeds)
