"""polyfuse.compile on an ONNX model built with onnx.helper, checked against onnxruntime:
the fusion decisions, the plan for the shapes of a call, the fused kernels' TC, the
activation arena and a per-kernel profile."""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf

rng = np.random.default_rng(0)
weights = {"W1": rng.standard_normal((64, 128)).astype(np.float32),
           "b1": rng.standard_normal(128).astype(np.float32),
           "W2": rng.standard_normal((128, 10)).astype(np.float32)}
graph = helper.make_graph(
    [helper.make_node("MatMul", ["x", "W1"], ["h"]),
     helper.make_node("Add", ["h", "b1"], ["h_b"]),
     helper.make_node("Relu", ["h_b"], ["h_r"]),
     helper.make_node("MatMul", ["h_r", "W2"], ["logits"])],
    "mlp",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
    [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
    [numpy_helper.from_array(a, name) for name, a in weights.items()])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

compiled = pf.compile(model, target="host")       # the batch size binds at the first call
x = rng.standard_normal((32, 64)).astype(np.float32)
ours = compiled.run({"x": x})["logits"]
theirs = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
print("max |polyfuse - onnxruntime| =", float(np.abs(ours - theirs).max()))
assert np.allclose(ours, theirs, rtol=1e-4, atol=1e-4)

print(compiled.dump("groups"))       # MatMul + bias + ReLU run as one kernel
print(compiled.dump("plan"))         # the graph lowered for x's shape: steps, buffers, arena
print(compiled.dump("kernels"))      # each kernel's TC: the epilogue is one statement
plan = compiled.memory_plan(x=x.shape)
print(f"activation arena {plan.arena_bytes} B (naive sum {plan.naive_bytes} B)")
for label, seconds in compiled.profile({"x": x}):
    print(f"{seconds * 1e6:8.1f} us  {label}")

try:
    compiled.run({"x": x.astype(np.float64)})
except pf.DTypeError as err:
    print("refused:", err)
