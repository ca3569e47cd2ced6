"""Loops and branches the data decides, run by the program itself (a LoopStep or BranchStep
in the plan, no tail, no submodel compiled): against onnxruntime, on the native program,
the per-step interpreter (reference target), an emulated aarch64 program and a bundle;
and what the program cannot run left to Python, still right."""

from unittest import mock

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import polyfuse as pf
from polyfuse.ir.plan import BranchStep, LoopStep
from polyfuse.runtime.model import _NativeProgram
from tests.arm_tools import AARCH64
from tests.onnx.ort_compare import assert_matches_onnxruntime, onnxruntime_outputs

F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
node = helper.make_node
value = helper.make_tensor_value_info
RNG = np.random.default_rng(11)


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _scalar(name, dtype, v):
    return helper.make_tensor(name, dtype, [], [v])


def _run_in_program(model, feeds_list, step, target="host"):
    """Every feed matches onnxruntime, and the plan runs the control flow as ``step``
    in one program, with no tail and no submodel compiled."""
    compiled = pf.compile(model, target=target)
    for feeds in feeds_list:
        assert_matches_onnxruntime(model, feeds, compiled=compiled, rtol=1e-5, atol=1e-5)
    plan = compiled.plan_for().plan
    assert plan.tail is None and any(isinstance(st, step) for st in plan.steps)
    assert compiled._submodels == {}
    if target == "host":   # one program run per call: no body or branch run from Python
        assert isinstance(compiled.plan_for().program, _NativeProgram)
        with mock.patch.object(_NativeProgram, "run", autospec=True, side_effect=_NativeProgram.run) as run:
            compiled.run(feeds_list[0])
        assert run.call_count == 1
    return compiled


def doubling_while_loop():
    """while sum(x) <= limit: x = x * 2, with no trip count."""
    body = helper.make_graph(
        [node("Mul", ["x_in", "two"], ["x_out"]), node("ReduceSum", ["x_out"], ["s"], keepdims=0),
         node("LessOrEqual", ["s", "limit"], ["c_out"])], "body",
        [value("i", I64, []), value("c_in", BOOL, []), value("x_in", F, [8])],
        [value("c_out", BOOL, []), value("x_out", F, [8])])
    nodes = [node("ReduceSum", ["x"], ["s0"], keepdims=0), node("LessOrEqual", ["s0", "limit"], ["go"]),
             node("Loop", ["", "go", "x"], ["y"], body=body)]
    return _model(nodes, [value("x", F, [8]), value("limit", F, [])], [value("y", F, [8])],
                  [_scalar("two", F, 2.0)])


@pytest.mark.parametrize("target", ["host", "reference"])
def test_while_loop_on_data_runs_in_the_program(target):
    x = np.abs(RNG.standard_normal(8)).astype(np.float32) + 0.1
    feeds = [{"x": x, "limit": np.array(limit, np.float32)} for limit in (100.0, 1e4, 0.5)]  # 0.5: no iteration
    _run_in_program(doubling_while_loop(), feeds, LoopStep, target)


def several_dtypes_loop():
    """M = int64(sum(n)) iterations carrying float32, int32, float64 and bool values."""
    body = helper.make_graph(
        [node("Identity", ["c_in"], ["c_out"]),
         node("Mul", ["x_in", "half"], ["xh"]), node("Add", ["xh", "one"], ["x_out"]),
         node("Add", ["k_in", "two"], ["k_out"]),
         node("Cast", ["i"], ["di"], to=TensorProto.DOUBLE), node("Add", ["d_in", "di"], ["d_out"]),
         node("Not", ["b_in"], ["b_out"])], "body",
        [value("i", I64, []), value("c_in", BOOL, []), value("x_in", F, [2, 3]),
         value("k_in", TensorProto.INT32, [3]), value("d_in", TensorProto.DOUBLE, []), value("b_in", BOOL, [2])],
        [value("c_out", BOOL, []), value("x_out", F, [2, 3]), value("k_out", TensorProto.INT32, [3]),
         value("d_out", TensorProto.DOUBLE, []), value("b_out", BOOL, [2])],
        [_scalar("half", F, 0.5), _scalar("one", F, 1.0), _scalar("two", TensorProto.INT32, 2)])
    nodes = [node("ReduceSum", ["n"], ["sn"], keepdims=0), node("Cast", ["sn"], ["M"], to=I64),
             node("Loop", ["M", "", "x", "k", "d", "b"], ["x_end", "k_end", "d_end", "b_end"], body=body)]
    return _model(nodes, [value("x", F, [2, 3]), value("k", TensorProto.INT32, [3]),
                          value("d", TensorProto.DOUBLE, []), value("b", BOOL, [2]), value("n", F, [70])],
                  [value("x_end", F, [2, 3]), value("k_end", TensorProto.INT32, [3]),
                   value("d_end", TensorProto.DOUBLE, []), value("b_end", BOOL, [2])])


