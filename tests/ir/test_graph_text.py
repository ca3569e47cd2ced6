"""The graph IR's text form: parse_graph(str(g), weights) gives g back, and means the same."""

import dataclasses
import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polyfuse.frontends.graph_text import GraphSyntaxError, WeightError, parse_graph
from polyfuse.frontends.onnx import to_graph
from polyfuse.ir.graph import Constant, Graph, Node, TensorType, Value
from polyfuse.ir.types import DType
from polyfuse.lowering.ops import OPS
from polyfuse.driver import compile_graph
from polyfuse.targets import Target

pytestmark = pytest.mark.unit

F32, I64 = DType.FLOAT32, DType.INT64


def same_attr(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape \
            and np.array_equal(a, b)
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(map(same_attr, a, b))
    return type(a) is type(b) and (a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)))


def assert_round_trips(g: Graph, weights=None) -> Graph:
    """Node equality compares array attributes with ==, so attributes are compared apart."""
    text = str(g)
    back = parse_graph(text, g if weights is None else weights)
    assert str(back) == text
    assert dataclasses.replace(back, nodes=()) == dataclasses.replace(g, nodes=())
    assert len(back.nodes) == len(g.nodes)
    for n, m in zip(back.nodes, g.nodes):
        assert dataclasses.replace(n, attrs=()) == dataclasses.replace(m, attrs=())
        assert same_attr(n.attrs, m.attrs), (n.attrs, m.attrs)
    return back


def test_text_form():
    g = Graph("mlp", (Value("x", TensorType(F32, ("batch", 4))),),
              (Value("y", TensorType(F32, ("batch", 2))),),
              (Node("Gemm", "fc/Gemm", ("x", "w", "b"), ("h",), (("transB", 1), ("alpha", 0.5)), "g0"),
               Node("Clip", "clip", ("h", "", "hi"), ("y",))),
              (Constant("w", np.zeros((2, 4), np.float32)), Constant("b", np.array([1.5, -2], np.float32)),
               Constant("hi", np.full((17,), 6, np.float32))), 17)
    assert str(g) == """\
graph mlp(%x: float32[batch, 4]) -> (%y: float32[batch, 2]) opset 17 {
  %w = constant float32[2, 4] [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
  %b = constant float32[2] [1.5, -2.0]
  %hi = constant float32[17] sha:e5a5e5e2b4764a21
  %h = Gemm(%x, %w, %b, transB=1, alpha=0.5)  # fc/Gemm @g0
  %y = Clip(%h, _, %hi)  # clip
}"""
    assert parse_graph(str(g), g) == g


def test_every_attribute_kind_round_trips():
    attrs = (("i", -3), ("f", 0.1), ("e", 1e-05), ("inf", float("inf")), ("ninf", float("-inf")),
             ("nan", float("nan")), ("s", 'a "quoted"\n\\ é'), ("empty", ""), ("ints", (1, -2, 3)),
             ("floats", (0.5, 2.0)), ("strings", ("a", "b c")), ("none", ()), ("flag", True),
             ("t", np.arange(6, dtype=np.int64).reshape(2, 3)), ("t0", np.array(2.5, np.float64)),
             ("tb", np.array([True, False])), ("tbf", np.array([0.1, 3], DType.BFLOAT16.numpy)),
             ("big", np.linspace(0, 1, 25, dtype=np.float16).reshape(5, 5)),
             ("tensors", (np.ones(2, np.int8), np.zeros((0, 3), np.float32))))
    g = Graph("attrs", (Value("x", TensorType(F32, (2,))),), (Value("y", TensorType(F32, (2,))),),
              (Node("Op", "n", ("x",), ("y",), attrs),))
    back = assert_round_trips(g)
    assert "big=tensor<float16[5, 5]> sha:" in str(g)
    assert type(back.nodes[0].attr("f")) is float and type(back.nodes[0].attr("i")) is int
    # numpy scalars print as the Python numbers they equal
    assert str(Node("Op", "n", (), ("y",), (("a", np.float32(0.5)), ("b", np.bool_(True))))) == \
        "%y = Op(a=0.5, b=true)  # n"


ODD_NAMES = ["a", "0", "", "_", "inf", "nan", "true", "constant", "tensor", "graph", "opset",
             "onnx::Gemm_0", "/fc1/Gemm_output_0", "input.1", "x y", "é", '"q"', "\n\t", "-1",
             "sha:12", "#", "@g", "%v", "a=b"]


@pytest.mark.parametrize("name", ODD_NAMES)
def test_any_name_round_trips(name):
    t = TensorType(F32, (name, 3))
    g = Graph(name, (Value(name, t),), (Value(name + "'", t), Value("z", t)),
              (Node(name, name, (name, "", name), (name + "'", "", "z"), ((name or "k", name),), name),),
              (Constant(name + "c", np.ones(3, np.float32)),), 1)
    assert parse_graph(str(g)) == g


def test_symbolic_dims_groups_and_multiple_outputs():
    t = TensorType(F32, ("batch", "seq", 8))
    g = Graph("g", (Value("x", t),), (Value("a", t), Value("b", t)),
              (Node("Split", "split", ("x", ""), ("a", "b", ""), (("axis", -1),), "fused.0"),
               Node("Relu", "relu", ("a",), ("r",), (), "fused.0")))
    assert assert_round_trips(g) == g


