"""If, Loop and Scan: resolved when planning (inlined, unrolled) or run per data, against
onnxruntime and onnx's reference evaluator."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import polyfuse as pf
from polyfuse.errors import ModelError, UnsupportedOpError
from tests.onnx.ort_compare import assert_matches_onnxruntime

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _branch(name, node, out, shape):
    return helper.make_graph([node], name, [], [helper.make_tensor_value_info(out, F, shape)])


def _if_model(cond_nodes, cond_inputs):
    """y = x * 2 if cond else x - 1 (the branches capture x)."""
    then = _branch("then", helper.make_node("Mul", ["x", "two"], ["t"]), "t", [3, 4])
    other = _branch("else", helper.make_node("Sub", ["x", "one"], ["e"]), "e", [3, 4])
    nodes = cond_nodes + [helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)]
    inits = [helper.make_tensor("two", F, [], [2.0]), helper.make_tensor("one", F, [], [1.0])]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [3, 4]), *cond_inputs],
                  [helper.make_tensor_value_info("y", F, [3, 4])], inits)


def _check(model, feeds, **kw):
    assert_matches_onnxruntime(model, feeds, **kw)
    want = ReferenceEvaluator(model).run(None, feeds)
    got = pf.compile(model, target="host").run(feeds)
    for value, expected in zip(model.graph.output, want):
        np.testing.assert_allclose(got[value.name], expected, rtol=1e-5, atol=1e-6)


def test_if_with_a_constant_condition_is_its_branch():
    false = helper.make_tensor("c", TensorProto.BOOL, [], [False])
    cond = helper.make_node("Constant", [], ["cond"], value=false)
    model = _if_model([cond], [])
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    _check(model, {"x": x})
    compiled = pf.compile(model, target="host")
    compiled.run({"x": x})
    plan = compiled.dump("plan")
    assert "If_1/Sub_0" in plan and "Mul" not in plan and "then at run time" not in plan


@pytest.mark.parametrize("value", [True, False])
def test_if_on_a_graph_input_is_the_branch_of_its_value(value):
    model = _if_model([], [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])])
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    _check(model, {"x": x, "cond": np.array(value)})
    compiled = pf.compile(model, target="host")
    compiled.run({"x": x, "cond": np.array(value)})
    plan = compiled.dump("plan")
    assert ("Mul" in plan) == value and "then at run time" not in plan


def test_if_on_a_graph_input_of_unbound_value_runs_per_call():
    model = _if_model([], [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])])
    compiled = pf.compile(model, target="host", input_shapes={"x": (3, 4), "cond": ()})
    assert "= if %cond {" in compiled.dump("plan")   # the program branches
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    for value in (True, False):
        assert_matches_onnxruntime(model, {"x": x, "cond": np.array(value)}, compiled=compiled)


def test_if_on_a_computed_condition_takes_both_branches():
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["cond"])]
    model = _if_model(nodes, [])
    model.graph.initializer.append(helper.make_tensor("zero", F, [], [0.0]))
    compiled = pf.compile(model, target="host")
    for sign in (1.0, -1.0):
        x = (sign * np.abs(np.random.default_rng(2).standard_normal((3, 4)))).astype(np.float32)
        assert_matches_onnxruntime(model, {"x": x}, compiled=compiled)
    assert "= if %cond {" in compiled.dump("plan")


def _loop_model(trip_input: bool):
    """Loop: y += x * i for i < M, scan output y after each iteration, then Relu(y)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["x", "fi"], ["xi"]),
         helper.make_node("Add", ["y_in", "xi"], ["y_out"]),
         helper.make_node("Identity", ["y_out"], ["scan"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_in", F, [2, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_out", F, [2, 3]),
         helper.make_tensor_value_info("scan", F, [2, 3])])
    inputs = [helper.make_tensor_value_info("x", F, [2, 3]), helper.make_tensor_value_info("y0", F, [2, 3])]
    inits = []
    if trip_input:
        inputs.append(helper.make_tensor_value_info("M", TensorProto.INT64, []))
    else:
        inits.append(helper.make_tensor("M", TensorProto.INT64, [], [4]))
    nodes = [helper.make_node("Loop", ["M", "", "y0"], ["y", "ys"], body=body),
             helper.make_node("Relu", ["ys"], ["r"])]
    return _model(nodes, inputs, [helper.make_tensor_value_info("y", F, [2, 3]),
                                  helper.make_tensor_value_info("r", F, ["n", 2, 3])], inits)


