"""The caches: compiled kernels and models on disk, shared by every process, and plans
in memory, a bounded number per model.

A model is compiled in one process and run again in a second, which loads its saved
program (every kernel, the packed weights) from the disk cache instead of planning and
compiling (the same outputs, bit for bit); then a model
called at many shapes keeps only its `max_plans` most recent plans; last, `polyfuse
cache` shows the cache and clears it. The example uses a cache folder of its own
(`POLYFUSE_CACHE_DIR`); the default is ~/.cache/polyfuse."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from polyfuse.cli import main

CHILD = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    import polyfuse as pf
    from polyfuse.runtime import cpu
    rng = np.random.default_rng(0)
    W, b = rng.standard_normal((88, 32, 1, 1)).astype(np.float32), rng.standard_normal(88).astype(np.float32)
    graph = helper.make_graph(      # a 1x1 convolution to 88 channels: packed in part-filled panels
        [helper.make_node("Conv", ["x", "W", "b"], ["c"]), helper.make_node("Relu", ["c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 24, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 88, 24, 96])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(b, "b")])
    start = time.perf_counter()
    model = pf.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), target="host")
    x = rng.standard_normal((1, 32, 24, 96)).astype(np.float32)
    y = model.run({"x": x})["y"]
    seconds = time.perf_counter() - start
    want = np.maximum(np.einsum("oc,nchw->nohw", W[:, :, 0, 0], x) + b[:, None, None], 0)
    assert np.allclose(y, want, atol=1e-4)
    np.save(sys.argv[1], y)
    print(json.dumps({"seconds": round(seconds, 3), "kernels": cpu.STATS, "plans": model.plan_counts}))
""")

folder = tempfile.mkdtemp(prefix="polyfuse-example-cache-")
os.environ["POLYFUSE_CACHE_DIR"] = folder      # for this process too
env = dict(os.environ)
outputs = []
for run in ("first", "second"):
    out = os.path.join(folder, f"{run}.npy")
    done = subprocess.run([sys.executable, "-c", CHILD, out], env=env, capture_output=True, text=True, check=True)
    print(f"{run} process: {done.stdout.strip()}")   # compiled, then loaded from disk
    outputs.append(np.load(out))
    counts = json.loads(done.stdout)["plans"]
    assert counts == ({"planned": 1, "templated": 0, "loaded": 0} if run == "first"
                      else {"planned": 0, "templated": 0, "loaded": 1}), counts
assert np.array_equal(outputs[0], outputs[1])
print("the second process's outputs are the first's, bit for bit")

# plans: one per set of input shapes; the model keeps the max_plans used last
rng = np.random.default_rng(1)
W = rng.standard_normal((64, 10)).astype(np.float32)
graph = helper.make_graph(
    [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])], [numpy_helper.from_array(W, "W")])
model = pf.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), target="host",
                   max_plans=3)
for batch in range(1, 7):
    x = rng.standard_normal((batch, 64)).astype(np.float32)
    assert np.allclose(model.run({"x": x})["y"], x @ W, atol=1e-4)
kept = [shapes["x"][0] for shapes in model.planned_shapes]
print(f"6 batch sizes run; plans kept for batches {kept} (max_plans=3; by default "
      f"{pf.compile(helper.make_model(graph)).max_plans})")
assert kept == [4, 5, 6]

for action in ("info", "clear", "info"):   # the command line's `polyfuse cache [info|clear]`
    print(f"polyfuse cache {action}: ", end="", flush=True)
    main(["cache", action])
shutil.rmtree(folder)
