"""ONNX control flow (If, Loop, Scan), each checked against onnxruntime.

What polyfuse knows when it plans a call it resolves in the graph: an If on a constant
(or shape-derived) condition becomes its branch, a Loop with a known trip count and a
Scan are unrolled, and the inlined nodes fuse like any others. What the data decides (an
If on ReduceSum(x) > 0, a while loop, a trip count computed from data) the native
program runs itself: the plan holds an ``if`` or ``loop`` step whose branches or body are
planned once, and the program jumps between them with no Python per iteration. What
the program cannot run (a loop whose carried values change shape) ends the plan: the
runtime runs the node from Python, its body compiled as a program of its own, and plans
the rest for the shapes it produced. ``model.dump("plan")`` shows which happened; the
last part prints the plan of a native while loop and times it against onnxruntime.
"""

import time


import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

import polyfuse as pf

F, B, I64 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64
rng = np.random.default_rng(0)


def model_of(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def check(name, model, feeds):
    compiled = pf.compile(model, target="host")
    session = ort.InferenceSession(model.SerializeToString())
    for feed in feeds:
        ours = compiled.run(feed)
        theirs = session.run(None, feed)
        diff = max(float(np.abs(ours[v.name] - want).max(initial=0))
                   for v, want in zip(model.graph.output, theirs))
        shapes = [tuple(want.shape) for want in theirs]
        plan = compiled.dump("plan")
        how = ("run from Python" if "then at run time" in plan
               else "run by the program" if "loop (" in plan or "= if " in plan else "inlined in the plan")
        print(f"{name:<22} {how:<20} shapes {str(shapes):<20} max |polyfuse - onnxruntime| = {diff:.2g}")
        assert diff <= 1e-4 and [ours[v.name].shape for v in model.graph.output] == shapes, name


def tensor(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


# If on data: y = x * 2 when sum(x) > 0, else x - 1 (the branches read x from outside)
then = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [], [tensor("t", F, [4])])
other = helper.make_graph([helper.make_node("Sub", ["x", "one"], ["e"])], "else", [], [tensor("e", F, [4])])
if_model = model_of(
    [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
     helper.make_node("Greater", ["s", "zero"], ["c"]),
     helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
    [tensor("x", F, [4])], [tensor("y", F, [4])],
    [helper.make_tensor(n, F, [], [v]) for n, v in (("two", 2.0), ("one", 1.0), ("zero", 0.0))])
x = rng.standard_normal(4).astype(np.float32)
check("If on sum(x) > 0", if_model, [{"x": np.abs(x)}, {"x": -np.abs(x)}])

# Loop with a trip count: y += x * i, and every y as a scan output
body = helper.make_graph(
    [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Cast", ["i"], ["fi"], to=F),
     helper.make_node("Mul", ["x", "fi"], ["xi"]), helper.make_node("Add", ["y_in", "xi"], ["y_out"]),
     helper.make_node("Identity", ["y_out"], ["scan"])],
    "body", [tensor("i", I64, []), tensor("c_in", B, []), tensor("y_in", F, [3])],
    [tensor("c_out", B, []), tensor("y_out", F, [3]), tensor("scan", F, [3])])
loop_model = model_of([helper.make_node("Loop", ["n", "", "y0"], ["y", "ys"], body=body)],
                      [tensor("x", F, [3]), tensor("y0", F, [3]), tensor("n", I64, [])],
                      [tensor("y", F, [3]), tensor("ys", F, ["n", 3])])
feeds = [{"x": rng.standard_normal(3).astype(np.float32), "y0": np.zeros(3, np.float32),
          "n": np.array(n, np.int64)} for n in (4, 7)]
check("Loop n times", loop_model, feeds)

# while sum(y) < limit: y = y * 2 (the data decides how often)
body = helper.make_graph(
    [helper.make_node("Mul", ["y_in", "two"], ["y_out"]),
     helper.make_node("ReduceSum", ["y_out"], ["s"], keepdims=0),
     helper.make_node("Less", ["s", "limit"], ["c_out"])],
    "body", [tensor("i", I64, []), tensor("c_in", B, []), tensor("y_in", F, [3])],
    [tensor("c_out", B, []), tensor("y_out", F, [3])])
while_model = model_of([helper.make_node("Loop", ["", "go", "y0"], ["y"], body=body)],
                       [tensor("y0", F, [3]), tensor("go", B, []), tensor("limit", F, [])],
                       [tensor("y", F, [3])], [helper.make_tensor("two", F, [], [2.0])])
check("while sum(y) < limit", while_model,
      [{"y0": np.full(3, 0.1, np.float32), "go": np.array(True), "limit": np.array(v, np.float32)}
       for v in (5.0, 500.0)])

# Scan: a running sum over the rows of x, read from the last row back
body = helper.make_graph([helper.make_node("Add", ["acc", "row"], ["acc_out"]),
                          helper.make_node("Identity", ["acc_out"], ["out"])],
                         "body", [tensor("acc", F, [2]), tensor("row", F, [2])],
                         [tensor("acc_out", F, [2]), tensor("out", F, [2])])
scan_model = model_of([helper.make_node("Scan", ["s0", "xs"], ["s", "sums"], body=body, num_scan_inputs=1,
                                        scan_input_directions=[1])],
                      [tensor("s0", F, [2]), tensor("xs", F, [5, 2])],
                      [tensor("s", F, [2]), tensor("sums", F, [5, 2])])
check("Scan, reversed", scan_model, [{"s0": np.zeros(2, np.float32),
                                      "xs": rng.standard_normal((5, 2)).astype(np.float32)}])

# A while loop the data bounds, run by the program: its plan, then the cost of an iteration
body = helper.make_graph(
    [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Mul", ["y_in", "a"], ["m"]),
     helper.make_node("Add", ["m", "b"], ["y_out"])],
    "body", [tensor("i", I64, []), tensor("c_in", B, []), tensor("y_in", F, [16])],
    [tensor("c_out", B, []), tensor("y_out", F, [16])],
    [helper.make_tensor("a", F, [], [0.999]), helper.make_tensor("b", F, [], [1.0])])
count_model = model_of([helper.make_node("ReduceSum", ["n"], ["trips"], keepdims=0),
                        helper.make_node("Loop", ["trips", "", "y0"], ["y"], body=body)],
                       [tensor("y0", F, [16]), tensor("n", I64, [100])], [tensor("y", F, [16])])


def trips(k):
    n = np.zeros(100, np.int64)
    n[0] = k
    return {"y0": np.ones(16, np.float32), "n": n}


check("Loop sum(n) times", count_model, [trips(1000), trips(0)])
compiled = pf.compile(count_model, target="host")
compiled.run(trips(1))
print(compiled.dump("plan").split("\n\n")[0])
options = ort.SessionOptions()
options.intra_op_num_threads = 1
session = ort.InferenceSession(count_model.SerializeToString(), options)
for name, run in (("polyfuse", compiled.run), ("onnxruntime", lambda f: session.run(None, f))):
    costs = []
    for _ in range(5):
        start = time.perf_counter()
        run(trips(2000))
        middle = time.perf_counter()
        run(trips(0))
        costs.append(((middle - start) - (time.perf_counter() - middle)) / 2000)
    print(f"{name:<12} {np.median(costs) * 1e6:.2f} us per iteration")