@pytest.mark.parametrize("target", ["host", "reference"])
def test_trip_count_from_data_with_carried_values_of_several_dtypes(target):
    def feeds(trips):
        n = np.zeros(70, np.float32)
        n[3] = trips
        return {"x": RNG.standard_normal((2, 3)).astype(np.float32), "k": np.array([1, -2, 5], np.int32),
                "d": np.array(0.25), "b": np.array([True, False]), "n": n}
    _run_in_program(several_dtypes_loop(), [feeds(t) for t in (5, 0, 1, 300, -3)], LoopStep, target)


def early_exit_scan_loop():
    """Up to 8 iterations of y += x while sum(y) < limit, y after each as a scan output,
    then Relu of the scans (planned for the iterations run)."""
    body = helper.make_graph(
        [node("Add", ["y_in", "x"], ["y_out"]), node("ReduceSum", ["y_out"], ["s"], keepdims=0),
         node("Less", ["s", "limit"], ["c_out"]), node("Mul", ["y_out", "y_out"], ["sq"])], "body",
        [value("i", I64, []), value("c_in", BOOL, []), value("y_in", F, [3])],
        [value("c_out", BOOL, []), value("y_out", F, [3]), value("sq", F, [3])])
    nodes = [node("Loop", ["M", "", "y0"], ["y", "ys"], body=body), node("Relu", ["ys"], ["r"])]
    return _model(nodes, [value("x", F, [3]), value("y0", F, [3]), value("limit", F, [])],
                  [value("y", F, [3]), value("r", F, ["n", 3])], [_scalar("M", I64, 8)])


@pytest.mark.parametrize("target", ["host", "reference"])
def test_known_trip_count_early_exit_and_scan_outputs_cut_to_the_iterations_run(target):
    model = early_exit_scan_loop()
    compiled = pf.compile(model, target=target)
    x = np.array([1.0, 0.5, 0.25], np.float32)
    for limit in (3.0, 9.0, 1e3, -1.0):   # 2, 5, 8 and 1 iterations
        feeds = {"x": x, "y0": np.zeros(3, np.float32), "limit": np.array(limit, np.float32)}
        assert_matches_onnxruntime(model, feeds, compiled=compiled)
    plan = compiled.plan_for().plan
    loop = next(st for st in plan.steps if isinstance(st, LoopStep))
    assert plan.types[loop.stacked[0]].shape == (8, 3)
    assert plan.tail is not None and [t.count for t in plan.tail.trims] == [loop.counter]
    assert "cut to their counts" in str(plan)


def if_on_sum_model():
    """y = (x * 2 + 1, max(x)) if sum(x) > 0 else (x - 3, min(x))."""
    then = helper.make_graph([node("Mul", ["x", "two"], ["t0"]), node("Add", ["t0", "one"], ["t"]),
                              node("ReduceMax", ["x"], ["tm"], keepdims=0)], "then", [],
                             [value("t", F, [3, 4]), value("tm", F, [])])
    other = helper.make_graph([node("Sub", ["x", "three"], ["e"]), node("ReduceMin", ["x"], ["em"], keepdims=0)],
                              "else", [], [value("e", F, [3, 4]), value("em", F, [])])
    nodes = [node("ReduceSum", ["x"], ["s"], keepdims=0), node("Greater", ["s", "zero"], ["c"]),
             node("If", ["c"], ["y", "m"], then_branch=then, else_branch=other), node("Relu", ["y"], ["r"])]
    return _model(nodes, [value("x", F, [3, 4])], [value("r", F, [3, 4]), value("m", F, [])],
                  [_scalar(n, F, v) for n, v in (("zero", 0.0), ("one", 1.0), ("two", 2.0), ("three", 3.0))])


