"""Reductions, the softmax family and normalizations on native code against onnxruntime.

Each case is a one-node model built with onnx.helper: its float inputs are graph inputs,
its ``consts`` initializers (weights, axes).
"""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from tests.onnx.ort_compare import assert_matches_onnxruntime

RNG = np.random.default_rng(0)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def one_node(op, feeds, consts=None, outputs=("y",), opset=18, out_type=onnx.TensorProto.FLOAT,
             **attrs):
    consts = consts or {}
    names = list(feeds) + list(consts)
    node = helper.make_node(op, names, list(outputs), **attrs)
    graph = helper.make_graph(
        [node], op,
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in feeds.items()],
        [helper.make_tensor_value_info(n, out_type, None) for n in outputs],
        [numpy_helper.from_array(a, n) for n, a in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10  # what the installed onnxruntime reads
    return onnx.shape_inference.infer_shapes(model)


def check(model, feeds, rtol=1e-4, atol=1e-5):
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    for value, expected in zip(model.graph.output, want):  # where shape inference gave none
        if not value.type.tensor_type.HasField("shape"):
            value.CopyFrom(helper.make_tensor_value_info(
                value.name, value.type.tensor_type.elem_type, expected.shape))
    assert_matches_onnxruntime(model, feeds, rtol, atol, want=want)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_3d_axis1(op):
    x = randn(2, 5, 7) * 4
    check(one_node(op, {"x": x}, axis=1, opset=13), {"x": x})


def test_softmax_before_opset_13_coerces_to_2d():
    x = randn(2, 3, 4)
    check(one_node("Softmax", {"x": x}, axis=1, opset=11), {"x": x})


def test_layer_norm_last_axis_with_statistics():
    x = randn(3, 4, 8) * 3 + 1
    model = one_node("LayerNormalization", {"x": x}, {"w": randn(8), "b": randn(8)},
                     outputs=("y", "mean", "inv_std"), axis=-1, epsilon=1e-5, opset=17)
    check(model, {"x": x})


def test_batch_norm_nchw():
    x = randn(2, 3, 5, 5)
    stats = {"scale": randn(3), "bias": randn(3), "mean": randn(3),
             "var": RNG.uniform(0.5, 2.0, 3).astype(np.float32)}
    check(one_node("BatchNormalization", {"x": x}, stats, epsilon=1e-3, opset=15), {"x": x})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_without_keepdims(op):
    x = randn(3, 6, 4)
    check(one_node(op, {"x": x}, axis=1, keepdims=0, opset=13,
                   out_type=onnx.TensorProto.INT64), {"x": x})


def test_argmax_last_of_ties():
    x = RNG.integers(0, 3, (4, 5)).astype(np.float32)  # many ties
    check(one_node("ArgMax", {"x": x}, axis=-1, select_last_index=1, opset=13,
                   out_type=onnx.TensorProto.INT64), {"x": x})


@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_mean_two_axes(keepdims):
    x = randn(3, 4, 5)
    model = one_node("ReduceMean", {"x": x}, {"axes": np.array([0, -1], np.int64)},
                     keepdims=keepdims)
    check(model, {"x": x})


def test_reduce_max_every_axis_to_a_scalar():
    x = randn(3, 4)
    check(one_node("ReduceMax", {"x": x}, keepdims=0), {"x": x})


def test_reduce_log_sum_exp_large_values():
    x = randn(2, 6) * 50
    model = one_node("ReduceLogSumExp", {"x": x}, {"axes": np.array([1], np.int64)})
    check(model, {"x": x})


def test_cumsum_reverse_exclusive():
    x = randn(3, 5)
    model = one_node("CumSum", {"x": x}, {"axis": np.array(1, np.int64)}, reverse=1,
                     exclusive=1, opset=14)
    check(model, {"x": x})


def test_group_norm_and_lrn():
    x = randn(2, 6, 3, 3)
    check(one_node("GroupNormalization", {"x": x}, {"s": randn(6), "b": randn(6)},
                   num_groups=3, opset=21), {"x": x})
    check(one_node("LRN", {"x": x}, size=3, alpha=1e-3, beta=0.75, bias=1.5, opset=13),
          {"x": x})
