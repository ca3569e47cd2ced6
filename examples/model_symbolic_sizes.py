"""A model called at a new (batch, seq) on every request compiles its kernels twice, not
once per shape: ``pf.compile(model)`` compiles the first shape's kernels for its sizes;
at the second shape, each kernel whose TC text changed only in sizes is compiled once
more with those sizes as parameters, and every later shape binds them (no LLVM, no isl).

The model: a projection with bias and GELU, a residual layer norm and the rows' scores
against each other through a softmax, with symbolic ``batch`` and ``seq`` axes. Each call
is checked against onnxruntime; ``sizes="specialized"`` compiles each shape instead.
"""

import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from polyfuse.runtime import cpu

rng = np.random.default_rng(0)
WIDTH = 64
weights = {"W": rng.standard_normal((WIDTH, 128)) * 0.1, "b": rng.standard_normal(128) * 0.1,
           "V": rng.standard_normal((128, WIDTH)) * 0.1, "g": 1 + 0.1 * rng.standard_normal(WIDTH),
           "beta": 0.1 * rng.standard_normal(WIDTH), "half": 0.5, "one": 1.0, "root2": np.sqrt(2)}
node = helper.make_node
nodes = [node("MatMul", ["x", "W"], ["xw"]), node("Add", ["xw", "b"], ["h"]),
         node("Div", ["h", "root2"], ["hs"]), node("Erf", ["hs"], ["e"]), node("Add", ["e", "one"], ["e1"]),
         node("Mul", ["h", "e1"], ["he"]), node("Mul", ["he", "half"], ["gelu"]),
         node("MatMul", ["gelu", "V"], ["down"]), node("Add", ["down", "x"], ["res"]),
         node("LayerNormalization", ["res", "g", "beta"], ["y"], axis=-1),
         node("Transpose", ["y"], ["yt"], perm=[0, 2, 1]), node("MatMul", ["y", "yt"], ["scores"]),
         node("Softmax", ["scores"], ["p"], axis=-1), node("MatMul", ["p", "y"], ["z"])]
graph = helper.make_graph(
    nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", WIDTH])],
    [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", "seq", WIDTH])],
    [numpy_helper.from_array(np.asarray(v, np.float32), n) for n, v in weights.items()])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 10
session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

SHAPES = [(2, 7), (3, 33), (2, 100), (4, 9), (8, 16), (3, 61)]
for sizes in ("symbolic", "specialized"):
    compiled = pf.compile(model, target="host", sizes=sizes)
    print(f"sizes={sizes!r}")
    worst = 0.0
    for batch, seq in SHAPES:
        x = rng.standard_normal((batch, seq, WIDTH)).astype(np.float32)
        built = cpu.STATS["compiled"] + cpu.STATS["disk"]
        start = time.perf_counter()
        got = compiled.run({"x": x})["z"]
        seconds = time.perf_counter() - start
        built = cpu.STATS["compiled"] + cpu.STATS["disk"] - built
        want = session.run(None, {"x": x})[0]
        worst = max(worst, float(np.abs(got - want).max()))
        assert np.allclose(got, want, rtol=1e-4, atol=1e-5)
        print(f"  {batch} x {seq:<4} first call {seconds * 1e3:7.1f} ms, kernels compiled (or loaded from the disk cache) {built:2d}")
    print(f"  max |polyfuse - onnxruntime| = {worst:.1e}")
symbolic_loops = pf.compile(model, target="host")
symbolic_loops.run({"x": np.zeros((2, 7, WIDTH), np.float32)})
symbolic_loops.run({"x": np.zeros((3, 5, WIDTH), np.float32)})
first = next(line for line in symbolic_loops.dump("loops").splitlines() if line.startswith("kernel"))
print("a kernel of the second shape's plan:", first[:160], "...")
assert "int64 S0" in symbolic_loops.dump("loops")
