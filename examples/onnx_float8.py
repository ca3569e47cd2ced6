"""The narrow ONNX types: a layer whose activations are quantized to float8 e4m3 and whose
weights are stored as int4 with one scale per block of 16 rows, checked against onnx's
reference evaluator. The float8 activations are an output too: they come back as an
ml_dtypes float8_e4m3fn array. Inside polyfuse the float8 values live in float32 and the
int4 ones in int8; the QuantizeLinear kernel rounds to float8 (ties to even, saturating
at 448) itself."""

import ml_dtypes
import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import polyfuse as pf

rng = np.random.default_rng(0)
weights = rng.integers(-8, 8, (64, 32)).astype(ml_dtypes.int4)       # int4 initializer
weight_scales = rng.uniform(0.01, 0.05, (4, 32)).astype(np.float32)  # one per 16 rows
initializers = {"w": weights, "ws": weight_scales, "s": np.array(0.02, np.float32),
                "z": np.zeros((), ml_dtypes.float8_e4m3fn)}
nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),     # float -> float8
         helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xf"]),
         helper.make_node("DequantizeLinear", ["w", "ws"], ["wf"], axis=0, block_size=16),
         helper.make_node("MatMul", ["xf", "wf"], ["y"]),
         helper.make_node("Relu", ["y"], ["out"])]
graph = helper.make_graph(
    nodes, "float8_layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
    [helper.make_tensor_value_info("out", TensorProto.FLOAT, [8, 32]),
     helper.make_tensor_value_info("xq", TensorProto.FLOAT8E4M3FN, [8, 64])],
    [numpy_helper.from_array(a, n) for n, a in initializers.items()])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])

x = (rng.standard_normal((8, 64)) * 3).astype(np.float32)
x[0, :2] = [100.0, -1e6]          # past float8 e4m3's range (0.02 * 448): saturates
got = pf.compile(model, target="host").run({"x": x})
want = dict(zip(["out", "xq"], ReferenceEvaluator(model).run(None, {"x": x})))

assert got["xq"].dtype == ml_dtypes.float8_e4m3fn
assert np.array_equal(got["xq"].view(np.uint8), want["xq"].view(np.uint8))
np.testing.assert_allclose(got["out"], want["out"], rtol=1e-5, atol=1e-5)
print(f"float8 activations {got['xq'].dtype}: bit-identical to onnx's reference "
      f"(x = {x[0, 0]:g}, {x[0, 1]:g} -> {float(got['xq'][0, 0]) * 0.02:g}, "
      f"{float(got['xq'][0, 1]) * 0.02:g})")
print(f"layer output {got['out'].shape}: max |polyfuse - reference| = "
      f"{np.abs(got['out'] - want['out']).max():.2g}")