def test_loop_with_a_constant_trip_count_unrolls():
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((2, 3)).astype(np.float32),
             "y0": rng.standard_normal((2, 3)).astype(np.float32)}
    model = _loop_model(trip_input=False)
    assert_matches_onnxruntime(model, feeds)   # (onnx's reference Loop misreads an empty cond)
    compiled = pf.compile(model, target="host")
    compiled.run(feeds)
    assert "then at run time" not in compiled.dump("plan")


def test_loop_with_a_trip_count_fed_at_run_time():
    rng = np.random.default_rng(4)
    model = _loop_model(trip_input=True)
    compiled = pf.compile(model, target="host")
    for m in (3, 6, 0):
        feeds = {"x": rng.standard_normal((2, 3)).astype(np.float32),
                 "y0": rng.standard_normal((2, 3)).astype(np.float32), "M": np.array(m, np.int64)}
        assert_matches_onnxruntime(model, feeds, compiled=compiled)


def test_while_loop_on_a_data_dependent_condition():
    """while sum(y) < limit: y = y * 2 (no trip count); the iterations made, as a scan."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["y_in", "two"], ["y_out"]),
         helper.make_node("ReduceSum", ["y_out"], ["s"], keepdims=0),
         helper.make_node("Less", ["s", "limit"], ["cond_out"]),
         helper.make_node("Identity", ["i"], ["count"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_in", F, [4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_out", F, [4]),
         helper.make_tensor_value_info("count", TensorProto.INT64, [])])
    nodes = [helper.make_node("ReduceSum", ["y0"], ["s0"], keepdims=0),
             helper.make_node("Less", ["s0", "limit"], ["go"]),
             helper.make_node("Loop", ["", "go", "y0"], ["y", "counts"], body=body)]
    model = _model(nodes, [helper.make_tensor_value_info("y0", F, [4]),
                           helper.make_tensor_value_info("limit", F, [])],
                   [helper.make_tensor_value_info("y", F, [4]),
                    helper.make_tensor_value_info("counts", TensorProto.INT64, ["n"])],
                   [helper.make_tensor("two", F, [], [2.0])])
    compiled = pf.compile(model, target="host")
    y0 = np.array([0.5, 1.0, 0.25, 0.25], np.float32)
    for limit in (10.0, 100.0, 1.0):
        assert_matches_onnxruntime(model, {"y0": y0, "limit": np.array(limit, np.float32)},
                                   compiled=compiled)


def _scan_model(reverse_in, out_axis, in_axis):
    """Two states (sum and running max) over rows of x, one scan output (the sum so far)."""
    body = helper.make_graph(
        [helper.make_node("Add", ["sum_in", "row"], ["sum_out"]),
         helper.make_node("Max", ["max_in", "row"], ["max_out"]),
         helper.make_node("Mul", ["sum_out", "max_out"], ["scan"])],
        "body",
        [helper.make_tensor_value_info(n, F, [3]) for n in ("sum_in", "max_in", "row")],
        [helper.make_tensor_value_info(n, F, [3]) for n in ("sum_out", "max_out", "scan")])
    node = helper.make_node("Scan", ["s0", "m0", "x"], ["s", "m", "z"], body=body, num_scan_inputs=1,
                            scan_input_directions=[reverse_in], scan_input_axes=[in_axis],
                            scan_output_axes=[out_axis])
    x_shape = [5, 3] if in_axis == 0 else [3, 5]
    return _model([node], [helper.make_tensor_value_info("s0", F, [3]),
                           helper.make_tensor_value_info("m0", F, [3]),
                           helper.make_tensor_value_info("x", F, x_shape)],
                  [helper.make_tensor_value_info(n, F, [3]) for n in ("s", "m")]
                  + [helper.make_tensor_value_info("z", F, ["a", "b"])]), x_shape


@pytest.mark.parametrize("reverse_in, out_axis, in_axis", [(0, 0, 0), (1, 1, 0), (0, -1, 1)])
def test_scan_with_two_states(reverse_in, out_axis, in_axis):
    model, x_shape = _scan_model(reverse_in, out_axis, in_axis)
    rng = np.random.default_rng(5)
    feeds = {"s0": np.zeros(3, np.float32), "m0": np.full(3, -np.inf, np.float32),
             "x": rng.standard_normal(x_shape).astype(np.float32)}
    if reverse_in or in_axis:   # onnx's reference Scan runs forward along axis 0 only
        assert_matches_onnxruntime(model, feeds)
    else:
        _check(model, feeds)


def test_opset8_scan_runs_per_batch_element():
    body = helper.make_graph([helper.make_node("Add", ["acc", "row"], ["acc_out"]),
                              helper.make_node("Mul", ["acc_out", "row"], ["out"])], "body",
                             [helper.make_tensor_value_info(n, F, [3]) for n in ("acc", "row")],
                             [helper.make_tensor_value_info(n, F, [3]) for n in ("acc_out", "out")])
    node = helper.make_node("Scan", ["", "s0", "x"], ["s", "z"], body=body, num_scan_inputs=1,
                            directions=[1])
    model = _model([node], [helper.make_tensor_value_info("s0", F, [2, 3]),
                            helper.make_tensor_value_info("x", F, [2, 4, 3])],
                   [helper.make_tensor_value_info("s", F, [2, 3]),
                    helper.make_tensor_value_info("z", F, [2, 4, 3])], opset=8)
    rng = np.random.default_rng(8)
    assert_matches_onnxruntime(model, {"s0": rng.standard_normal((2, 3)).astype(np.float32),
                                       "x": rng.standard_normal((2, 4, 3)).astype(np.float32)})


def test_loop_past_the_unroll_limit_runs_in_the_program():
    model = _loop_model(trip_input=False)
    model.graph.initializer[0].CopyFrom(helper.make_tensor("M", TensorProto.INT64, [], [300]))
    rng = np.random.default_rng(6)
    feeds = {"x": rng.standard_normal((2, 3)).astype(np.float32) * 1e-3,
             "y0": rng.standard_normal((2, 3)).astype(np.float32)}
    compiled = pf.compile(model, target="host")
    assert_matches_onnxruntime(model, feeds, compiled=compiled, rtol=1e-4)
    plan = compiled.dump("plan")
    assert "loop (%y: float32[2, 3]" in plan and "then at run time" not in plan


def _counter_model(trip: str, declared: list):
    """A Loop whose body declares its iteration number and condition of shape ``declared``
    ([] or [1]) and scans out the counter as float and the counter's Shape. ``trip``:
    "unrolled" (a constant 10, as Glow's loop_withoutN test model), "program" (a constant
    past the unroll limit) or "fed" (an input: the scans' length is the data's)."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["fi"], ["as_float"]),
         helper.make_node("Shape", ["i"], ["shape"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, declared),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, declared)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, declared),
         helper.make_tensor_value_info("as_float", F, declared),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [len(declared)])])
    count = {"unrolled": 10, "program": 300}.get(trip)
    inputs = [helper.make_tensor_value_info("x", F, [1])]
    inits = [helper.make_tensor("go", TensorProto.BOOL, declared, [True])]
    if count is None:
        inputs.append(helper.make_tensor_value_info("M", TensorProto.INT64, declared))
    else:
        inits.append(helper.make_tensor("M", TensorProto.INT64, declared, [count]))
    nodes = [helper.make_node("Identity", ["x"], ["y"]),
             helper.make_node("Loop", ["M", "go"], ["counts", "shapes"], body=body)]
    outputs = [helper.make_tensor_value_info("y", F, [1]),
               helper.make_tensor_value_info("counts", F, [count or "n", *declared]),
               helper.make_tensor_value_info("shapes", TensorProto.INT64, [count or "n", len(declared)])]
    model = _model(nodes, inputs, outputs, inits, opset=11)
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("declared", [[], [1]])
@pytest.mark.parametrize("trip", ["unrolled", "program", "fed"])
def test_loop_counter_and_condition_keep_the_shape_the_body_declares(trip, declared):
    model = _counter_model(trip, declared)
    compiled = pf.compile(model, target="host")
    for m in ((3, 1) if trip == "fed" else (None,)):
        feeds = {"x": np.array([0.5], np.float32)}
        if m is not None:
            feeds["M"] = np.array(m, np.int64).reshape(declared)
        assert_matches_onnxruntime(model, feeds, compiled=compiled)
    if trip == "fed" and declared:   # onnxruntime's [[1], [1], [1]]: the counter is [1]
        got = compiled.run({"x": np.array([0.5], np.float32), "M": np.array([3], np.int64)})
        np.testing.assert_array_equal(got["shapes"], [[1], [1], [1]])


