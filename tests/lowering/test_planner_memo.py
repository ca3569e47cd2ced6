"""A model's planner shares what its plans lower alike (lowering/plan.Memos): planned at
a new shape, it lowers again only the nodes whose inputs changed, and the plan is the
one a planner with nothing remembered makes (its text, kernels and constants)."""

import numpy as np
from onnx import TensorProto, helper

import polyfuse.lowering.plan as planning
import polyfuse.lowering.ops as ops
from polyfuse.driver import _front_end, _optimized
from tests.onnx.test_models import make_model

RNG = np.random.default_rng(3)
node = helper.make_node


def decoder_step():
    """A projection of the new token (its shape fixed) and attention over a past whose
    length changes: the projection's nodes see the same inputs at every past length."""
    init = {"W": (RNG.standard_normal((16, 16)) * 0.1).astype(np.float32),
            "b": (RNG.standard_normal(16) * 0.1).astype(np.float32)}
    nodes = [node("MatMul", ["x", "W"], ["xw"]), node("Add", ["xw", "b"], ["h"]), node("Tanh", ["h"], ["q"]),
             node("Concat", ["past", "q"], ["keys"], axis=0),
             node("Transpose", ["keys"], ["kt"], perm=[1, 0]), node("MatMul", ["q", "kt"], ["s"]),
             node("Softmax", ["s"], ["p"], axis=-1), node("MatMul", ["p", "keys"], ["y"])]
    return make_model(nodes, {"x": (TensorProto.FLOAT, [1, 16]), "past": (TensorProto.FLOAT, ["n", 16])},
                      {"y": (TensorProto.FLOAT, [1, 16]), "keys": (TensorProto.FLOAT, ["m", 16])}, init)


def test_a_new_shape_lowers_only_the_nodes_it_changes(monkeypatch):
    graph, _ = _optimized(_front_end(decoder_step()))
    planner = planning.GraphPlanner(graph)
    lowered: list[str] = []
    real = ops.lower

    def counting(context):
        lowered.append(context.node.name)
        return real(context)
    monkeypatch.setattr(planning, "lower", counting)
    planner.plan({"x": (1, 16), "past": (5, 16)}, {})
    first = list(lowered)
    for n in (6, 9, 30):
        lowered.clear()
        plan = planner.plan({"x": (1, 16), "past": (n, 16)}, {})
        again = list(lowered)
        fresh = planning.GraphPlanner(graph).plan({"x": (1, 16), "past": (n, 16)}, {})
        assert str(plan) == str(fresh)
        assert [str(s.definition) for s in plan.steps if hasattr(s, "definition")] == \
            [str(s.definition) for s in fresh.steps if hasattr(s, "definition")]
        assert plan.constants.keys() == fresh.constants.keys()
        assert 0 < len(again) < len(first), (again, first)
        assert "MatMul_0" not in again and "Softmax_6" in again


def test_shapes_computed_at_plan_time_are_remembered_by_value(monkeypatch):
    """A node whose constant inputs are computed while planning (a Reshape's shape from
    Shape -> Gather -> Concat: new arrays in every plan) is lowered again only where their
    values change, and the folded computation likewise; the plan is a fresh planner's."""
    init = {"idx": np.array([1], np.int64), "neg": np.array([-1], np.int64)}
    nodes = [node("Shape", ["x"], ["s"]), node("Gather", ["s", "idx"], ["d"]),
             node("Concat", ["neg", "d"], ["shape"], axis=0), node("Reshape", ["x", "shape"], ["r"]),
             node("Relu", ["r"], ["y"])]
    model = make_model(nodes, {"x": (TensorProto.FLOAT, ["n", 6])}, {"y": (TensorProto.FLOAT, ["m", 6])}, init)
    graph, _ = _optimized(_front_end(model))
    planner = planning.GraphPlanner(graph)
    folded: list[int] = []
    real = planning.interpret

    def counting(*args):
        folded.append(1)
        return real(*args)
    monkeypatch.setattr(planning, "interpret", counting)
    for n in (3, 4, 7):
        plan = planner.plan({"x": (n, 6)}, {})
        assert str(plan) == str(planning.GraphPlanner(graph).plan({"x": (n, 6)}, {}))
    total = len(folded)
    folded.clear()
    planner.plan({"x": (9, 6)}, {})
    assert len(folded) < total / 3, (folded, total)
