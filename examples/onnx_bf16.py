"""bfloat16 products: compile a transformer's feed-forward block (MatMul 256 -> 1024,
Gelu, MatMul 1024 -> 256, residual Add, LayerNormalization) with precision="bf16". Its two
MatMuls multiply the activations rounded to bfloat16 by weights rounded and repacked at
compile time, 2 products per step of TC's ``bfdot2`` builtin summed in float32. On a CPU
with AMX (Sapphire Rapids Xeons) the loop pass use_matrix_tiles puts both products on AMX
tiles, blocks of 32x32 outputs summed by tdpbf16ps ("tile bfdot2(...)" statements in the
loop IR, Gelu and the bias applied to each block); elsewhere they run as loops
(AVX512-BF16's vdpbf16ps where the CPU has it). Gelu, the Add and the normalization stay
float32. The result matches the float32 model to about 3 significant digits."""

import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf

rng = np.random.default_rng(0)
weights = {"w1": rng.normal(0, 256 ** -0.5, (256, 1024)), "b1": rng.normal(0, .02, 1024),
           "w2": rng.normal(0, 1024 ** -0.5, (1024, 256)), "b2": rng.normal(0, .02, 256),
           "gamma": np.ones(256), "beta": np.zeros(256)}
initializers = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()]
nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
         helper.make_node("Add", ["h", "b1"], ["hb"]),
         helper.make_node("Gelu", ["hb"], ["g"]),
         helper.make_node("MatMul", ["g", "w2"], ["o"]),
         helper.make_node("Add", ["o", "b2"], ["ob"]),
         helper.make_node("Add", ["ob", "x"], ["r"]),
         helper.make_node("LayerNormalization", ["r", "gamma", "beta"], ["y"], axis=-1)]
graph = helper.make_graph(nodes, "ffn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 128, 256])],
                          initializers)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])

x = {"x": rng.normal(0, 1, (1, 128, 256)).astype(np.float32)}
float32 = pf.compile(model, target="host")
bf16 = pf.compile(model, target="host", precision="bf16")
want, got = float32.run(x)["y"], bf16.run(x)["y"]
products = bf16.dump("use_bfloat16_products").count("BFloat16MatMul")
asm = bf16.dump("asm")
print(f"MatMuls on bfloat16 operands: {products}; summed 2 a step (bfdot2): "
      f"{'bfdot2(' in bf16.dump('specialized')}; blocks on AMX tiles: "
      f"{bf16.dump('loops').count('tile bfdot2(')} (tdpbf16ps: {'tdpbf16ps' in asm}); "
      f"vdpbf16ps: {'vdpbf16ps' in asm}")


def median_ms(compiled) -> float:
    times = []
    for _ in range(20):
        start = time.perf_counter()
        compiled.run(x)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


print(f"float32 {median_ms(float32):.3f} ms, bf16 {median_ms(bf16):.3f} ms")
cos = float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want))
print(f"bf16 vs float32: cosine similarity {cos:.6f}, max |d| {np.abs(got - want).max():.3g}")
assert products == 2 and cos > 0.999 and np.allclose(got, want, rtol=0.05, atol=0.05)
