"""Hostile and careless ONNX input: bad attributes, inputs and dtypes, huge or negative
sizes, wrong feeds, exporters' unknown dimensions and very long graphs all end in a
polyfuse error that names the node (or run as onnxruntime runs them)."""

import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from polyfuse.frontends.graph_text import parse_graph
from polyfuse.frontends.tc import parse
from polyfuse.ir.comprehension_interpreter import interpret
from polyfuse.ir.limits import MAX_EXPR_DEPTH, expr_depth
from polyfuse.ir.sizes import bind_sizes
from polyfuse.lowering.compose import Member, compose, inline_pointwise
from polyfuse.lowering.graph_passes import PassManager
from polyfuse.driver import compile_graph
from polyfuse.targets import Target
from tests.onnx.ort_compare import assert_matches_onnxruntime

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def value(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def one_node(op, shapes, attrs=None, constants=None, outputs=1, dtypes=None, opset=17):
    """A model of one node named 'n' over inputs x0, x1, ... (``constants`` gives some
    of them as initializers) and its feed."""
    constants = constants or {}
    dtypes = dtypes or {}
    names = [f"x{k}" for k in range(len(shapes) + len(constants))]
    rng = np.random.default_rng(0)
    inputs, feed = [], {}
    for k, shape in enumerate(shapes):
        dt = dtypes.get(k, F)
        inputs.append(value(names[k], list(shape), dt))
        np_dt = {F: np.float32, I64: np.int64, TensorProto.INT32: np.int32}[dt]
        feed[names[k]] = rng.integers(0, 2, shape).astype(np_dt)
    inits = [numpy_helper.from_array(np.asarray(a), names[k]) for k, a in constants.items()]
    outs = [f"y{k}" for k in range(outputs)]
    node = helper.make_node(op, names, outs, name="n", **(attrs or {}))
    return model([node], inputs, [value(o, []) for o in outs], inits, opset), feed


def run(m, feed, target="reference"):
    return pf.compile(m, target=target).run(feed)


# --- attributes checked against the input ranks and shapes ------------------------------

BAD_ATTRIBUTES = {
    "concat_axis": ("Concat", [(2, 3), (2, 3)], {"axis": 5}, {},
                    r"node 'n' \(Concat\): axis 5 is out of range for rank 2; it must be in \[-2, 1\]"),
    "concat_shapes": ("Concat", [(2, 3), (3, 3)], {"axis": 1}, {},
                      r"input 1 has shape \(3, 3\) but input 0 has shape \(2, 3\)"),
    "split_axis": ("Split", [(4, 2)], {"axis": -3}, {}, r"axis -3 is out of range for rank 2"),
    "gather_axis": ("Gather", [(4, 2)], {"axis": 2}, {1: np.array([0], np.int64)},
                    r"\(Gather\): axis 2 is out of range"),
    "softmax_axis": ("Softmax", [(4, 2)], {"axis": 9}, {}, r"axis 9 is out of range for rank 2"),
    "flatten_axis": ("Flatten", [(4, 2)], {"axis": 3}, {}, r"it must be in \[-2, 2\]"),
    "transpose_perm": ("Transpose", [(4, 2, 3)], {"perm": [0, 0, 1]}, {}, r"perm .* name an axis twice"),
    "transpose_short_perm": ("Transpose", [(4, 2, 3)], {"perm": [1, 0]}, {}, r"each of the 3 axes"),
    "squeeze_axes": ("Squeeze", [(4, 1)], {}, {1: np.array([4], np.int64)}, r"axes 4 is out of range"),
    "unsqueeze_axes": ("Unsqueeze", [(4,)], {}, {1: np.array([-5], np.int64)}, r"axes -5 is out of range"),
    "reduce_axes": ("ReduceSum", [(4, 2)], {}, {1: np.array([2], np.int64)}, r"axes 2 is out of range"),
    "reduce_repeated": ("ReduceMax", [(4, 2)], {"axes": [1, -1]}, {}, r"name an axis twice"),
    "argmax_axis": ("ArgMax", [(4, 2)], {"axis": -3}, {}, r"\(ArgMax\): axis -3"),
    "slice_axes": ("Slice", [(4, 2)], {}, {1: np.array([0], np.int64), 2: np.array([1], np.int64),
                                            3: np.array([7], np.int64)}, r"axes 7 is out of range"),
    "slice_lengths": ("Slice", [(4, 2)], {}, {1: np.array([0, 0], np.int64),
                                              2: np.array([1], np.int64)}, r"one entry per sliced axis"),
    "pad_count": ("Pad", [(4, 2)], {}, {1: np.array([1, 1, 1], np.int64)}, r"3 pads for 2 axes"),
    "conv_stride": ("Conv", [(1, 1, 5, 5)], {"strides": [0, 1]},
                    {1: np.ones((1, 1, 3, 3), np.float32)}, r"strides \[0, 1\] must all be >= 1"),
    "conv_group": ("Conv", [(1, 2, 5, 5)], {"group": 0},
                   {1: np.ones((2, 2, 3, 3), np.float32)}, r"group \[0\] must all be >= 1"),
    "conv_rank": ("Conv", [(2, 5)], {}, {1: np.ones((1, 1, 3), np.float32)}, r"rank 2 .* at least 3"),
    "conv_bias": ("Conv", [(1, 1, 5, 5)], {}, {1: np.ones((2, 1, 3, 3), np.float32),
                                               2: np.ones(3, np.float32)}, r"bias has shape \(3,\)"),
    "maxpool_kernel": ("MaxPool", [(1, 1, 5, 5)], {"kernel_shape": [0, 2]}, {},
                       r"kernel_shape \[0, 2\] must all be >= 1"),
    "topk_axis": ("TopK", [(4, 2)], {"axis": 2}, {1: np.array([1], np.int64)}, r"axis 2 is out of range"),
    "cumsum_axis": ("CumSum", [(4, 2)], {}, {1: np.array(-3, np.int64)}, r"axis -3 is out of range"),
    "gather_nd_batch": ("GatherND", [(4, 2)], {"batch_dims": -1}, {1: np.zeros((1, 1), np.int64)},
                        r"batch_dims \[-1\] must all be >= 0"),
    "depth_to_space_block": ("DepthToSpace", [(1, 4, 2, 2)], {"blocksize": 0}, {},
                             r"blocksize \[0\] must all be >= 1"),
    "layer_norm_axis": ("LayerNormalization", [(4, 2)], {"axis": 2}, {1: np.ones(2, np.float32)},
                        r"axis 2 is out of range"),
    "one_hot_depth": ("OneHot", [], {}, {0: np.array([1, 2], np.int64), 1: np.array(-2, np.int64),
                                         2: np.array([0, 1], np.float32)}, r"depth \[-2\]"),
    "range_delta": ("Range", [], {}, {0: np.array(0, np.int64), 1: np.array(5, np.int64),
                                      2: np.array(0, np.int64)}, r"delta must not be 0"),
    "keepdims_not_a_flag": ("ReduceSum", [(4, 2)], {"keepdims": 7}, {},
                            r"attribute keepdims is 7; it must be 0 or 1"),
    "matmul_inner": ("MatMul", [(4, 2), (3, 5)], {}, {}, r"A's last dimension \(2\) must equal"),
    "gemm_inner": ("Gemm", [(4, 2), (4, 5)], {"transA": 0}, {}, r"inner dimensions differ"),
    "lp_pool_p": ("LpPool", [(1, 1, 4, 4)], {"kernel_shape": [2, 2], "p": 0}, {},
                  r"p = 0.0 must be a positive finite number"),
    "einsum_rank": ("Einsum", [(4, 2), (2,)], {"equation": "ij,jk->ik"}, {},
                    r"operand 1 has subscripts 'jk'"),
    "batch_norm_params": ("BatchNormalization", [(2, 3, 4)],
                          {}, {k: np.ones(4 if k == 3 else 3, np.float32) for k in range(1, 5)},
                          r"input 3 has shape \(4,\); it must have shape \(3,\)"),
    "resize_scales": ("Resize", [(1, 1, 2, 2)], {},
                      {1: np.zeros(0, np.float32), 2: np.array([1, 1, -2, 2], np.float32)},
                      r"scales .* must be finite and > 0"),
}


@pytest.mark.unit
@pytest.mark.parametrize("case", list(BAD_ATTRIBUTES.values()), ids=list(BAD_ATTRIBUTES))
def test_a_bad_attribute_is_a_model_error_naming_the_node(case):
    op, shapes, attrs, constants, message = case
    m, feed = one_node(op, shapes, attrs, constants, outputs=2 if op == "TopK" else 1)
    with pytest.raises(pf.ModelError, match=message) as err:
        run(m, feed)
    assert f"node 'n' ({op}" in str(err.value)


@pytest.mark.unit
def test_empty_squeeze_axes_remove_every_size_1_dimension_as_onnxruntime_does():
    m, feed = one_node("Squeeze", [(2, 1, 3, 1)], constants={1: np.zeros(0, np.int64)})
    assert_matches_onnxruntime(m, feed, target="reference")


@pytest.mark.unit
def test_inputs_sharing_a_type_must_share_a_dtype():
    m, feed = one_node("Add", [(2, 3), (2, 3)], dtypes={1: TensorProto.INT32})
    with pytest.raises(pf.DTypeError, match=r"node 'n' \(Add-14\): input 1 \('x1'\) is int32 but "
                                            r"input 0 \('x0'\) is float32.*insert a Cast"):
        run(m, feed)


@pytest.mark.unit
def test_an_input_of_a_type_the_op_does_not_take_is_a_dtype_error():
    m, feed = one_node("Gather", [(4, 2), (3,)])   # float indices
    with pytest.raises(pf.DTypeError, match=r"input 1 \('x1', indices\) is float32; it takes "
                                            r"int32, int64"):
        run(m, feed)


@pytest.mark.unit
def test_a_missing_required_input_is_a_model_error():
    m, feed = one_node("Gemm", [(2, 3)])
    m.graph.node[0].input.append("")      # B given as "": omitted, but it is required
    with pytest.raises(pf.ModelError, match=r"input 1 is marked single but has an empty string"):
        run(m, feed)
    x = np.ones((2, 3), np.float32)
    for args, message in (("%x, _", r"node 'n' \(Gemm-13\) lacks its required input 1 \('B'\)"),
                          ("%x", r"node 'n' \(Gemm-13\) has 1 inputs; it takes 2 to 3 \(A, B, C\)")):
        g = parse_graph(f"graph g(%x: float32[2, 3]) -> (%y: float32[2, 3]) opset 17 {{\n"
                        f"  %y = Gemm({args})  # n\n}}")
        with pytest.raises(pf.ModelError, match=message):
            compile_graph(g, Target.parse("reference")).run({"x": x})


# --- sizes checked before anything is allocated -----------------------------------------

HUGE = np.array([1 << 14, 1 << 14, 1 << 12], np.int64)     # 2^40 elements


@pytest.mark.unit
@pytest.mark.parametrize("target", ["reference", "host"])
def test_a_huge_constant_of_shape_is_a_size_limit_error(target):
    m, feed = one_node("ConstantOfShape", [], constants={0: HUGE})
    with pytest.raises(pf.SizeLimitError, match=r"value 'y0' of node 'n' \(ConstantOfShape\) would "
                                                r"have shape \(16384, 16384, 4096\) \(float32\): "
                                                r"4398046511104 bytes .*POLYFUSE_MAX_TENSOR_BYTES"):
        run(m, feed, target)


def test_a_huge_expand_with_its_shape_fed_at_run_time_is_a_size_limit_error():
    x = value("x", [1])
    s = value("s", [3], I64)
    m = model([helper.make_node("Expand", ["x", "s"], ["y"], name="grow")], [x, s], [value("y", [])])
    compiled = pf.compile(m, target="host")
    feed = {"x": np.ones(1, np.float32)}
    np.testing.assert_array_equal(compiled.run(feed | {"s": np.array([2, 1, 3])})["y"],
                                  np.ones((2, 1, 3), np.float32))
    with pytest.raises(pf.SizeLimitError, match=r"node 'grow' \(Expand\)") as err:
        compiled.run(feed | {"s": HUGE})
    assert isinstance(err.value, MemoryError)


@pytest.mark.unit
@pytest.mark.parametrize("op, constants", [
    ("Tile", {1: np.array([1 << 20, 1 << 20], np.int64)}),
    ("Pad", {1: np.array([0, 0, 1 << 20, 1 << 20], np.int64)}),
    ("Reshape", {1: np.array([-1], np.int64)}),      # fine: the same size
], ids=["tile", "pad", "reshape"])
def test_sizes_computed_from_data_are_checked(op, constants):
    m, feed = one_node(op, [(2, 2)], constants=constants)
    if op == "Reshape":
        np.testing.assert_array_equal(run(m, feed)["y0"], feed["x0"].reshape(-1))
        return
    with pytest.raises(pf.SizeLimitError, match=rf"node 'n' \({op}\)"):
        run(m, feed)


@pytest.mark.unit
@pytest.mark.parametrize("op, shapes, constants", [
    ("Range", [], {0: np.array(0, np.int64), 1: np.array(1 << 40, np.int64),
                   2: np.array(1, np.int64)}),
    ("Resize", [(1, 1, 2, 2)], {1: np.zeros(0, np.float32),
                                2: np.array([1, 1, 1 << 20, 1 << 20], np.float32)}),
    ("OneHot", [], {0: np.arange(1 << 10, dtype=np.int64), 1: np.array(1 << 30, np.int64),
                    2: np.array([0, 1], np.float32)}),
], ids=["range", "resize", "one_hot"])
def test_generated_sizes_are_checked(op, shapes, constants):
    m, feed = one_node(op, shapes, constants=constants)
    with pytest.raises(pf.SizeLimitError, match=rf"value 'y0' of node 'n' \({op}\) would have shape"):
        run(m, feed)


@pytest.mark.unit
def test_the_size_limit_is_set_by_an_environment_variable(monkeypatch):
    m, feed = one_node("Relu", [(16, 16)])
    monkeypatch.setenv("POLYFUSE_MAX_TENSOR_BYTES", "1000")
    with pytest.raises(pf.SizeLimitError, match=r"\(16, 16\) \(float32\): 1024 bytes .*limit of "
                                                r"1000 bytes"):
        run(m, feed)
    monkeypatch.setenv("POLYFUSE_MAX_TENSOR_BYTES", "1024")
    np.testing.assert_array_equal(run(m, feed)["y0"], np.maximum(feed["x0"], 0))
    monkeypatch.setenv("POLYFUSE_MAX_TENSOR_BYTES", "lots")
    with pytest.raises(pf.PolyfuseError, match="POLYFUSE_MAX_TENSOR_BYTES='lots' is not a number "
                                               "of bytes; set it to e.g. 8e9 or unset it"):
        run(m, feed)


@pytest.mark.unit
@pytest.mark.parametrize("op, constants, message", [
    ("ConstantOfShape", {0: np.array([-3, 4], np.int64)}, r"the shape \[-3, 4\] must all be >= 0"),
    ("Expand", {1: np.array([2, -1], np.int64)}, r"the shape \[2, -1\] must all be >= 0"),
    ("Tile", {1: np.array([1, -2], np.int64)}, r"repeats \[1, -2\] must all be >= 0"),
    ("Reshape", {1: np.array([-2, 2], np.int64)}, r"target shape \[-2, 2\] must all be >= -1"),
], ids=["constant_of_shape", "expand", "tile", "reshape"])
def test_negative_sizes_from_data_are_model_errors(op, constants, message):
    m, feed = one_node(op, [] if op == "ConstantOfShape" else [(2, 2)], constants=constants)
    with pytest.raises(pf.ModelError, match=message):
        run(m, feed)


# --- the model's call paths ---------------------------------------------------------------

@pytest.fixture(scope="module")
def add_model():
    m = model([helper.make_node("Add", ["a", "b"], ["y"], name="add")],
              [value("a", ["N", 3]), value("b", [3])], [value("y", ["N", 3])])
    return pf.compile(m, target="host")


@pytest.mark.unit
def test_run_with_an_array_instead_of_a_dict_says_what_to_pass(add_model):
    a = np.ones((2, 3), np.float32)
    for wrong in (a, [a, a[0]], (a,), None, "a"):
        with pytest.raises(pf.ArgumentError, match=r"run takes a dict \{input name: array\}, got "
                                                   r".*'a' float32 \('N', 3\), 'b' float32 \(3,\)"):
            add_model.run(wrong)


def test_feeds_with_wrong_names_dtypes_ranks_or_kinds(add_model):
    a, b = np.ones((2, 3), np.float32), np.arange(3, dtype=np.float32)
    with pytest.raises(pf.ArgumentError, match=r"missing: \['b'\]"):
        add_model.run({"a": a})
    with pytest.raises(pf.ArgumentError, match=r"unknown: \['c'\]"):
        add_model.run({"a": a, "b": b, "c": b})
    with pytest.raises(pf.ArgumentError, match=r"unknown: \['1'\]"):
        add_model.run({"a": a, "b": b, 1: b})
    with pytest.raises(pf.DTypeError, match=r"'b' must be float32, got float64; .*astype"):
        add_model.run({"a": a, "b": b.astype(np.float64)})
    with pytest.raises(pf.ShapeError, match=r"'a' must have shape \('N', 3\), got \(3,\)"):
        add_model.run({"a": b, "b": b})
    with pytest.raises(pf.ShapeError, match=r"'b' must have shape \(3,\), got \(4,\)"):
        add_model.run({"a": a, "b": np.ones(4, np.float32)})
    with pytest.raises(pf.ArgumentError, match=r"'a' must be a numpy array, got list"):
        add_model.run({"a": a.tolist(), "b": b})
    with pytest.raises(pf.ArgumentError, match=r"takes 2 inputs \(a, b\), got 1"):
        add_model(a)
    with pytest.raises(pf.ArgumentError, match=r"all in order or all by name"):
        add_model(a, b=b)
    np.testing.assert_array_equal(add_model(a=a, b=b), a + b)
    np.testing.assert_array_equal(add_model(a, b), a + b)


@pytest.mark.unit
def test_shape_arguments_are_checked(add_model):
    with pytest.raises(pf.ArgumentError, match=r"missing \['b'\]"):
        add_model.tasks(a=(2, 3))
    with pytest.raises(pf.ShapeError, match=r"input 'a' must be a tuple of sizes"):
        add_model.memory_plan(a=(2, -3), b=(3,))
    with pytest.raises(pf.ArgumentError, match=r"positive int"):
        add_model.profile({"a": np.ones((1, 3), np.float32), "b": np.ones(3, np.float32)}, repeat=0)
    with pytest.raises(pf.ShapeError, match=r"must be a dict"):
        pf.compile(model([helper.make_node("Relu", ["x"], ["y"])], [value("x", [2])],
                         [value("y", [2])]), input_shapes=[(2,)])


# --- unknown dimensions as exporters write them ---------------------------------------------

@pytest.mark.parametrize("shape, feed_shape", [
    (["?", 3, "?", "?"], (2, 3, 48, 192)),     # several dims all named '?'
    ([-1, 4], (5, 4)),                          # paddle2onnx's dim_value -1
    (["", "", 3], (2, 7, 3)),                   # empty names
], ids=["question_marks", "minus_one", "empty_names"])
def test_unknown_dims_are_each_their_own_size(shape, feed_shape):
    m = model([helper.make_node("Relu", ["x"], ["r"]),
               helper.make_node("ReduceSum", ["r"], ["y"], keepdims=0)],
              [value("x", shape)], [value("y", [])])
    feed = {"x": np.random.default_rng(0).standard_normal(feed_shape).astype(np.float32)}
    assert_matches_onnxruntime(m, feed, rtol=1e-4, atol=1e-4)


CRASHES_ONNX_INFERENCE = """
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import polyfuse as pf

def ints(name, v):
    return numpy_helper.from_array(np.array(v, np.int64), name)

def model(node, x, inits):
    g = helper.make_graph([node], "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])

# a Slice of a dim_value -1 dimension: onnx's shape inference aborts on it
m = model(helper.make_node("Slice", ["x", "s", "e", "a"], ["y"]),
          helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 4]),
          [ints("s", [3]), ints("e", [4]), ints("a", [-2])])
x = np.arange(20, dtype=np.float32).reshape(5, 4)
np.testing.assert_array_equal(pf.compile(m, target="reference").run({"x": x})["y"], x[3:4])
# a GatherND with negative batch_dims: onnx's shape inference segfaults on it
m = model(helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=-1),
          helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2]), [ints("i", [[0]])])
try:
    pf.compile(m, target="reference").run({"x": x[:4, :2]})
except pf.ModelError as err:
    assert "batch_dims [-1] must all be >= 0" in str(err), err
else:
    raise AssertionError("no error")
print("survived")
"""


def test_models_that_crash_onnx_shape_inference_get_polyfuse_answers():
    # in a child: a regression would abort the process, not just fail the test
    child = subprocess.run([sys.executable, "-c", CRASHES_ONNX_INFERENCE], capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == 0 and child.stdout.strip() == "survived", child.stderr[-2000:]


@pytest.mark.unit
def test_a_graph_output_declared_with_another_dtype_is_a_model_error():
    m = model([helper.make_node("Relu", ["x"], ["y"], name="act")], [value("x", [2])],
              [value("y", [2], TensorProto.DOUBLE)])
    with pytest.raises(pf.ModelError, match=r"graph output 'y' is declared float64, but the model "
                                            r"computes it as float32"):
        run(m, {"x": np.ones(2, np.float32)})


def test_dims_with_neither_value_nor_name_are_independent():
    x = value("x", [2, 3])
    for dim in x.type.tensor_type.shape.dim:
        dim.Clear()
    m = model([helper.make_node("Neg", ["x"], ["y"])], [x], [value("y", [])])
    feed = {"x": np.ones((4, 9), np.float32)}
    assert_matches_onnxruntime(m, feed)


# --- long graphs -------------------------------------------------------------------------------

def chain(n, step):
    """``n`` nodes in a row, node k made by ``step(k, previous value)``."""
    nodes, prev = [], "x"
    for k in range(n):
        nodes.append(step(k, prev))
        prev = nodes[-1].output[0]
    return model(nodes, [value("x", [4, 8])], [value(prev, [4, 8])])


def test_a_chain_of_1000_elementwise_ops_matches_onnxruntime():
    ops = ["Relu", "Add", "Mul", "Neg", "Sigmoid", "Abs"]

    def step(k, prev):
        op = ops[k % len(ops)]
        inputs = [prev, "x"] if op in ("Add", "Mul") else [prev]
        return helper.make_node(op, inputs, [f"v{k}"], name=f"n{k}")
    feed = {"x": (np.random.default_rng(0).standard_normal((4, 8)) * 0.1).astype(np.float32)}
    assert_matches_onnxruntime(chain(1000, step), feed, rtol=1e-4, atol=1e-6)


def test_a_chain_of_300_adds_reusing_the_input_matches_onnxruntime():
    m = chain(300, lambda k, prev: helper.make_node("Add", [prev, "x"], [f"v{k}"], name=f"n{k}"))
    m.graph.node[0].input[0] = "x"      # x + x, then + x each time
    feed = {"x": np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)}
    assert_matches_onnxruntime(m, feed, rtol=1e-5, atol=1e-4)


@pytest.mark.unit
def test_graph_passes_on_a_chain_of_5000_nodes():
    m = chain(5000, lambda k, prev: helper.make_node("Identity" if k % 2 else "Relu", [prev],
                                                     [f"v{k}"], name=f"n{k}"))
    from polyfuse.frontends.onnx import to_graph
    g = PassManager().run(to_graph(m))
    assert [n.op for n in g.nodes] == ["Relu"] * 2500 + ["Identity"]  # but the output's go
    assert len({n.group for n in g.nodes}) > 1            # and the relus fuse in groups


def test_composing_stops_inlining_before_the_expression_gets_too_deep():
    steps = 3 * MAX_EXPR_DEPTH
    members = []
    for k in range(steps):
        d = bind_sizes(parse("def f(float(N) A, float(N) X) -> (B) { B(i) = A(i) + X(i) }")
                       .definitions[0], {"N": 4})
        members.append(Member(d, ("x" if k == 0 else f"v{k - 1}", "x"), (f"v{k}",)))
    composed = compose("fused", members, {f"v{steps - 1}"})
    d = inline_pointwise(composed.definition, composed.exports)
    assert max(expr_depth(s.rhs) for s in d.statements) <= MAX_EXPR_DEPTH
    assert 2 < len(d.statements) < steps
    x = np.arange(4, dtype=np.float32)
    out = interpret(d, {d.params[0].name: x}, {})
    np.testing.assert_allclose(out[d.outputs[0].name], x * (steps + 1))


def test_sum_of_300_inputs_is_a_shallow_expression():
    names = [f"x{k}" for k in range(300)]
    m = model([helper.make_node("Sum", names, ["y"], name="total")],
              [value(n, [3]) for n in names], [value("y", [3])])
    rng = np.random.default_rng(2)
    feed = {n: rng.standard_normal(3).astype(np.float32) for n in names}
    want = np.sum(np.stack(list(feed.values())).astype(np.float64), axis=0)
    np.testing.assert_allclose(run(m, feed, "host")["y"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.unit
def test_element_type_attributes_become_dtypes_in_the_front_end():
    """Cast's `to` and EyeLike's `dtype` are ONNX codes in the model and dtype names in the
    graph IR; a code polyfuse has no dtype for is listed with the other unsupported ops."""
    from onnx import TensorProto, helper
    from polyfuse.frontends.onnx import to_graph
    from polyfuse.lowering.ops import OPS

    def model(*nodes):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
        y = helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2, 2])
        return helper.make_model(helper.make_graph(list(nodes), "g", [x], [y]),
                                 opset_imports=[helper.make_opsetid("", 18)])
    m = model(helper.make_node("Cast", ["x"], ["c"], to=TensorProto.INT32, name="cast"),
              helper.make_node("EyeLike", ["c"], ["y"], dtype=TensorProto.DOUBLE, name="eye"))
    g = to_graph(m, set(OPS))
    assert [n.attr("to") for n in g.nodes][:1] == ["int32"] and g.nodes[1].attr("dtype") == "float64"
    out = pf.compile(m)(np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(out, np.eye(2))
    assert out.dtype == np.float64
    bad = model(helper.make_node("Cast", ["x"], ["c"], to=TensorProto.STRING, name="to_text"),
                helper.make_node("StringNormalizer", ["c"], ["y"], name="norm"))
    with pytest.raises(pf.UnsupportedOpError, match=r"2 op types .*Cast to element type STRING "
                                                    r"\(nodes: to_text\)"):
        pf.compile(bad)
