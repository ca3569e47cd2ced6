"""Ops whose output sizes the data decides (NonZero, Compress, Unique) and a TopK whose k
the graph computes: kernels at a bound size and a count, cut by the runtime, against
onnxruntime and onnx's reference evaluator."""

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import polyfuse as pf
from polyfuse.errors import UnsupportedOpError
from polyfuse.lowering.ops.counted import COUNT_MAX, POSITIONS_MAX
from tests.onnx.ort_compare import assert_matches_onnxruntime, one_node_model

I64 = TensorProto.INT64
F = TensorProto.FLOAT
RNG = np.random.default_rng(7)


def _sparse(shape, density=0.4, dtype=np.float32):
    return (RNG.standard_normal(shape) * (RNG.random(shape) < density)).astype(dtype)


def _check(model, feeds, reference=True):
    assert_matches_onnxruntime(model, feeds)
    if reference:
        want = ReferenceEvaluator(model).run(None, feeds)
        got = pf.compile(model, target="host").run(feeds)
        for value, expected in zip(model.graph.output, want):
            np.testing.assert_array_equal(got[value.name], expected, err_msg=value.name)


@pytest.mark.parametrize("x", [_sparse((3, 5)), _sparse((2, 3, 4), 0.2), np.zeros((4, 3), np.float32),
                               _sparse((7,)), (RNG.random((3, 4)) < 0.5), RNG.integers(-1, 2, (2, 6))],
                         ids=["2d", "3d", "all-zero", "1d", "bool", "int64"])
def test_non_zero(x):
    node = helper.make_node("NonZero", ["x"], ["y"])
    _check(one_node_model(node, {"x": x}, {"y": I64}), {"x": x})


@pytest.mark.parametrize("axis,length", [(None, 12), (None, 5), (0, 4), (1, 3), (-1, 5), (2, 2)])
def test_compress(axis, length):
    x = RNG.standard_normal((4, 3, 5)).astype(np.float32)
    if axis is None:
        x = x[:2, :2, :3]
    for cond in (RNG.random(length) < 0.5, np.zeros(length, bool), np.ones(length, bool)):
        attrs = {} if axis is None else {"axis": axis}
        node = helper.make_node("Compress", ["x", "c"], ["y"], **attrs)
        _check(one_node_model(node, {"x": x, "c": cond}, {"y": F}), {"x": x, "c": cond})


def _unique_model(x, axis, ordered, outputs=4):
    names = ["y", "indices", "inverse", "counts"][:outputs]
    attrs = {"sorted": ordered} | ({} if axis is None else {"axis": axis})
    node = helper.make_node("Unique", ["x"], names, **attrs)
    dtype = helper.np_dtype_to_tensor_dtype(x.dtype)
    return one_node_model(node, {"x": x}, {n: dtype if n == "y" else I64 for n in names})


@pytest.mark.parametrize("ordered", [0, 1])
@pytest.mark.parametrize("shape,axis", [((12,), None), ((3, 4), None), ((6, 3), 0), ((3, 6), 1),
                                        ((2, 5, 2), -2)])
def test_unique(shape, axis, ordered):
    x = RNG.integers(0, 3, shape).astype(np.float32)
    if axis is not None:   # repeat some slices so that slices, not only elements, repeat
        x = np.take(x, RNG.integers(0, 3, shape[axis]), axis=axis)
    # the reference evaluator takes the unsorted slices along axis 0 of the input, not
    # of the flattened input or along the axis given: only onnxruntime judges those
    flat_or_first = axis in (None, 0) and (ordered or len(shape) == 1 or axis == 0)
    _check(_unique_model(x, axis, ordered), {"x": x}, reference=flat_or_first)


@pytest.mark.unit
@pytest.mark.parametrize("outputs", [1, 2, 3])
def test_unique_fewer_outputs_and_nan(outputs):
    x = np.array([2.0, np.nan, -1.0, 2.0, np.nan, 0.5], np.float32)
    got = pf.compile(_unique_model(x, None, 1, outputs)).run({"x": x})
    want = np.unique(x, return_index=True, return_inverse=True)
    for value, expected in zip(["y", "indices", "inverse"][:outputs], want):
        np.testing.assert_array_equal(got[value], expected)


