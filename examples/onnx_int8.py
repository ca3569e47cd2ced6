"""int8 quantization after Glow's profile-guided flow: profile a small CNN's tensors on
calibration inputs, write the int8 QDQ model (`polyfuse quantize` does the same from the
command line), run it in onnxruntime and in polyfuse, and compile the float model with
precision="int8" directly. polyfuse computes each quantized Conv as one integer kernel
(uint8 x int8 products summed in int32, 4 channels a step, requantized in the same
kernel); the classifier,
whose output is the model's and stays float, multiplies the dequantized int8 values."""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from polyfuse.frontends.onnx_quantize import quantize

rng = np.random.default_rng(0)
weights = {"w1": rng.normal(0, .3, (16, 3, 3, 3)), "b1": rng.normal(0, .1, 16),
           "w2": rng.normal(0, .1, (32, 16, 3, 3)), "b2": rng.normal(0, .1, 32),
           "wf": rng.normal(0, .05, (10, 32 * 8 * 8)), "bf": rng.normal(0, .1, 10)}
initializers = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()]
initializers.append(numpy_helper.from_array(np.array([1, -1]), "flat"))
nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
         helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
         helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2],
                          name="conv2"),
         helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
         helper.make_node("Reshape", ["r2", "flat"], ["f"], name="flatten"),
         helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1, name="fc")]
graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], initializers)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

calibration = [{"x": rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(8)]
float_model = pf.compile(model, target="host")
profile = float_model.profile_ranges(calibration)          # min, max, histogram per tensor
print(f"profiled {len(profile.tensors)} tensors; r1 in [{profile.tensors['r1'].min:.3f}, "
      f"{profile.tensors['r1'].max:.3f}]")

qdq = quantize(model, profile)                              # a standard QDQ ONNX model
x = {"x": rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)}
# onnxruntime runs the QDQ model as written (each DequantizeLinear, then float ops): its
# fused int8 kernels on CPUs without VNNI sum byte pairs in saturating int16 (vpmaddubsw)
# and drift from the model's exact integer result by up to 0.2 here
exact = ort.SessionOptions()
exact.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
from_ort = ort.InferenceSession(qdq.SerializeToString(), exact).run(None, x)[0]
int8 = pf.compile(model, target="host", precision="int8", profile=profile)
got, want = int8.run(x)["logits"], float_model.run(x)["logits"]
integer_ops = [op for op in ("QLinearConv", "QLinearGemm", "MatMulInteger")
               if op in int8.dump("partition_fusion_groups")]   # (the logits: integers dequantized)
print(f"integer ops in polyfuse's graph: {', '.join(integer_ops)}")
# the convolutions' constant weights are repacked as words of 4 input channels, each step
# of a sum one dot4 (4 uint8 x int8 products): vpdpbusd where the CPU has AVX512-VNNI
words = "dot4(" in int8.dump("specialized")
print(f"sums of 4 channels per step (dot4): {words}; as VNNI's vpdpbusd on this CPU: "
      f"{'vpdpbusd' in int8.dump('asm')}")
print(f"int8 vs onnxruntime on the same QDQ model: max |d| = {np.abs(got - from_ort).max():.2g}")
cos = float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want))
print(f"int8 vs float32: cosine similarity {cos:.4f}, same top class: {got.argmax() == want.argmax()}")
assert cos > 0.99 and np.abs(got - from_ort).max() < 0.05 and words
