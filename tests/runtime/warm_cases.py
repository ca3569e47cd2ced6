"""Kernels and models that a second process must run from the disk cache as the first
ran them compiling: ``python -m tests.runtime.warm_cases OUT.npz [CASE ...]`` runs
every case (or those named), checks each against its oracle (numpy, onnxruntime, or
what the model itself computes), writes the outputs to OUT.npz and prints, on its last
line, where the kernels came from (``{"cpu": cpu.STATS, "cuda": cuda.STATS}``).

The cases are the kinds of kernels whose cached records carry more than buffers:
constant operands packed ahead of time at widths that are not whole panels (the
shapes of the OCR, detection and speech models shipped in PyPI packages: 88, 240, 258,
360 and 8210 columns), reads checked at run time (gathers of token ids), control flow
(Loop and If), an ahead-of-time bundle, matrix tiles (bf16 products, on AMX tiles where
the host has them), and code for other targets (aarch64 under qemu, cuda compiled).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from tests.onnx.test_models import make_model as model

node = helper.make_node
CASES: dict[str, Callable[[], dict[str, np.ndarray]]] = {}


def case(fn: Callable[[], dict[str, np.ndarray]]) -> Callable[[], dict[str, np.ndarray]]:
    CASES[fn.__name__] = fn
    return fn


def against_onnxruntime(m: onnx.ModelProto, feed: dict[str, np.ndarray], tol: float = 1e-4,
                        **options) -> dict[str, np.ndarray]:
    """``m`` compiled for the host and run on ``feed``, checked against onnxruntime."""
    ours = pf.compile(m, target="host", **options).run(feed)
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    for (name, got), want in zip(ours.items(), theirs):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=name)
    return ours


def weights(rng, *shape, scale=None):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    return (rng.standard_normal(shape) * (scale or fan_in ** -0.5)).astype(np.float32)


def detection_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Convolutions whose constant weights and biases are packed in panels that the
    output channels do not fill: 88, 240 and 360 channels."""
    rng = np.random.default_rng(1)
    init = {"W0": weights(rng, 32, 3, 3, 3), "W1": weights(rng, 88, 32, 1, 1), "B1": weights(rng, 88, scale=0.1),
            "W2": weights(rng, 240, 88, 1, 1), "B2": weights(rng, 240, scale=0.1),
            "W3": weights(rng, 360, 240, 3, 3), "B3": weights(rng, 360, scale=0.1)}
    nodes = [node("Conv", ["x", "W0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2]), node("Relu", ["c0"], ["r0"]),
             node("Conv", ["r0", "W1", "B1"], ["c1"]), node("HardSigmoid", ["c1"], ["h1"]),
             node("Conv", ["h1", "W2", "B2"], ["c2"]), node("Relu", ["c2"], ["r2"]),
             node("Conv", ["r2", "W3", "B3"], ["y"], pads=[1, 1, 1, 1])]
    m = model(nodes, {"x": (TensorProto.FLOAT, [1, 3, 24, 48])}, {"y": (TensorProto.FLOAT, [1, 360, 12, 24])}, init)
    return m, {"x": rng.standard_normal((1, 3, 24, 48)).astype(np.float32)}


@case
def detection() -> dict[str, np.ndarray]:
    return against_onnxruntime(*detection_model(), tol=2e-3)


@case
def recognition_head() -> dict[str, np.ndarray]:
    """A sequence's features through a 258-wide Gemm and an 8210-way classifier."""
    rng = np.random.default_rng(2)
    init = {"Wa": weights(rng, 258, 96), "Ba": weights(rng, 258, scale=0.1),
            "Wb": weights(rng, 258, 8210), "Bb": weights(rng, 8210, scale=0.1)}
    nodes = [node("Gemm", ["x", "Wa", "Ba"], ["a"], transB=1), node("Relu", ["a"], ["r"]),
             node("MatMul", ["r", "Wb"], ["m"]), node("Add", ["m", "Bb"], ["z"]),
             node("Softmax", ["z"], ["y"], axis=-1)]
    m = model(nodes, {"x": (TensorProto.FLOAT, [20, 96])}, {"y": (TensorProto.FLOAT, [20, 8210])}, init)
    return against_onnxruntime(m, {"x": rng.standard_normal((20, 96)).astype(np.float32)})


@case
def token_embedding() -> dict[str, np.ndarray]:
    """Token ids gathered from a table (reads checked at run time), then a 88-wide layer;
    an id past the table is a BoundsError from the cached kernel as from a new one."""
    rng = np.random.default_rng(3)
    init = {"E": weights(rng, 500, 64, scale=1.0), "W": weights(rng, 64, 88)}
    nodes = [node("Gather", ["E", "ids"], ["e"], axis=0), node("MatMul", ["e", "W"], ["y"])]
    m = model(nodes, {"ids": (TensorProto.INT64, [2, 100])}, {"y": (TensorProto.FLOAT, [2, 100, 88])}, init)
    ids = rng.integers(0, 500, (2, 100)).astype(np.int64)
    out = against_onnxruntime(m, {"ids": ids})
    bad = ids.copy()
    bad[1, 7] = 500
    try:
        pf.compile(m, target="host").run({"ids": bad})
    except pf.BoundsError:
        return out
    raise AssertionError("an id past the table was not refused")


@case
def control_flow() -> dict[str, np.ndarray]:
    """A Loop whose trip count is an input, and an If on a condition computed from data."""
    body = helper.make_graph(
        [node("Mul", ["acc_in", "two"], ["doubled"]), node("Add", ["doubled", "x"], ["acc_out"]),
         node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [1]),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, [1]),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [3, 5])],
        [numpy_helper.from_array(np.float32(0.5), "two")])
    then = helper.make_graph([node("Neg", ["looped"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3, 5])])
    other = helper.make_graph([node("Sqrt", ["looped"], ["s"])], "else", [],
                              [helper.make_tensor_value_info("s", TensorProto.FLOAT, [3, 5])])
    nodes = [node("Loop", ["n", "yes", "x"], ["looped"], body=body),
             node("ReduceSum", ["looped"], ["total"], keepdims=0),
             node("Less", ["total", "zero"], ["negative"]),
             node("If", ["negative"], ["y"], then_branch=then, else_branch=other)]
    m = model(nodes, {"x": (TensorProto.FLOAT, [3, 5]), "n": (TensorProto.INT64, [])},
              {"y": (TensorProto.FLOAT, [3, 5])},
              {"yes": np.array([True]), "zero": np.float32(0)})
    rng = np.random.default_rng(4)
    out = {}
    for k, (n, sign) in enumerate(((3, 1), (5, -1))):
        x = (np.abs(rng.standard_normal((3, 5))) * sign).astype(np.float32)
        out |= {f"{name}{k}": v for name, v in against_onnxruntime(m, {"x": x, "n": np.array(n, np.int64)}).items()}
    return out


