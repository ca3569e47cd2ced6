"""What polyfuse says about bad models, feeds and settings: each error names what is
wrong (the node, the input, the field) and what to do."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf


def model(nodes, inputs, outputs, constants=()):
    graph = helper.make_graph(nodes, "example", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in constants])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def show(title, run):
    try:
        run()
    except pf.PolyfuseError as err:
        print(f"--- {title} ({type(err).__name__})\n{err}")
    else:
        raise AssertionError(f"{title}: no error")


x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["?", 3])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])
concat = model([helper.make_node("Concat", ["x", "x"], ["y"], name="join", axis=5)], [x], [y])
show("a Concat axis out of range", lambda: pf.compile(concat, target="host").run(
    {"x": np.ones((2, 3), np.float32)}))

huge = model([helper.make_node("ConstantOfShape", ["shape"], ["y"], name="fill")], [x], [y],
             [("shape", np.asarray([2**20, 2**20], np.int64))])
show("a tensor of 2**40 elements", lambda: pf.compile(huge, target="host").run(
    {"x": np.ones((2, 3), np.float32)}))

relu = model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [x], [y])
compiled = pf.compile(relu, target="host")
show("an array where a feed dict goes", lambda: compiled.run(np.ones((2, 3), np.float32)))
# '?' dims are independent unknowns: any batch works
print("--- relu at batch 5:", compiled.run({"x": -np.ones((5, 3), np.float32)})["y"].shape)

show("a bad scheduling option", lambda: pf.MappingOptions(tile_sizes=(32, -1)))
scale = pf.define("def scale(float(N) A, int32 s) -> (B) { B(i) = A(i) * s }", target="host")
show("an int32 scalar out of range", lambda: scale.scale(np.ones(4, np.float32), 2**40))
show("an expression 300 levels deep", lambda: pf.define(
    "def deep(float(N) A) -> (B) {\n  B(i) = " + " +\n    ".join(["A(i)"] * 300) + "\n}"))