@pytest.mark.unit
def test_loop_counter_of_another_shape_is_refused():
    model = _counter_model("unrolled", [1])
    model.graph.node[1].attribute[0].g.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    with pytest.raises(ModelError, match="iteration number 'i' is declared int64"):
        pf.compile(model, target="host").run({"x": np.array([0.5], np.float32)})


def test_torch_scripted_loop_and_if_match_onnxruntime(tmp_path):
    torch = pytest.importorskip("torch")

    @torch.jit.script
    def f(x: torch.Tensor, n: int) -> torch.Tensor:
        for i in range(n):
            if bool(x.sum() > 0):
                x = x * 0.5 - 1.0
            else:
                x = x + float(i)
        return x

    class M(torch.nn.Module):
        def forward(self, x, n):
            return f(x, n)

    path = tmp_path / "scripted.onnx"
    torch.onnx.export(torch.jit.script(M()), (torch.ones(2, 3), torch.tensor(3)), str(path),
                      input_names=["x", "n"], output_names=["y"], dynamo=False)
    model = onnx.load(str(path))
    ops = {n.op_type for n in model.graph.node}
    assert "Loop" in ops
    compiled = pf.compile(model, target="host")
    rng = np.random.default_rng(7)
    for n in (0, 2, 5):
        feeds = {"x": rng.standard_normal((2, 3)).astype(np.float32) * 4, "n": np.array(n, np.int64)}
        assert_matches_onnxruntime(model, feeds, compiled=compiled, rtol=1e-5)


