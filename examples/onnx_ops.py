"""ONNX ops beyond CNNs and transformers, each checked against onnxruntime: a QDQ-quantized
matmul (QuantizeLinear, QLinearMatMul, DequantizeLinear, integer kernels), a ScatterND
with an add reduction, GridSample, and an STFT with a Hann window."""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf

rng = np.random.default_rng(0)


def check(name, nodes, inputs, outputs, initializers=(), opset=21):
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info(n, t, s) for n, t, s, _ in inputs],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                              [numpy_helper.from_array(a, n) for n, a in initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    feed = {n: a for n, _, _, a in inputs}
    ours = pf.compile(model, target="host").run(feed)
    theirs = ort.InferenceSession(model.SerializeToString()).run(None, feed)
    for (out, _, _), want in zip(outputs, theirs):
        diff = np.abs(ours[out].astype(np.float64) - want.astype(np.float64)).max()
        print(f"{name:<12} {out:<9} {str(want.dtype):<8} shape {str(want.shape):<14} "
              f"max |polyfuse - onnxruntime| = {diff:.2g}")


# a quantized matmul: activations quantized to uint8, int8 weights, int32 sums, requantized
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
      consts)

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
