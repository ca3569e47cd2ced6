"""Elementwise ops and activations on native code against onnxruntime.

Models are built with onnx.helper; every input is a graph input, so each node becomes
a compiled kernel rather than a value folded at compile time.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import polyfuse as pf
from tests.onnx.ort_compare import assert_matches_onnxruntime

RNG = np.random.default_rng(0)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def model(nodes, feeds, outputs, opset=20):
    """A graph of ``nodes`` reading ``feeds`` (name -> array); ``outputs`` name -> elem type."""
    graph = helper.make_graph(
        nodes, "elementwise",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in feeds.items()],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10  # what the installed onnxruntime reads
    return onnx.shape_inference.infer_shapes(m)


def one_node(op, feeds, outputs=None, opset=20, **attrs):
    outputs = outputs or {"y": TensorProto.FLOAT}
    node = helper.make_node(op, list(feeds), list(outputs), **attrs)
    return model([node], feeds, outputs, opset)


def check(m, feeds, rtol=1e-5, atol=1e-6):
    assert_matches_onnxruntime(m, feeds, rtol, atol)


@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
def test_variadic_broadcasts_three_inputs(op):
    feeds = {"a": randn(2, 1, 4), "b": randn(3, 1), "c": randn(4)}
    check(one_node(op, feeds), feeds)


def test_arithmetic_chain_broadcasts():
    feeds = {"a": randn(2, 3, 4), "b": randn(3, 1), "c": np.abs(randn(1, 4)) + 1}
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]),
             helper.make_node("Mul", ["s", "c"], ["p"]),
             helper.make_node("Div", ["p", "c"], ["q"]),
             helper.make_node("Pow", ["c", "b"], ["y"])]
    check(model(nodes, feeds, {"q": TensorProto.FLOAT, "y": TensorProto.FLOAT}), feeds)


@pytest.mark.unit
def test_clip_without_bounds_is_the_input():
    x = randn(3, 4)
    check(one_node("Clip", {"x": x}, opset=13), {"x": x})


def test_clip_with_only_max():
    feeds = {"x": randn(3, 4), "hi": np.array(0.25, np.float32)}
    node = helper.make_node("Clip", ["x", "", "hi"], ["y"])
    check(model([node], feeds, {"y": TensorProto.FLOAT}, opset=13), feeds)


def test_where_broadcasts():
    feeds = {"c": RNG.random((3, 1)) > 0.5, "a": randn(1, 4), "b": np.array(-1.0, np.float32)}
    check(one_node("Where", feeds), feeds)


def test_cast_chain():
    x = (randn(5, 6) * 40).astype(np.float32)
    chain = [("x", "h", TensorProto.FLOAT16), ("h", "f", TensorProto.FLOAT),
             ("f", "i", TensorProto.INT32), ("i", "d", TensorProto.DOUBLE),
             ("d", "b", TensorProto.BOOL), ("b", "y", TensorProto.INT64)]
    nodes = [helper.make_node("Cast", [src], [dst], to=to) for src, dst, to in chain]
    outputs = {"h": TensorProto.FLOAT16, "i": TensorProto.INT32, "d": TensorProto.DOUBLE,
               "y": TensorProto.INT64}
    check(model(nodes, {"x": x}, outputs), {"x": x})


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    x = randn(4, 7) * 3
    check(one_node("Gelu", {"x": x}, approximate=approximate), {"x": x})


@pytest.mark.parametrize("op, attrs", [
    ("LeakyRelu", {"alpha": 0.2}), ("Elu", {"alpha": 0.7}), ("Selu", {}), ("Celu", {"alpha": 2.0}),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("HardSwish", {}), ("Softplus", {}),
    ("Softsign", {}), ("Mish", {}),
])
def test_activation(op, attrs):
    x = randn(3, 8) * 4
    check(one_node(op, {"x": x}, **attrs), {"x": x})


@pytest.mark.parametrize("op, attrs", [("Div", {}), ("Mod", {"fmod": 0}), ("Mod", {"fmod": 1})])
def test_integer_division_signs(op, attrs):
    feeds = {"a": np.array([-7, 7, -7, 7, 6, -6], np.int32),
             "b": np.array([2, -2, -2, 2, 3, 4], np.int32)}
    check(one_node(op, feeds, {"y": TensorProto.INT32}, **attrs), feeds)


DROPOUT_OUTPUTS = {"y": TensorProto.FLOAT, "mask": TensorProto.BOOL}


def test_dropout_in_inference_passes_input_and_a_true_mask():
    x = randn(3, 5)
    check(one_node("Dropout", {"x": x}, DROPOUT_OUTPUTS, opset=13), {"x": x})


def test_dropout_in_training_drops_about_ratio_and_rescales():
    feeds = {"x": randn(64, 64), "r": np.array(0.25, np.float32), "t": np.array(True)}
    m = one_node("Dropout", feeds, DROPOUT_OUTPUTS, opset=13, seed=7)
    y, mask = pf.compile(m, target="host")(*feeds.values())
    assert abs(mask.mean() - 0.75) < 0.03
    np.testing.assert_allclose(y, np.where(mask, feeds["x"] / 0.75, 0), rtol=1e-6)


def test_legacy_axis_broadcast():
    a, b = randn(2, 3, 4), randn(3)
    node = helper.make_node("Add", ["a", "b"], ["y"], broadcast=1, axis=1)
    m = model([node], {"a": a, "b": b}, {"y": TensorProto.FLOAT}, opset=6)
    np.testing.assert_allclose(pf.compile(m, target="host")(a, b), a + b[:, None], rtol=1e-6)