@pytest.mark.unit
def test_malformed_body_is_refused_naming_the_node():
    model = _loop_model(trip_input=False)
    body = model.graph.node[0].attribute[0].g
    del body.output[2]   # a scan output fewer than the node's outputs
    with pytest.raises(ModelError, match="Loop"):
        pf.compile(model, target="host")


@pytest.mark.unit
def test_unsupported_op_in_a_body_is_listed():
    then = _branch("then", helper.make_node("Mul", ["x", "two"], ["t"]), "t", [3, 4])
    other = _branch("else", helper.make_node("MyOp", ["x"], ["e"], domain="custom"), "e", [3, 4])
    model = _model([helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)],
                   [helper.make_tensor_value_info("x", F, [3, 4]),
                    helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                   [helper.make_tensor_value_info("y", F, [3, 4])],
                   [helper.make_tensor("two", F, [], [2.0])])
    model.opset_import.append(helper.make_opsetid("custom", 1))
    with pytest.raises(UnsupportedOpError, match="custom.MyOp"):
        pf.compile(model, target="host")


@pytest.mark.unit
def test_graphs_with_subgraphs_print_and_parse_back():
    from polyfuse.frontends.graph_text import parse_graph
    from polyfuse.frontends.onnx import to_graph
    big = np.arange(40, dtype=np.float32).reshape(2, 20)   # printed as a digest
    model = _loop_model(trip_input=True)
    model.graph.node[0].attribute[0].g.initializer.append(onnx.numpy_helper.from_array(big, "w"))
    g = to_graph(model)
    text = str(g)
    assert "captures(%x)" in text and "body=graph body(" in text
    assert parse_graph(text, g) == g


@pytest.mark.unit
def test_loop_that_never_ends_is_refused():
    model = _loop_model(trip_input=False)
    model.graph.node[0].input[0] = ""   # no trip count; the condition passes through, true
    del model.graph.initializer[0]
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ModelError, match="never ends"):
        pf.compile(model, target="host").run({"x": x, "y0": x})


@pytest.mark.unit
def test_if_on_a_condition_of_several_elements_is_refused():
    model = _if_model([], [helper.make_tensor_value_info("cond", TensorProto.BOOL, [2])])
    compiled = pf.compile(model, target="host")
    with pytest.raises(ModelError, match="condition has 2 elements"):
        compiled.run({"x": np.ones((3, 4), np.float32), "cond": np.array([True, False])})
