"""A decoder called one token at a time, its past growing by one each step: after a few
plans made by the planner, every step's plan comes from a plan template, by evaluating
sizes (no op library, no fusion, no isl, no LLVM).

The model: token and position embeddings (positions past .. past + seq, a Range of
values the shapes give), the new rows concatenated after the past, causal attention
scores through a softmax, and the result divided by the total length. Kernels compute
the values of the shapes that kernels read (the positions, the mask), so plans at two
shapes differ only in sizes; ``model.plan_counts`` says how many plans the planner
made and how many came from templates. Then the same model compiled ahead of time
(``input_shapes`` with a name where the past's length is left open). Each step is
checked against onnxruntime.
"""

import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf

rng = np.random.default_rng(0)
WIDTH, VOCAB, POSITIONS = 32, 100, 128
init = {"E": rng.standard_normal((VOCAB, WIDTH)), "P": rng.standard_normal((POSITIONS, WIDTH)),
        "one": np.array(1, np.int64), "zero": np.array(0, np.int64), "axis1": np.array([1], np.int64),
        "i1": np.array(1, np.int64), "low": np.array(-1e9, np.float32)}
node = helper.make_node
nodes = [node("Shape", ["ids"], ["ids_shape"]), node("Gather", ["ids_shape", "i1"], ["seq"], axis=0),
         node("Shape", ["past"], ["past_shape"]), node("Gather", ["past_shape", "i1"], ["plen"], axis=0),
         node("Add", ["plen", "seq"], ["total"]), node("Range", ["plen", "total", "one"], ["positions"]),
         node("Gather", ["P", "positions"], ["pos"], axis=0), node("Gather", ["E", "ids"], ["tok"], axis=0),
         node("Add", ["tok", "pos"], ["x"]), node("Concat", ["past", "x"], ["kv"], axis=1),
         node("Transpose", ["kv"], ["kvt"], perm=[0, 2, 1]), node("MatMul", ["x", "kvt"], ["scores"]),
         node("Unsqueeze", ["positions", "axis1"], ["rows"]), node("Range", ["zero", "total", "one"], ["cols"]),
         node("LessOrEqual", ["cols", "rows"], ["causal"]), node("Where", ["causal", "scores", "low"], ["masked"]),
         node("Softmax", ["masked"], ["p"], axis=-1), node("MatMul", ["p", "kv"], ["att"]),
         node("Cast", ["total"], ["length"], to=TensorProto.FLOAT), node("Div", ["att", "length"], ["z"])]
graph = helper.make_graph(
    nodes, "decoder_step",
    [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
     helper.make_tensor_value_info("past", TensorProto.FLOAT, ["batch", "past", WIDTH])],
    [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", "seq", WIDTH]),
     helper.make_tensor_value_info("kv", TensorProto.FLOAT, ["batch", "total", WIDTH])],
    [numpy_helper.from_array(np.asarray(v, np.float32 if np.asarray(v).dtype.kind == "f" else np.int64), n)
     for n, v in init.items()])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 10
session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

compiled = pf.compile(model, target="host")
past = np.zeros((2, 4, WIDTH), np.float32)
ids = rng.integers(0, VOCAB, (2, 3))     # a prompt of 3, then one token at a time
for step in range(24):
    feed = {"ids": ids, "past": past}
    counts = dict(compiled.plan_counts)
    start = time.perf_counter()
    got = compiled.run(feed)
    seconds = time.perf_counter() - start
    want = dict(zip(("z", "kv"), session.run(None, feed)))
    for name in want:
        assert np.allclose(got[name], want[name], rtol=1e-4, atol=1e-5), (step, name)
    how = next((f"plan {how}" for key, how in (("templated", "from a template"), ("planned", "planned"),
                                                ("loaded", "loaded from the disk cache (run before)"))
                if compiled.plan_counts[key] > counts[key]), "kept")
    print(f"step {step:2d}: past {past.shape[1]:3d}, {seconds * 1e3:7.1f} ms, {how}")
    past, ids = got["kv"], rng.integers(0, VOCAB, (2, 1))
print("plans:", compiled.plan_counts)
assert compiled.plan_counts["templated"] >= 18   # (a second run loads the planned ones from the disk cache)

# Ahead of time: names in input_shapes compile the kernels for symbolic sizes and the plan
# templates before any call (the past at 16 and up, and at 1: a size of 1 is a kind of its
# own); one token at a time with a growing past is then all templates.
start = time.perf_counter()
ahead = pf.compile(model, target="host", input_shapes={"ids": (2, 1), "past": (2, "past", WIDTH)})
print(f"compiled ahead in {time.perf_counter() - start:.2f} s:", ahead.plan_counts)
past = np.zeros((2, 5, WIDTH), np.float32)
for step in range(8):
    feed = {"ids": rng.integers(0, VOCAB, (2, 1)), "past": past}
    got = ahead.run(feed)
    want = dict(zip(("z", "kv"), session.run(None, feed)))
    assert all(np.allclose(got[n], want[n], rtol=1e-4, atol=1e-5) for n in want)
    past = got["kv"]
print("plans after 8 steps:", ahead.plan_counts)
assert ahead.plan_counts == {"planned": 2, "templated": 8, "loaded": 0}
