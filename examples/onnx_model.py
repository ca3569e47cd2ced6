"""polyfuse.compile on an ONNX model built with onnx.helper, checked against onnxruntime:
the fusion decisions, the plan for the shapes of a call, the fused kernels' TC, the
activation arena and a per-kernel profile; then a small CNN, run channels-last."""

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

# A small CNN: its convolutions, pool and residual add run channels-last (N, H, W, C),
# with one Transpose at the input and one before Flatten (graph pass convert_layout).
conv_weights = {"C1": rng.standard_normal((16, 3, 3, 3)).astype(np.float32) * 0.2,
                "C2": rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1,
                "F": rng.standard_normal((10, 16)).astype(np.float32)}
cnn = helper.make_model(helper.make_graph(
    [helper.make_node("Conv", ["img", "C1"], ["c1"], pads=[1, 1, 1, 1]),
     helper.make_node("Relu", ["c1"], ["r1"]),
     helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
     helper.make_node("Conv", ["p1", "C2"], ["c2"], pads=[1, 1, 1, 1]),
     helper.make_node("Add", ["c2", "p1"], ["res"]),
     helper.make_node("GlobalAveragePool", ["res"], ["gap"]),
     helper.make_node("Flatten", ["gap"], ["flat"]),
     helper.make_node("Gemm", ["flat", "F"], ["scores"], transB=1)],
    "cnn", [helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 3, 32, 32])],
    [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 10])],
    [numpy_helper.from_array(a, name) for name, a in conv_weights.items()]),
    opset_imports=[helper.make_opsetid("", 17)])
cnn.ir_version = 10


def compiled_like_onnxruntime(model, feeds):
    """The model compiled for this machine, after checking it against onnxruntime."""
    compiled = pf.compile(model, target="host")
    ours = list(compiled.run(feeds).values())[0]
    theirs = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    assert np.allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    return compiled


compiled_cnn = compiled_like_onnxruntime(cnn, {"img": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)})
layout = compiled_cnn.dump("convert_layout")
print("CNN matches onnxruntime; transposes after convert_layout:", layout.count("= Transpose("))
print("\n".join(line for line in layout.splitlines() if "Transpose" in line))

# A 3x3 convolution of 32 channels on a 28 x 28 map runs as Winograd's F(4x4, 3x3): an
# input transform, a batched MatMul by filters transformed at compile time, and an output
# transform that takes the bias and the ReLU.
block = helper.make_model(helper.make_graph(
    [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
     helper.make_node("Relu", ["c"], ["y"])],
    "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 28, 28])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 28, 28])],
    [numpy_helper.from_array(rng.standard_normal((32, 32, 3, 3)).astype(np.float32) / 17, "W"),
     numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "B")]),
    opset_imports=[helper.make_opsetid("", 17)])
block.ir_version = 10
compiled_block = compiled_like_onnxruntime(block, {"x": rng.standard_normal((1, 32, 28, 28)).astype(np.float32)})
print("Winograd convolution matches onnxruntime; its nodes after convert_layout:")
print("\n".join(line for line in compiled_block.dump("convert_layout").splitlines() if "inograd" in line))

# RegNet's pattern: a grouped convolution (8 channels per group) between channels-last
# convolutions stays channels-last too, each group's outputs summed as one vector; and
# DeepLab's: a 3x3 convolution dilated by 24 on a 14 x 14 map reads only padding with its
# outer taps, so its kernel keeps the centre one (a 1 x 1 window).
aspp = helper.make_model(helper.make_graph(
    [helper.make_node("Conv", ["x", "G"], ["g"], pads=[1, 1, 1, 1], group=4),
     helper.make_node("Relu", ["g"], ["r"]),
     helper.make_node("Conv", ["r", "D"], ["y"], pads=[24, 24, 24, 24], dilations=[24, 24])],
    "aspp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 14, 14])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 14, 14])],
    [numpy_helper.from_array(rng.standard_normal((32, 8, 3, 3)).astype(np.float32) / 9, "G"),
     numpy_helper.from_array(rng.standard_normal((16, 32, 3, 3)).astype(np.float32) / 17, "D")]),
    opset_imports=[helper.make_opsetid("", 17)])
aspp.ir_version = 10
compiled_aspp = compiled_like_onnxruntime(aspp, {"x": rng.standard_normal((1, 32, 14, 14)).astype(np.float32)})
print("grouped and dilated convolutions match onnxruntime; their kernels' weights, repacked:")
for step, kernel in compiled_aspp.plan_for().steps():
    weights = kernel.definition.inputs[1:]   # after the activations: weights repacked at compile time
    if weights:
        print(f"  {step.label}: {tuple(int(e.value) for e in weights[-1].shape)}")
print("  (grouped: group, input channel, window, output channel of the group;"
      " dilated: input channel, window, output channel)")