@pytest.mark.parametrize("target", ["host", "reference"])
def test_if_on_a_sum_takes_both_branches_in_the_program(target):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    feeds = [{"x": np.abs(x) + 0.1}, {"x": -np.abs(x) - 0.1}]
    compiled = _run_in_program(if_on_sum_model(), feeds, BranchStep, target)
    text = compiled.dump("plan")
    assert "= if %c {" in text and "} else {" in text


def if_inside_a_loop():
    """M = len-from-data iterations of: x = x * 0.5 - 1 if sum(x) > 0 else x + i."""
    then = helper.make_graph([node("Mul", ["x_in", "half"], ["a"]), node("Sub", ["a", "one"], ["t"])],
                             "then", [], [value("t", F, [2, 3])])
    other = helper.make_graph([node("Cast", ["i"], ["fi"], to=F), node("Add", ["x_in", "fi"], ["e"])],
                              "else", [], [value("e", F, [2, 3])])
    body = helper.make_graph(
        [node("Identity", ["c_in"], ["c_out"]), node("ReduceSum", ["x_in"], ["s"], keepdims=0),
         node("Greater", ["s", "zero"], ["pos"]),
         node("If", ["pos"], ["x_out"], then_branch=then, else_branch=other)], "body",
        [value("i", I64, []), value("c_in", BOOL, []), value("x_in", F, [2, 3])],
        [value("c_out", BOOL, []), value("x_out", F, [2, 3])])
    nodes = [node("ReduceSum", ["n"], ["M"], keepdims=0), node("Loop", ["M", "", "x"], ["y"], body=body)]
    return _model(nodes, [value("x", F, [2, 3]), value("n", I64, [80])], [value("y", F, [2, 3])],
                  [_scalar(n, F, v) for n, v in (("zero", 0.0), ("one", 1.0), ("half", 0.5))])


@pytest.mark.parametrize("target", ["host", "reference"])
def test_if_nested_in_a_loop_body(target):
    def feeds(trips):
        n = np.zeros(80, np.int64)
        n[:2] = (trips, 0)
        return {"x": RNG.standard_normal((2, 3)).astype(np.float32) * 4, "n": n}
    compiled = _run_in_program(if_inside_a_loop(), [feeds(t) for t in (7, 0, 1)], LoopStep, target)
    loop = next(st for st in compiled.plan_for().plan.steps if isinstance(st, LoopStep))
    assert any(isinstance(st, BranchStep) for st in loop.body.steps)


def test_a_body_whose_carried_shape_changes_runs_from_python():
    """x = concat(x, x[:1]) each iteration: one plan cannot serve every iteration."""
    body = helper.make_graph(
        [node("Identity", ["c_in"], ["c_out"]), node("Slice", ["x_in", "zero", "one"], ["head"]),
         node("Concat", ["x_in", "head"], ["x_out"], axis=0)], "body",
        [value("i", I64, []), value("c_in", BOOL, []), value("x_in", F, ["n"])],
        [value("c_out", BOOL, []), value("x_out", F, ["m"])],
        [helper.make_tensor("zero", I64, [1], [0]), helper.make_tensor("one", I64, [1], [1])])
    nodes = [node("ReduceSum", ["t"], ["M"], keepdims=0), node("Loop", ["M", "", "x"], ["y"], body=body)]
    model = _model(nodes, [value("x", F, [3]), value("t", I64, [70])], [value("y", F, ["k"])])
    compiled = pf.compile(model, target="host")
    for trips in (3, 0):
        t = np.zeros(70, np.int64)
        t[0] = trips
        assert_matches_onnxruntime(model, {"x": np.float32([1, 2, 3]), "t": t}, compiled=compiled)
    plan = compiled.plan_for().plan
    assert plan.tail is not None and plan.tail.node.op == "Loop"
    assert not any(isinstance(st, LoopStep) for st in plan.steps)


