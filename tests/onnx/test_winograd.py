"""3x3 convolutions by Winograd's minimal filtering (lowering/winograd.py and its
kernels in lowering/ops/winograd.py): the transforms against a direct correlation in
numpy, which convolutions take which tile, and whole convolutions against onnxruntime
on maps that divide into no whole number of tiles, with and without padding and bias,
with their epilogues fused."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from polyfuse.ir.graph import Node, TensorType
from polyfuse.ir.types import DType
from polyfuse.lowering import winograd
from tests.onnx.ort_compare import assert_matches_onnxruntime

RNG = np.random.default_rng(11)


@pytest.mark.unit
@pytest.mark.parametrize("tile", sorted(winograd.TRANSFORMS))
def test_a_tile_of_the_transforms_is_the_correlation(tile):
    bt, g_t, at = winograd.TRANSFORMS[tile]
    d = RNG.standard_normal((tile + 2, tile + 2))
    g = RNG.standard_normal((3, 3))
    got = at @ ((g_t @ g @ g_t.T) * (bt @ d @ bt.T)) @ at.T
    want = np.array([[np.sum(d[r:r + 3, c:c + 3] * g) for c in range(tile)] for r in range(tile)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # the filters of (m, c) = (1, 2) of a bank, transformed once and rounded to float32
    bank = RNG.standard_normal((3, 4, 3, 3)).astype(np.float32)
    u = winograd.transformed_filters(bank, tile)
    assert u.shape == (tile + 2, tile + 2, 4, 3) and u.dtype == np.float32
    np.testing.assert_allclose(u[:, :, 2, 1], g_t @ bank[1, 2].astype(np.float64) @ g_t.T,
                               rtol=1e-6, atol=1e-6)


def _conv(name="conv", **attrs):
    return Node("Conv", name, ("x", "w"), ("y",), tuple(attrs.items()))


@pytest.mark.unit
@pytest.mark.parametrize("shape, attrs, tile", [
    ((1, 64, 56, 56), {"pads": (1, 1, 1, 1)}, 4),      # 196 tiles of 4 x 4
    ((1, 256, 14, 14), {"pads": (1, 1, 1, 1)}, 2),     # 16 tiles of 4, 49 of 2
    (("N", 256, 14, 14), {"pads": (1, 1, 1, 1)}, 2),   # a symbolic batch counts as 1
    ((4, 256, 7, 7), {"pads": (1, 1, 1, 1)}, 2),       # 4 x 16 tiles of 2
    ((1, 512, 7, 7), {"pads": (1, 1, 1, 1)}, 0),       # 16 tiles of 2: too few
    ((1, 64, 56, 56), {"pads": (1, 1, 1, 1), "strides": (2, 2)}, 0),
    ((1, 64, 56, 56), {"pads": (1, 1, 1, 1), "dilations": (2, 2)}, 0),
    ((1, 64, 56, 56), {"pads": (2, 2, 2, 2)}, 0),
    ((1, 64, 56, 56), {"auto_pad": "SAME_UPPER"}, 0),
    ((1, 16, 56, 56), {"pads": (1, 1, 1, 1)}, 0),      # too few channels to gain
])
def test_which_convolutions_take_which_tile(shape, attrs, tile):
    w = np.zeros((shape[1], shape[1], 3, 3), np.float32)
    assert winograd.winograd_tile(_conv(**attrs), w, TensorType(DType.FLOAT32, shape), None) == tile


@pytest.mark.unit
def test_grouped_5x5_float64_or_malformed_convolutions_keep_the_direct_one():
    x = TensorType(DType.FLOAT32, (1, 64, 56, 56))
    w = np.zeros((64, 64, 3, 3), np.float32)
    biased = Node("Conv", "conv", ("x", "w", "b"), ("y",), (("pads", (1, 1, 1, 1)),))
    assert winograd.winograd_tile(biased, w, x, TensorType(DType.FLOAT32, (64,))) == 4
    assert winograd.winograd_tile(_conv(group=2), np.zeros((64, 32, 3, 3), np.float32), x, None) == 0
    assert winograd.winograd_tile(_conv(), np.zeros((64, 64, 5, 5), np.float32), x, None) == 0
    assert winograd.winograd_tile(_conv(), w.astype(np.float64), x, None) == 0
    assert winograd.winograd_tile(_conv(), w, None, None) == 0                       # unknown input
    assert winograd.winograd_tile(_conv(kernel_shape=(5, 5)), w, x, None) == 0       # disagrees
    for malformed in ({"strides": "one"}, {"pads": (1, 1)}, {"pads": 1}, {"dilations": (None, 1)}):
        assert winograd.winograd_tile(_conv(**malformed), w, x, None) == 0
    for bias in (None, TensorType(DType.FLOAT32, (63,)), TensorType(DType.FLOAT64, (64,))):
        assert winograd.winograd_tile(biased, w, x, bias) == 0


@pytest.mark.unit
def test_a_malformed_bias_is_reported_as_for_any_convolution():
    model = _model((1, 32, 28, 28), 32, (1, 1, 1, 1), True, False)
    model.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.zeros(31, np.float32), "b"))
    with pytest.raises(pf.ModelError, match="bias has shape"):
        pf.compile(model, target="host").run({"x": np.zeros((1, 32, 28, 28), np.float32)})


def _model(x_shape, m_out, pads, bias, residual):
    n = helper.make_node
    c = x_shape[1]
    inits = {"w": (RNG.standard_normal((m_out, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)}
    conv_in = ["x", "w"]
    if bias:
        inits["b"] = RNG.standard_normal(m_out).astype(np.float32)
        conv_in.append("b")
    nodes = [n("Conv", conv_in, ["c"], name="conv", pads=list(pads)),
             n("Relu", ["c"], ["r"], name="relu")]
    out = "r"
    if residual:   # the input added back (same channels and map): the epilogue of a block
        nodes.append(n("Add", ["r", "x"], ["y"], name="add"))
        out = "y"
    oh, ow = x_shape[2] + pads[0] + pads[2] - 2, x_shape[3] + pads[1] + pads[3] - 2
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [x_shape[0], m_out, oh, ow])],
        [numpy_helper.from_array(a, k) for k, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10  # what the installed onnxruntime reads
    return model


def winograd_model():
    """A convolution in tiles of 2 (5 x 7 of them) with a bias and a Relu (also run on the
    emulated CUDA device, tests/cuda/test_emulated.py)."""
    return _model((1, 32, 11, 14), 64, (1, 0, 0, 1), True, False)


@pytest.mark.parametrize("x_shape, m_out, pads, bias, residual, tile", [
    ((1, 32, 27, 23), 48, (1, 1, 1, 1), True, False, 4),     # 7 x 6 tiles, the last partial
    ((2, 48, 13, 13), 48, (1, 1, 1, 1), True, True, 4),      # batch 2, a residual epilogue
    ((1, 40, 17, 11), 32, (0, 0, 0, 0), False, False, 2),    # no padding: 15 x 9 outputs
    ((1, 32, 11, 14), 64, (1, 0, 0, 1), True, False, 2),     # padding on two sides only
], ids=["f4-partial-tiles", "f4-batch-residual", "f2-unpadded", "f2-one-sided-pads"])
@pytest.mark.parametrize("target", ["host", "reference"])
def test_winograd_convolutions_match_onnxruntime(x_shape, m_out, pads, bias, residual, tile, target):
    model = _model(x_shape, m_out, pads, bias, residual)
    compiled = pf.compile(model, target=target)
    graph = compiled.dump("partition_fusion_groups")
    assert "WinogradInput(" in graph and "WinogradOutput(" in graph, graph
    assert f"tile={tile}" in graph, graph
    x = RNG.standard_normal(x_shape).astype(np.float32)
    assert_matches_onnxruntime(model, {"x": x}, rtol=1e-4, atol=1e-4, compiled=compiled)
    if target == "host":
        # the bias, the activation and the residual add run in the output transform's kernel
        labels = [st.label for st, _ in compiled.plan_for().steps()]
        assert any("conv" in label and "relu" in label for label in labels), labels
        assert not any(label == "relu" or label == "add" for label in labels), labels


def test_a_symbolic_batch_runs_at_each_size_the_calls_bring():
    model = _model((1, 48, 27, 23), 48, (1, 1, 1, 1), True, True)
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    compiled = pf.compile(model, target="host")
    assert "tile=4" in compiled.dump("partition_fusion_groups")
    for batch in (1, 3):
        x = RNG.standard_normal((batch, 48, 27, 23)).astype(np.float32)
        assert_matches_onnxruntime(model, {"x": x}, rtol=1e-4, atol=1e-4, compiled=compiled)