# --- graphs from ONNX models: same structure and same numbers after the round trip ---

def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "model", inputs, outputs,
                              [numpy_helper.from_array(a, name) for name, a in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _mlp():
    rng = np.random.default_rng(0)
    return _model(
        [helper.make_node("Gemm", ["input.1", "fc1.weight", "fc1.bias"], ["/fc1/Gemm_output_0"],
                          name="/fc1/Gemm", transB=1),
         helper.make_node("Relu", ["/fc1/Gemm_output_0"], ["/relu/Relu_output_0"], name="/relu/Relu"),
         helper.make_node("MatMul", ["/relu/Relu_output_0", "onnx::MatMul_9"], ["out"], name="/fc2/MatMul")],
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 3])],
        [("fc1.weight", rng.standard_normal((16, 8)).astype(np.float32)),
         ("fc1.bias", rng.standard_normal(16).astype(np.float32)),
         ("onnx::MatMul_9", rng.standard_normal((16, 3)).astype(np.float32))]), {"batch": 5}


def _cnn():
    rng = np.random.default_rng(1)
    return _model(
        [helper.make_node("Conv", ["x", "conv.w", "conv.b"], ["c"], name="conv", pads=[1, 1, 1, 1],
                          strides=[1, 1], kernel_shape=[3, 3]),
         helper.make_node("Relu", ["c"], ["r"], name="relu"),
         helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
         helper.make_node("Flatten", ["p"], ["f"], name="flatten", axis=1),
         helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["y"], name="fc", transB=1, alpha=1.0)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])],
        [("conv.w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32)),
         ("conv.b", rng.standard_normal(4).astype(np.float32)),
         ("fc.w", rng.standard_normal((10, 64)).astype(np.float32)),
         ("fc.b", rng.standard_normal(10).astype(np.float32))]), {}


def _shapes():
    """A Constant node, int64 shape constants, a tensor attribute and an omitted input."""
    return _model(
        [helper.make_node("Constant", [], ["shape"], name="const_shape",
                          value=numpy_helper.from_array(np.array([2, 12], np.int64))),
         helper.make_node("Reshape", ["x", "shape"], ["flat"], name="reshape"),
         helper.make_node("ConstantOfShape", ["shape"], ["fill"], name="fill",
                          value=numpy_helper.from_array(np.array([0.25], np.float32))),
         helper.make_node("Add", ["flat", "fill"], ["sum"], name="add"),
         helper.make_node("Clip", ["sum", "", "hi"], ["clipped"], name="clip"),
         helper.make_node("ReduceSum", ["clipped", "axes"], ["y"], name="reduce", keepdims=0)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [("hi", np.array(1.0, np.float32)), ("axes", np.array([1], np.int64))]), {}


@pytest.mark.parametrize("make", [_mlp, _cnn, _shapes])
def test_onnx_graph_round_trips_and_runs_the_same(make):
    model, sizes = make()
    g = to_graph(model, set(OPS))
    assert assert_round_trips(g) == g
    back = parse_graph(str(g), {c.name: c.array for c in g.constants})
    rng = np.random.default_rng(2)
    feed = {v.name: rng.standard_normal([sizes.get(d, d) for d in v.type.shape]).astype(np.float32)
            for v in g.inputs}
    target = Target.parse("reference")
    want = compile_graph(g, target).run(feed)
    got = compile_graph(back, target).run(feed)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


# --- errors ---

def test_syntax_error_points_at_the_token():
    text = "graph g(%x: float32[2]) -> (%y: float32[2]) {\n  %y = Relu(%x,, )  # r\n}"
    with pytest.raises(GraphSyntaxError) as err:
        parse_graph(text)
    assert str(err.value) == ("<graph>:2:16: error: expected an input or attribute, found ','\n"
                              "      %y = Relu(%x,, )  # r\n"
                              "                   ^")
    assert (err.value.line, err.value.col) == (2, 16)


def test_bad_character_and_unknown_type():
    with pytest.raises(GraphSyntaxError, match=r"<graph>:1:9: error: unexpected character '\$'"):
        parse_graph("graph g($x")
    with pytest.raises(GraphSyntaxError, match="1:13: error: unknown element type 'float'"):
        parse_graph("graph g(%x: float[2]) -> () {}")


def test_missing_weight_is_named():
    g = to_graph(_mlp()[0], set(OPS))
    with pytest.raises(WeightError) as err:
        parse_graph(str(g))
    assert "constant 'fc1.weight' has no data: weights lack 'fc1.weight'" in str(err.value)
    assert "^~~~" in str(err.value)
    weights = {c.name: c.array for c in g.constants}
    assert parse_graph(str(g), weights) == g


def test_weight_with_other_data_is_refused():
    g = to_graph(_mlp()[0], set(OPS))
    weights = {c.name: c.array for c in g.constants}
    weights["fc1.weight"] = weights["fc1.weight"] + 1
    with pytest.raises(WeightError, match="weights\\['fc1.weight'\\] is float32\\[16, 8\\] sha:"):
        parse_graph(str(g), weights)
    weights["fc1.weight"] = np.zeros(4, np.float32)
    with pytest.raises(WeightError, match="is float32\\[4\\] sha:.*the text says float32\\[16, 8\\]"):
        parse_graph(str(g), weights)
