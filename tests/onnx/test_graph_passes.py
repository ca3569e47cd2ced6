"""Graph passes: printed before/after, numerics unchanged."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from polyfuse.frontends.onnx import to_graph
from polyfuse.ir.graph import verify_graph
from polyfuse.lowering.graph_passes import (PassManager, eliminate_common_subexpressions,
                                            eliminate_dead_nodes)


def model():
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["a"], name="mm1"),
             helper.make_node("MatMul", ["x", "W"], ["b"], name="mm2"),      # same as mm1
             helper.make_node("Add", ["a", "b"], ["c"], name="add"),
             helper.make_node("Relu", ["a"], ["unused"], name="dead_relu"),  # feeds nothing
             helper.make_node("Sub", ["x", "x"], ["dead_sub"], name="dead_sub")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 3])],
                              [numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_dead_nodes_go():
    g = to_graph(model())
    after = eliminate_dead_nodes(g)
    verify_graph(after)
    assert "dead_relu" in str(g) and "dead_relu" not in str(after) and "dead_sub" not in str(after)
    assert [n.name for n in after.nodes] == ["mm1", "mm2", "add"]


def test_common_subexpressions_merge():
    after = eliminate_common_subexpressions(eliminate_dead_nodes(to_graph(model())))
    verify_graph(after)
    assert [n.name for n in after.nodes] == ["mm1", "add"]
    assert "%c = Add(%a, %a)" in str(after)


def test_pass_manager_dumps_and_keeps_numerics():
    pm = PassManager(verify=True, keep_dumps=True)
    out = pm.run(to_graph(model()))
    assert [name for name, _ in pm.dumps] == ["input", "eliminate_dead_nodes",
                                              "eliminate_common_subexpressions", "eliminate_dead_nodes"]
    assert len(out.nodes) == 2
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_allclose(pf.compile(model(), target="host")(x), 2 * (x @ w), rtol=1e-5)


def test_memory_plan_reuses_dead_activations():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Exp", ["a"], ["b"]),
             helper.make_node("Tanh", ["b"], ["c"]), helper.make_node("Abs", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])])
    m = pf.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), target="host")
    plan = m.memory_plan(x=(64, 64))
    one = 64 * 64 * 4
    assert plan.naive_bytes == 4 * one
    assert plan.arena_bytes == 2 * one   # a and c share a slot, b and y the other
    assert plan.offsets["a"] == plan.offsets["c"] != plan.offsets["b"]
