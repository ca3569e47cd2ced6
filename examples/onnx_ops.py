"""ONNX ops beyond CNNs and transformers, each checked against onnxruntime or the ONNX
reference: a QDQ-quantized matmul (QuantizeLinear, QLinearMatMul, DequantizeLinear,
integer kernels; against the reference, which is exact), a ScatterND
with an add reduction, GridSample, an STFT with a Hann window, MaxUnpool after MaxPool,
and batched determinants (Det); and a FlexAttention with a soft-capping score_mod,
checked against the ONNX reference (onnxruntime does not run it)."""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import polyfuse as pf

rng = np.random.default_rng(0)


def check(name, nodes, inputs, outputs, initializers=(), opset=21, oracle="onnxruntime"):
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info(n, t, s) for n, t, s, _ in inputs],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                              [numpy_helper.from_array(a, n) for n, a in initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    feed = {n: a for n, _, _, a in inputs}
    ours = pf.compile(model, target="host").run(feed)
    if oracle == "onnxruntime":
        theirs = ort.InferenceSession(model.SerializeToString()).run(None, feed)
    else:   # the ONNX reference evaluator: exact integer semantics
        theirs = ReferenceEvaluator(model).run(None, feed)
    for (out, _, _), want in zip(outputs, theirs):
        diff = np.abs(ours[out].astype(np.float64) - want.astype(np.float64)).max()
        print(f"{name:<12} {out:<9} {str(want.dtype):<8} shape {str(want.shape):<14} "
              f"max |polyfuse - {oracle}| = {diff:.2g}")
        assert ours[out].shape == want.shape and diff <= 1e-3 * max(1.0, float(np.abs(want).max())), (name, out)


# a quantized matmul: activations quantized to uint8, int8 weights, int32 sums, requantized;
# checked against the ONNX reference: onnxruntime's int8 kernels on CPUs without
# AVX512-VNNI sum byte pairs in saturating int16 and land a few steps off the exact result
x = rng.standard_normal((8, 32)).astype(np.float32)
w = rng.integers(-100, 100, (32, 16)).astype(np.int8)
consts = [("xs", np.array(0.02, np.float32)), ("xz", np.array(128, np.uint8)),
          ("w", w), ("ws", np.array(0.01, np.float32)), ("wz", np.array(0, np.int8)),
          ("ys", np.array(0.5, np.float32)), ("yz", np.array(100, np.uint8))]
check("qdq matmul",
      [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
       helper.make_node("QLinearMatMul", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["yq"]),
       helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])],
      [("x", TensorProto.FLOAT, [8, 32], x)], [("yq", TensorProto.UINT8, [8, 16]), ("y", TensorProto.FLOAT, [8, 16])],
      consts, oracle="onnx reference")

# rows of a table updated at data-dependent positions (repeated indices add up)
data = rng.standard_normal((6, 4)).astype(np.float32)
check("scatter_nd",
      [helper.make_node("ScatterND", ["data", "idx", "upd"], ["out"], reduction="add")],
      [("data", TensorProto.FLOAT, [6, 4], data),
       ("idx", TensorProto.INT64, [3, 1], np.array([[1], [4], [1]], np.int64)),
       ("upd", TensorProto.FLOAT, [3, 4], rng.standard_normal((3, 4)).astype(np.float32))],
      [("out", TensorProto.FLOAT, [6, 4])])

# bilinear sampling of an image at a grid of points
check("grid_sample",
      [helper.make_node("GridSample", ["img", "grid"], ["out"], mode="linear", padding_mode="border")],
      [("img", TensorProto.FLOAT, [1, 2, 5, 7], rng.standard_normal((1, 2, 5, 7)).astype(np.float32)),
       ("grid", TensorProto.FLOAT, [1, 3, 4, 2], rng.uniform(-1.2, 1.2, (1, 3, 4, 2)).astype(np.float32))],
      [("out", TensorProto.FLOAT, [1, 2, 3, 4])])

# a short-time Fourier transform of a signal, Hann-windowed frames
check("stft",
      [helper.make_node("HannWindow", ["n"], ["window"]),
       helper.make_node("STFT", ["signal", "step", "window"], ["spectrum"], onesided=1)],
      [("signal", TensorProto.FLOAT, [1, 128, 1], rng.standard_normal((1, 128, 1)).astype(np.float32))],
      [("spectrum", TensorProto.FLOAT, [1, 7, 17, 2])],
      [("n", np.array(32, np.int64)), ("step", np.array(16, np.int64))], opset=17)

# max pooling undone: each maximum back where it was taken, zeros elsewhere
check("max_unpool",
      [helper.make_node("MaxPool", ["img"], ["pooled", "idx"], kernel_shape=[2, 2], strides=[2, 2]),
       helper.make_node("MaxUnpool", ["pooled", "idx"], ["out"], kernel_shape=[2, 2], strides=[2, 2])],
      [("img", TensorProto.FLOAT, [1, 3, 6, 8], rng.standard_normal((1, 3, 6, 8)).astype(np.float32))],
      [("out", TensorProto.FLOAT, [1, 3, 6, 8])])

# determinants of a batch of 5x5 matrices (Gaussian elimination with partial pivoting)
check("det",
      [helper.make_node("Det", ["m"], ["det"])],
      [("m", TensorProto.FLOAT, [4, 5, 5], rng.standard_normal((4, 5, 5)).astype(np.float32))],
      [("det", TensorProto.FLOAT, [4])])

# attention whose scores pass through a subgraph (soft capping: 5 * tanh(s / 5)) first
shape = ["B", "H", "L", "S"]
cap = helper.make_graph(
    [helper.make_node("Div", ["s", "c"], ["t"]), helper.make_node("Tanh", ["t"], ["u"]),
     helper.make_node("Mul", ["u", "c"], ["capped"])], "soft_cap",
    [helper.make_tensor_value_info("s", TensorProto.FLOAT, shape)],
    [helper.make_tensor_value_info("capped", TensorProto.FLOAT, shape)],
    [helper.make_tensor("c", TensorProto.FLOAT, [], [5.0])])
qkv = {"q": rng.standard_normal((1, 4, 6, 8)).astype(np.float32),     # 4 query heads ...
       "k": rng.standard_normal((1, 2, 10, 8)).astype(np.float32),    # ... share 2 key heads
       "v": rng.standard_normal((1, 2, 10, 8)).astype(np.float32)}
graph = helper.make_graph(
    [helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain="ai.onnx.preview",
                      score_mod=cap)], "flex",
    [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in qkv.items()],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 8])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23),
                                                helper.make_opsetid("ai.onnx.preview", 1)])
diff = np.abs(pf.compile(model).run(qkv)["y"] - ReferenceEvaluator(model).run(None, qkv)[0]).max()
print(f"{'flex_attn':<12} {'y':<9} {'float32':<8} shape {str((1, 4, 6, 8)):<14} "
      f"max |polyfuse - onnx reference| = {diff:.2g}")
assert diff <= 1e-4