def gather_in_a_loop():
    """acc += table[idx]; idx += 1, for M iterations: past the table, the index is out of bounds."""
    body = helper.make_graph(
        [node("Identity", ["c_in"], ["c_out"]), node("Gather", ["table", "j_in"], ["g"], axis=0),
         node("Add", ["acc_in", "g"], ["acc_out"]), node("Add", ["j_in", "one"], ["j_out"])], "body",
        [value("i", I64, []), value("c_in", BOOL, []), value("acc_in", F, []), value("j_in", I64, [])],
        [value("c_out", BOOL, []), value("acc_out", F, []), value("j_out", I64, [])],
        [_scalar("one", I64, 1)])
    nodes = [node("ReduceSum", ["n"], ["M"], keepdims=0),
             node("Loop", ["M", "", "acc0", "j0"], ["acc", "j"], body=body)]
    return _model(nodes, [value("table", F, [4]), value("acc0", F, []), value("j0", I64, []),
                          value("n", I64, [70])], [value("acc", F, []), value("j", I64, [])])


@pytest.mark.parametrize("target", ["host", "reference"])
def test_an_out_of_bounds_gather_in_a_body_names_its_kernel(target):
    model = gather_in_a_loop()

    def feeds(trips):
        n = np.zeros(70, np.int64)
        n[0] = trips
        return {"table": np.float32([1, 2, 4, 8]), "acc0": np.array(0.5, np.float32),
                "j0": np.array(0, np.int64), "n": n}
    compiled = _run_in_program(model, [feeds(4)], LoopStep, target)
    named = "kernel 'Loop_1/.*Gather.*' read" if target == "host" else "reads X.* out of bounds"
    with pytest.raises(pf.BoundsError, match=named):
        compiled.run(feeds(5))


def test_scripted_while_loop_on_data_runs_in_the_program(tmp_path):
    torch = pytest.importorskip("torch")

    @torch.jit.script
    def grow(x: torch.Tensor, limit: torch.Tensor) -> torch.Tensor:
        while bool(x.sum() < limit):
            x = x * 1.5 + 0.25
        return x

    class M(torch.nn.Module):
        def forward(self, x, limit):
            return grow(x, limit)

    path = tmp_path / "while.onnx"
    torch.onnx.export(torch.jit.script(M()), (torch.ones(2, 3), torch.tensor(10.0)), str(path),
                      input_names=["x", "limit"], output_names=["y"], dynamo=False)
    model = onnx.load(str(path))
    assert "Loop" in {n.op_type for n in model.graph.node}
    feeds = [{"x": np.abs(RNG.standard_normal((2, 3))).astype(np.float32), "limit": np.array(v, np.float32)}
             for v in (50.0, 1e5, -1.0)]
    _run_in_program(model, feeds, LoopStep)