@case
def bundle() -> dict[str, np.ndarray]:
    """The detection model as an ahead-of-time bundle, linked from the cached kernels'
    code, built with the C compiler and run: it prints what the model returns."""
    m, feed = detection_model()
    compiled = pf.compile(m, target="x86")
    want = compiled.run(feed)["y"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        compiled.save_bundle(folder, "net", shapes={"x": feed["x"].shape})
        subprocess.run(["cc", "-O2", "-std=c11", str(folder / "main.c"), str(folder / "net.o"), "-o",
                        str(folder / "net_main"), "-lm"], check=True)
        feed["x"].tofile(folder / "x.bin")
        ran = subprocess.run([str(folder / "net_main"), str(folder / "net.weights.bin"), str(folder / "x.bin")],
                             capture_output=True, text=True, check=True)
    printed = np.array([float(v) for v in ran.stdout.splitlines()[1].split()], np.float32).reshape(want.shape)
    np.testing.assert_allclose(printed, want, rtol=1e-4, atol=1e-4)
    return {"y": printed}


TC = """
def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }
def embed(float(V, D) E, int64(B) Idx, float(D, H) W) -> (X, Y) {
  X(b, d) = E(Idx(b), d)
  Y(b, h) +=! X(b, d) * W(d, h)
}
def bmm(bfloat16(M, K) A, bfloat16(K, N) B) -> (C) { C(m, n) +=! float(A(m, k)) * float(B(k, n)) }
"""


@case
def tc_kernels() -> dict[str, np.ndarray]:
    """TC kernels: a product of 1000 columns, a checked gather, a bf16 product (matrix
    tiles where the host has them)."""
    import ml_dtypes
    rng = np.random.default_rng(5)
    mod = pf.define(TC, target="host")
    a, b = rng.standard_normal((70, 90)).astype(np.float32), rng.standard_normal((90, 1000)).astype(np.float32)
    c = mod.mm(a, b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-3)
    e, w = rng.standard_normal((50, 24)).astype(np.float32), rng.standard_normal((24, 40)).astype(np.float32)
    idx = rng.integers(0, 50, 33).astype(np.int64)
    x, y = mod.embed(e, idx, w)
    np.testing.assert_array_equal(x, e[idx])
    np.testing.assert_allclose(y, e[idx] @ w, rtol=1e-4, atol=1e-4)
    bf = ml_dtypes.bfloat16
    p, q = rng.standard_normal((64, 128)).astype(bf), rng.standard_normal((128, 48)).astype(bf)
    r = mod.bmm(p, q)
    np.testing.assert_allclose(r, p.astype(np.float32) @ q.astype(np.float32), rtol=1e-3, atol=1e-3)
    return {"mm": c, "x": x, "y": y, "bmm": np.asarray(r, np.float32)}


@case
def aarch64() -> dict[str, np.ndarray]:
    """A product packed for NEON, its object code run under qemu (where the tools are)."""
    from polyfuse.runtime.cross import c_compiler, runner_prefix
    target = pf.Target.parse("aarch64")
    try:
        runner_prefix(target), c_compiler(target)
    except pf.TargetError:
        return {}
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((12, 40)).astype(np.float32), rng.standard_normal((40, 90)).astype(np.float32)
    c = pf.define(TC, target="aarch64").mm(a, b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    return {"mm": c}


@case
def cuda() -> dict[str, np.ndarray]:
    """A product compiled for the GPU (no GPU needed): the cached kernel's texts."""
    a, b = np.ones((64, 96), np.float32), np.ones((96, 130), np.float32)
    k = pf.define(TC, target="cuda").mm.specialize(a, b)
    assert "__global__" in k.stages["cuda"]
    return {"ptx": np.frombuffer(k.stages["ptx"].encode(), np.uint8)}


def main(argv: list[str]) -> None:
    from polyfuse.runtime import cpu, cuda
    out, names = argv[0], argv[1:] or list(CASES)
    arrays = {}
    for name in names:
        arrays |= {f"{name}.{k}": v for k, v in CASES[name]().items()}
    np.savez(out, **arrays)
    print(json.dumps({"cpu": cpu.STATS, "cuda": cuda.STATS}))


if __name__ == "__main__":
    main(sys.argv[1:])
