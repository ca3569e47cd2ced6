"""ONNX ops whose output sizes the data decides (NonZero, Compress, Unique,
NonMaxSuppression, a TopK whose k the graph computes), each checked against onnxruntime.

Such an op lowers to one kernel that writes its outputs at an upper bound of their size
(every element nonzero, every entry distinct) and how many entries hold results; the
plan ends after it, the runtime cuts the outputs to that count and plans the rest of the
graph for the sizes produced (cached per sizes). ``model.dump("plan")`` shows the cut.
NonMaxSuppression's greedy selection runs as a Loop of a parallel round of kernels until
nothing changes.
"""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

import polyfuse as pf

F, B, I64 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64
rng = np.random.default_rng(0)


def tensor(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def model_of(nodes, inputs, outputs):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def check(name, model, feeds):
    compiled = pf.compile(model, target="host")
    session = ort.InferenceSession(model.SerializeToString())
    for feed in feeds:
        ours = compiled.run(feed)
        theirs = session.run(None, feed)
        same = all(ours[v.name].shape == want.shape and np.allclose(ours[v.name], want, atol=1e-6)
                   for v, want in zip(model.graph.output, theirs))
        shapes = [tuple(want.shape) for want in theirs]
        print(f"{name:<34} shapes {str(shapes):<28} matches onnxruntime: {same}")


# the sum and the squares of the nonzero elements, gathered by NonZero's indices
sparse = model_of([helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Transpose", ["nz"], ["t"]),
                   helper.make_node("GatherND", ["x", "t"], ["g"]),
                   helper.make_node("ReduceSum", ["g"], ["s"], keepdims=0),
                   helper.make_node("Mul", ["g", "g"], ["sq"])],
                  [tensor("x", F, [4, 5])], [tensor("s", F, []), tensor("sq", F, [None])])
check("NonZero -> GatherND -> ReduceSum", sparse,
      [{"x": (rng.standard_normal((4, 5)) * (rng.random((4, 5)) < p)).astype(np.float32)}
       for p in (0.3, 0.0)])

# the rows of x where the condition holds
compress = model_of([helper.make_node("Compress", ["x", "keep"], ["y"], axis=0)],
                    [tensor("x", F, [6, 3]), tensor("keep", B, [6])], [tensor("y", F, [None, 3])])
check("Compress rows", compress, [{"x": rng.standard_normal((6, 3)).astype(np.float32),
                                   "keep": rng.random(6) < 0.5}])

# the distinct values in order of first occurrence, where, which and how often
unique = model_of([helper.make_node("Unique", ["x"], ["y", "first", "inverse", "counts"], sorted=0)],
                  [tensor("x", F, [10])], [tensor("y", F, [None]), tensor("first", I64, [None]),
                                           tensor("inverse", I64, [10]), tensor("counts", I64, [None])])
check("Unique, first-occurrence order", unique, [{"x": rng.integers(0, 4, 10).astype(np.float32)}])

# TopK with k = the number of positive elements (computed in the graph)
top = model_of([helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", F, [], [0.0])),
                helper.make_node("Greater", ["x", "zero"], ["pos"]),
                helper.make_node("Cast", ["pos"], ["n"], to=I64),
                helper.make_node("ReduceSum", ["n"], ["k"], keepdims=1),
                helper.make_node("TopK", ["x", "k"], ["v", "i"])],
               [tensor("x", F, [8])], [tensor("v", F, [None]), tensor("i", I64, [None])])
check("TopK, k computed from x", top, [{"x": rng.standard_normal(8).astype(np.float32)} for _ in range(2)])

# NonMaxSuppression: at most 3 boxes per class, overlapping kept boxes by IoU <= 0.4
corner = rng.random((1, 10, 2)).astype(np.float32)
boxes = np.concatenate([corner, corner + rng.random((1, 10, 2)).astype(np.float32) * 0.5], -1)
nms = model_of([helper.make_node("NonMaxSuppression", ["boxes", "scores", "limit", "iou"], ["selected"])],
               [tensor("boxes", F, [1, 10, 4]), tensor("scores", F, [1, 2, 10]), tensor("limit", I64, [1]),
                tensor("iou", F, [1])], [tensor("selected", I64, [None, 3])])
check("NonMaxSuppression", nms, [{"boxes": boxes, "scores": rng.random((1, 2, 10)).astype(np.float32),
                                  "limit": np.array([3], np.int64), "iou": np.array([0.4], np.float32)}])