@pytest.mark.parametrize("target", [AARCH64])
def test_an_emulated_program_runs_loops_and_branches(target):
    compiled = pf.compile(if_inside_a_loop(), target=target)
    n = np.zeros(80, np.int64)
    n[0] = 6
    feeds = {"x": RNG.standard_normal((2, 3)).astype(np.float32) * 4, "n": n}
    want = onnxruntime_outputs(if_inside_a_loop(), feeds)
    np.testing.assert_allclose(compiled.run(feeds)["y"], want[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(pf.BoundsError, match="Gather"):
        gather = pf.compile(gather_in_a_loop(), target=target)
        n[0] = 5
        gather.run({"table": np.float32([1, 2, 4, 8]), "acc0": np.array(0.5, np.float32),
                    "j0": np.array(0, np.int64), "n": n[:70]})


@pytest.mark.parametrize("target", ["x86", AARCH64])
def test_a_bundle_runs_a_data_dependent_loop_and_branch(target, tmp_path):
    from tests.runtime.test_bundle import assert_prints_the_same, build_and_run
    feed = {"x": np.abs(RNG.standard_normal(8)).astype(np.float32) + 0.1, "limit": np.array(300.0, np.float32)}
    compiled, run = build_and_run(doubling_while_loop(), feed, target, tmp_path)
    assert_prints_the_same(compiled, run, feed)
    n = np.zeros(80, np.int64)
    n[0] = 4
    feed = {"x": RNG.standard_normal((2, 3)).astype(np.float32) * 4, "n": n}
    compiled, run = build_and_run(if_inside_a_loop(), feed, target, tmp_path)
    assert_prints_the_same(compiled, run, feed)


def test_profile_sums_a_kernel_over_its_iterations():
    compiled = pf.compile(doubling_while_loop(), target="host")
    feeds = {"x": np.ones(8, np.float32), "limit": np.array(1e3, np.float32)}
    profile = compiled.profile(feeds, repeat=2)
    kernels = compiled.plan_for().plan.kernels
    assert [label for label, _ in profile] == [st.label for st in kernels]
    assert any(label.startswith("Loop_2/") for label, _ in profile) and all(t >= 0 for _, t in profile)


def nested_loops():
    """M1 (from data) times: M2 (from data) times x = x + i_inner, then x = x * 0.5 + i_outer."""
    inner = helper.make_graph(
        [node("Identity", ["d_in"], ["d_out"]), node("Cast", ["j"], ["fj"], to=F),
         node("Add", ["v_in", "fj"], ["v_out"])], "inner",
        [value("j", I64, []), value("d_in", BOOL, []), value("v_in", F, [5])],
        [value("d_out", BOOL, []), value("v_out", F, [5])])
    outer = helper.make_graph(
        [node("Identity", ["c_in"], ["c_out"]), node("Loop", ["m2", "", "x_in"], ["xi"], body=inner),
         node("Mul", ["xi", "half"], ["h"]), node("Cast", ["i"], ["fi"], to=F), node("Add", ["h", "fi"], ["x_out"])],
        "outer", [value("i", I64, []), value("c_in", BOOL, []), value("x_in", F, [5])],
        [value("c_out", BOOL, []), value("x_out", F, [5])])
    nodes = [node("ReduceSum", ["n1"], ["m1"], keepdims=0), node("ReduceSum", ["n2"], ["m2"], keepdims=0),
             node("Loop", ["m1", "", "x"], ["y"], body=outer)]
    return _model(nodes, [value("x", F, [5]), value("n1", I64, [70]), value("n2", I64, [70])],
                  [value("y", F, [5])], [_scalar("half", F, 0.5)])


@pytest.mark.parametrize("target", ["host", "reference"])
def test_a_loop_nested_in_a_loop_body(target):
    def feeds(outer, inner):
        n1, n2 = np.zeros(70, np.int64), np.zeros(70, np.int64)
        n1[5], n2[9] = outer, inner
        return {"x": RNG.standard_normal(5).astype(np.float32), "n1": n1, "n2": n2}
    compiled = _run_in_program(nested_loops(), [feeds(3, 4), feeds(2, 0), feeds(0, 3), feeds(6, 1)],
                               LoopStep, target)
    loop = next(st for st in compiled.plan_for().plan.steps if isinstance(st, LoopStep))
    assert any(isinstance(st, LoopStep) for st in loop.body.steps)


def test_scan_outputs_of_a_loop_too_long_to_hold_are_stacked_from_python():
    """An exported while loop's trip count is 2**63 - 1: its scans cannot have a row each."""
    model = early_exit_scan_loop()
    model.graph.initializer[0].CopyFrom(_scalar("M", I64, 2**63 - 1))
    compiled = pf.compile(model, target="host")
    feeds = {"x": np.float32([1, 2, 3]), "y0": np.zeros(3, np.float32), "limit": np.array(20.0, np.float32)}
    assert_matches_onnxruntime(model, feeds, compiled=compiled)
    assert compiled.plan_for().plan.tail.node.op == "Loop"


def test_an_if_whose_branches_give_different_shapes_runs_from_python():
    then = helper.make_graph([node("Mul", ["x", "x"], ["t"])], "then", [], [value("t", F, [4])])
    other = helper.make_graph([node("ReduceSum", ["x"], ["e"], keepdims=1)], "else", [], [value("e", F, [1])])
    model = _model([node("ReduceSum", ["x"], ["s"], keepdims=0), node("Greater", ["s", "zero"], ["c"]),
                    node("If", ["c"], ["y"], then_branch=then, else_branch=other), node("Neg", ["y"], ["z"])],
                   [value("x", F, [4])], [value("z", F, ["k"])], [_scalar("zero", F, 0.0)])
    compiled = pf.compile(model, target="host")
    for x in (np.float32([1, 2, 3, -1]), np.float32([-1, -2, 3, -1])):
        assert_matches_onnxruntime(model, {"x": x}, compiled=compiled)
    assert compiled.plan_for().plan.tail.node.op == "If"