def _mid_graph_model():
    """NonZero in the middle: the sum of the nonzero elements, gathered by their indices."""
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Transpose", ["nz"], ["t"]),
             helper.make_node("GatherND", ["x", "t"], ["g"]),
             helper.make_node("ReduceSum", ["g"], ["s"], keepdims=0),
             helper.make_node("Mul", ["g", "g"], ["sq"])]
    graph = helper.make_graph(nodes, "mid", [helper.make_tensor_value_info("x", F, [4, 5])],
                              [helper.make_tensor_value_info("s", F, []),
                               helper.make_tensor_value_info("sq", F, [None])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_data_dependent_op_in_the_middle():
    model = _mid_graph_model()
    compiled = pf.compile(model, target="host")
    for x in (_sparse((4, 5)), _sparse((4, 5), 0.9), np.zeros((4, 5), np.float32)):
        assert_matches_onnxruntime(model, {"x": x}, compiled=compiled)
    assert "NonZero" in compiled.dump("plan") and "cut to their counts" in compiled.dump("plan")


def test_top_k_with_k_computed_from_data():
    """k = the number of positive elements: the rest is planned once it is known."""
    nodes = [helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", F, [], [0.0])),
             helper.make_node("Greater", ["x", "zero"], ["pos"]),
             helper.make_node("Cast", ["pos"], ["posi"], to=I64),
             helper.make_node("ReduceSum", ["posi"], ["k"], keepdims=1),
             helper.make_node("TopK", ["x", "k"], ["v", "i"]), helper.make_node("Relu", ["v"], ["r"])]
    graph = helper.make_graph(nodes, "topk", [helper.make_tensor_value_info("x", F, [9])],
                              [helper.make_tensor_value_info("r", F, [None]),
                               helper.make_tensor_value_info("i", I64, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = pf.compile(model, target="host")
    for x in (RNG.standard_normal(9).astype(np.float32), -np.ones(9, np.float32)):
        assert_matches_onnxruntime(model, {"x": x}, compiled=compiled)


def test_range_to_a_limit_computed_from_data():
    """Range(0, int(max(x))) squared: Range's limit is known only when the model runs."""
    nodes = [helper.make_node("ReduceMax", ["x"], ["top"], keepdims=0),
             helper.make_node("Cast", ["top"], ["n"], to=I64),
             helper.make_node("Range", ["zero", "n", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=F), helper.make_node("Mul", ["rf", "rf"], ["y"])]
    graph = helper.make_graph(nodes, "range", [helper.make_tensor_value_info("x", F, [4])],
                              [helper.make_tensor_value_info("y", F, [None])],
                              [helper.make_tensor("zero", I64, [], [0]), helper.make_tensor("one", I64, [], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = pf.compile(model, target="host")
    for top in (3.5, 7.2, -1.0):
        assert_matches_onnxruntime(model, {"x": np.array([top, 1, 0, -2], np.float32)}, compiled=compiled)
    assert "Range Range_2 and 2 nodes after it, planned once the values" in compiled.dump("plan")


def test_top_k_with_k_fed():
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)
    model = one_node_model(node, {"x": x, "k": np.array([3], np.int64)}, {"v": F, "i": I64})
    compiled = pf.compile(model, target="host")
    for k in (3, 5, 0):
        assert_matches_onnxruntime(model, {"x": x, "k": np.array([k], np.int64)}, compiled=compiled)


@pytest.mark.unit
def test_constant_inputs_fold():
    x = np.array([[0, 1.5], [2, 0]], np.float32)
    graph = helper.make_graph([helper.make_node("NonZero", ["c"], ["y"])], "folded", [],
                              [helper.make_tensor_value_info("y", I64, [2, None])],
                              [helper.make_tensor("c", F, [2, 2], x.reshape(-1))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = pf.compile(model, target="host")
    np.testing.assert_array_equal(compiled.run({})["y"], np.array(np.nonzero(x)))
    assert "cut to their counts" not in compiled.dump("plan")


@pytest.mark.unit
@pytest.mark.parametrize("op,limit", [("NonZero", POSITIONS_MAX), ("Unique", COUNT_MAX)])
def test_too_many_entries_is_refused(op, limit):
    x = np.zeros(limit + 1, np.float32)
    model = one_node_model(helper.make_node(op, ["x"], ["y"], name="big"), {"x": x},
                           {"y": I64 if op == "NonZero" else F})
    with pytest.raises(UnsupportedOpError, match=f"'big'.*at most {limit}"):
        pf.compile(model, target="host").run({"x": x})


def _boxes(batches, boxes, center):
    corner = RNG.random((batches, boxes, 2)).astype(np.float32)
    size = (RNG.random((batches, boxes, 2)) * 0.6).astype(np.float32)
    if center:
        return np.concatenate([corner, size], -1)
    flip = RNG.random((batches, boxes, 1)) < 0.3   # some boxes given corners in the other order
    far = corner + size
    return np.where(flip, np.concatenate([far, corner], -1), np.concatenate([corner, far], -1))


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("inputs", ["all", "no score threshold", "no limit", "none above threshold"])
def test_non_max_suppression(center, inputs):
    batches, classes, count = 2, 3, 9
    scores = RNG.random((batches, classes, count)).astype(np.float32)
    scores[0, 1, 4] = scores[0, 1, 6] = scores[0, 1].max()   # a tie: the lower box index goes first
    feeds = {"boxes": _boxes(batches, count, center), "scores": scores,
             "limit": np.array([4], np.int64), "iou": np.array([0.3], np.float32),
             "threshold": np.array([0.2 if inputs != "none above threshold" else 1.5], np.float32)}
    if inputs == "no score threshold":   # and the IoU threshold a scalar
        del feeds["threshold"]
        feeds["iou"] = feeds["iou"].reshape(())
    if inputs == "no limit":
        feeds = {k: v for k, v in feeds.items() if k in ("boxes", "scores")}
    node = helper.make_node("NonMaxSuppression", list(feeds), ["selected"], center_point_box=center)
    model = one_node_model(node, feeds, {"selected": I64})
    # the reference evaluator fails without a limit (it reads .size of the default 0)
    # and on scalar thresholds (it indexes them)
    _check(model, feeds, reference=inputs in ("all", "none above threshold"))


def test_non_max_suppression_then_gather():
    """The boxes kept, gathered and summed: NonMaxSuppression in the middle of a graph."""
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "limit", "iou"], ["sel"]),
             helper.make_node("Gather", ["sel", "two"], ["which"], axis=1),
             helper.make_node("Gather", ["flat", "which"], ["kept"], axis=0),
             helper.make_node("Squeeze", ["boxes", "zero"], ["flat"]),
             helper.make_node("ReduceSum", ["kept", "one"], ["area"], keepdims=0)]
    nodes = nodes[3:4] + nodes[:3] + nodes[4:]
    graph = helper.make_graph(
        nodes, "nms", [helper.make_tensor_value_info("boxes", F, [1, 12, 4]),
                       helper.make_tensor_value_info("scores", F, [1, 1, 12])],
        [helper.make_tensor_value_info("area", F, [4])],
        [helper.make_tensor("limit", I64, [1], [5]), helper.make_tensor("iou", F, [1], [0.25]),
         helper.make_tensor("two", I64, [], [2]), helper.make_tensor("zero", I64, [1], [0]),
         helper.make_tensor("one", I64, [1], [0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = pf.compile(model, target="host")
    for _ in range(2):
        feeds = {"boxes": _boxes(1, 12, 0), "scores": RNG.random((1, 1, 12)).astype(np.float32)}
        assert_matches_onnxruntime(model, feeds, compiled=compiled)


def test_bundle_refuses_sizes_computed_at_run_time(tmp_path):
    compiled = pf.compile(_mid_graph_model(), target="x86")
    with pytest.raises(UnsupportedOpError, match="NonZero.*outputs whose sizes are computed at run time"):
        compiled.save_bundle(tmp_path, shapes={"x": (4, 5)})
