"""A compiled model and a kernel called from several threads at once give the
single-threaded results, and two processes compiling into one empty cache both succeed
and leave a valid cache, from which two more processes at once run what they compiled."""

import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from polyfuse.runtime import cache, cpu
from polyfuse.runtime.program import Layout

THREADS = 4
CALLS = 25
RNG = np.random.default_rng(7)
W1 = RNG.standard_normal((16, 24)).astype(np.float32)
B1 = RNG.standard_normal(24).astype(np.float32)
W2 = RNG.standard_normal((24, 5)).astype(np.float32)


def mlp():
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["h2"]),
             helper.make_node("Relu", ["h2"], ["h3"]), helper.make_node("MatMul", ["h3", "W2"], ["y"])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 5])],
        [numpy_helper.from_array(W1, "W1"), numpy_helper.from_array(B1, "b1"),
         numpy_helper.from_array(W2, "W2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def in_threads(work):
    """``work(thread)`` in THREADS threads started together; their results in order
    (an exception in a thread is raised here)."""
    start = threading.Barrier(THREADS)
    results: list = [None] * THREADS

    def body(t):
        start.wait()
        try:
            results[t] = work(t)
        except BaseException as err:   # re-raised below, in the test's thread
            results[t] = err
    threads = [threading.Thread(target=body, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(300)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def forget_kernels(monkeypatch, tmp_path):
    """Nothing compiled in this process or on disk: the next calls compile their kernels."""
    monkeypatch.setattr(cpu, "_COMPILED", {})
    folder = tmp_path / f"cache{len(list(tmp_path.iterdir()))}"
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", str(folder))


def inputs(t):
    """Thread ``t``'s inputs: batches of sizes shared with other threads and its own."""
    rng = np.random.default_rng(100 + t)
    return [rng.standard_normal(((1, 8, 3 + t)[k % 3], 16)).astype(np.float32) for k in range(CALLS)]


def test_one_model_from_four_threads_gives_the_single_threaded_results(monkeypatch, tmp_path):
    feeds = [inputs(t) for t in range(THREADS)]
    forget_kernels(monkeypatch, tmp_path)
    alone = pf.compile(mlp(), target="host")
    want = [[alone.run({"x": x})["y"] for x in xs] for xs in feeds]
    for xs, ys in zip(feeds, want):
        for x, y in zip(xs, ys):
            np.testing.assert_allclose(y, np.maximum(x @ W1 + B1, 0) @ W2, rtol=1e-4, atol=1e-4)
    forget_kernels(monkeypatch, tmp_path)
    shared = pf.compile(mlp(), target="host")   # its plans and kernels are made by the threads
    got = in_threads(lambda t: [shared.run({"x": x})["y"] for x in feeds[t]])
    for t in range(THREADS):
        for g, w in zip(got[t], want[t]):
            np.testing.assert_array_equal(g, w)


TC = """
def mm_bias(float(M,K) A, float(K,N) B, float(N) c) -> (C) {
    C(m, n) +=! A(m, k) * B(k, n)
    C(m, n) = C(m, n) + c(n)
}
"""


def tc_inputs(t):
    rng = np.random.default_rng(200 + t)
    shapes = [(5, 7, 3), (9, 4, 6 + t)]   # one shape every thread uses, one of its own
    return [tuple(rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (n,)))
            for m, k, n in (shapes[j % 2] for j in range(CALLS))]


def test_one_kernel_from_four_threads_gives_the_single_threaded_results(monkeypatch, tmp_path):
    args = [tc_inputs(t) for t in range(THREADS)]
    forget_kernels(monkeypatch, tmp_path)
    alone = pf.define(TC, target="host").mm_bias
    want = [[alone(*a) for a in per] for per in args]
    for per, ws in zip(args, want):
        for (a, b, c), w in zip(per, ws):
            np.testing.assert_allclose(w, a @ b + c, rtol=1e-5, atol=1e-5)
    forget_kernels(monkeypatch, tmp_path)
    shared = pf.define(TC, target="host").mm_bias

    def work(t):
        out = []
        for j, a in enumerate(args[t]):
            if j % 5 == 4:   # some calls write into the caller's array
                given = np.empty_like(want[t][j])
                assert shared(*a, out=given) is given
                out.append(given)
            else:
                out.append(shared(*a))
        return out
    got = in_threads(work)
    for t in range(THREADS):
        for g, w in zip(got[t], want[t]):
            np.testing.assert_array_equal(g, w)


PROCESS = textwrap.dedent("""
    import json, sys
    import numpy as np
    import polyfuse as pf
    from polyfuse.runtime import cpu
    sys.path.insert(0, sys.argv[1])
    from test_concurrency import TC, mlp, W1, B1, W2
    x = np.random.default_rng(3).standard_normal((6, 16)).astype(np.float32)
    y = pf.compile(mlp(), target="host").run({"x": x})["y"]
    np.testing.assert_allclose(y, np.maximum(x @ W1 + B1, 0) @ W2, rtol=1e-4, atol=1e-4)
    a, b, c = (np.full(s, 0.5, np.float32) for s in ((4, 3), (3, 2), (2,)))
    np.testing.assert_allclose(pf.define(TC, target="host").mm_bias(a, b, c), a @ b + c)
    print(json.dumps(cpu.STATS))
""")


def test_two_processes_compiling_into_one_empty_cache(tmp_path, monkeypatch):
    env = {**os.environ, "POLYFUSE_CACHE_DIR": str(tmp_path / "cache")}
    here = os.path.dirname(__file__)

    def start():
        return subprocess.Popen([sys.executable, "-c", PROCESS, here], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    procs = [start(), start()]
    stats = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        stats.append(json.loads(out.strip().splitlines()[-1]))
    kernels = stats[0]["compiled"] + stats[0]["disk"]
    assert kernels > 0 and all(s["compiled"] + s["disk"] == kernels for s in stats)
    entries = sorted((tmp_path / "cache").glob("*.json"))
    assert len(entries) == kernels
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", str(tmp_path / "cache"))
    assert all(cache.load(e.stem, Layout) is not None for e in entries)   # every digest checks out
    third = start()
    out, err = third.communicate(timeout=300)
    assert third.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1]) == {"compiled": 0, "disk": kernels, "memory": 0}


RACED = ["detection", "recognition_head", "token_embedding", "control_flow", "tc_kernels"]


def test_two_processes_at_once_cold_then_two_at_once_warm(tmp_path):
    """tests/runtime/warm_cases.py's models (packed operands at widths that are not whole
    panels, checked gathers, control flow) in two processes racing to fill one cache,
    then in two loading every kernel from it at once: the same outputs, bit for bit."""
    env = {**os.environ, "POLYFUSE_CACHE_DIR": str(tmp_path / "cache")}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def pair(run):
        procs = [subprocess.Popen([sys.executable, "-m", "tests.runtime.warm_cases", str(tmp_path / f"{run}{k}.npz"),
                                   *RACED], cwd=root, env=env, text=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE) for k in range(2)]
        stats = []
        for p in procs:
            out, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-3000:]
            stats.append(json.loads(out.strip().splitlines()[-1])["cpu"])
        return stats
    cold = pair("cold")
    kernels = cold[0]["compiled"] + cold[0]["disk"]
    assert kernels >= 10 and all(s["compiled"] + s["disk"] == kernels for s in cold), cold
    assert pair("warm") == [{"compiled": 0, "disk": kernels, "memory": cold[0]["memory"]}] * 2
    want = np.load(tmp_path / "cold0.npz")
    for run in ("cold1", "warm0", "warm1"):
        got = np.load(tmp_path / f"{run}.npz")
        assert got.files == want.files
        for name in want.files:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{run}: {name}")
