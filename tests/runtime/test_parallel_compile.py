"""A model's kernels compile on several threads (one scheduled while another's machine
code is made) into the same code and results as on one; the first failing kernel's
error is the one raised; a kernel asked for by several threads at once compiles once."""

import sys
import threading
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from polyfuse.runtime import cache, cpu
from polyfuse.runtime import compile_threads

RNG = np.random.default_rng(11)
W = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32) * 0.3
M = RNG.standard_normal((8 * 6 * 6, 10)).astype(np.float32) * 0.1


def convnet():
    """Conv -> Relu -> MaxPool -> Flatten -> MatMul -> Softmax: several kernels of
    different texts."""
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("MatMul", ["f", "M"], ["m"]),
             helper.make_node("Softmax", ["m"], ["y"], axis=-1)]
    graph = helper.make_graph(
        nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(M, "M")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def numpy_convnet(x):
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    c = np.zeros((2, 8, 12, 12), np.float64)
    for kh in range(3):
        for kw in range(3):
            c += np.einsum("nchw,fc->nfhw", xp[:, :, kh:kh + 12, kw:kw + 12], W[:, :, kh, kw])
    p = np.maximum(c, 0).reshape(2, 8, 6, 2, 6, 2).max(axis=(3, 5))
    m = p.reshape(2, -1) @ M
    e = np.exp(m - m.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def run_compiled_on(threads, x, monkeypatch, tmp_path):
    """The model's output for ``x``, compiled with nothing cached on ``threads`` threads
    (at its first run); the names of the threads that wrote its kernels' LLVM IR, and
    each kernel's IR by name."""
    monkeypatch.setattr(cpu, "_COMPILED", {})
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", str(tmp_path / f"cache{threads}"))
    monkeypatch.setattr(compile_threads, "THREADS", threads)
    names, texts = set(), {}
    emit = cpu.emit_llvm

    def recorded(kernel, target, num_threads=0):
        names.add(threading.current_thread().name)
        text = texts[kernel.name] = emit(kernel, target, num_threads)
        return text
    monkeypatch.setattr(cpu, "emit_llvm", recorded)
    y = pf.compile(convnet(), target="host").run({"x": x})["y"]
    monkeypatch.setattr(cpu, "emit_llvm", emit)
    return y, names, texts


def test_a_models_kernels_compile_on_three_threads_as_on_one(monkeypatch, tmp_path):
    x = RNG.standard_normal((2, 4, 12, 12)).astype(np.float32)
    interval = sys.getswitchinterval()
    want, one_names, one_texts = run_compiled_on(1, x, monkeypatch, tmp_path)
    np.testing.assert_allclose(want, numpy_convnet(x), rtol=1e-4, atol=1e-6)
    got, three_names, three_texts = run_compiled_on(3, x, monkeypatch, tmp_path)
    assert len(one_texts) >= 3 and len(one_names) == 1
    assert len(three_names) > 1 and all(n.startswith("polyfuse-compile") for n in three_names)
    assert three_texts == one_texts   # the same code, whichever thread made it
    np.testing.assert_array_equal(got, want)
    assert sys.getswitchinterval() == interval   # restored after compiling


@pytest.mark.unit
def test_the_first_failing_kernels_error_is_raised():
    done = []

    def work(i):
        if i == 1:
            time.sleep(0.05)   # fails after item 3 has
            raise ValueError("item 1")
        if i == 3:
            raise KeyError("item 3")
        done.append(i)
    for threads in (1, 3):
        with pytest.raises(ValueError, match="item 1"):
            compile_threads.each(work, [0, 1, 2, 3], threads)
    assert 0 in done


@pytest.mark.unit
def test_a_kernel_asked_for_by_four_threads_compiles_once():
    memory, stats, made = cache.Resident(), {"compiled": 0, "disk": 0, "memory": 0}, []
    start = threading.Barrier(4)

    class Made:
        pass

    def compile_slowly():
        made.append(threading.current_thread().name)
        time.sleep(0.05)
        return Made()
    results = [None] * 4

    def ask(t):
        start.wait()
        results[t] = cache.fetch("key", memory, stats, object, lambda obj, layout, stages: None, compile_slowly)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cache, "load", lambda key, kind: None)   # nothing on disk
        threads = [threading.Thread(target=ask, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
    assert len(made) == 1 and all(r is results[0] for r in results)
    assert stats == {"compiled": 1, "disk": 0, "memory": 3}
