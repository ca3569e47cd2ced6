"""Random arguments to compiled models and kernels, right and wrong: special values,
other shapes, ranks and dtypes, missing and extra inputs, lists, scalars, strings,
None, non-contiguous and read-only arrays, empty dimensions, out-of-range indices.

The subjects compile once per process: two ONNX models (an MLP with a symbolic batch,
an embedding lookup whose indices come from the feed) against onnxruntime, and three TC
kernels (matmul, an indirect read, a softmax) against the reference interpreter."""

from __future__ import annotations

import functools

import numpy as np
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from polyfuse.runtime.model import CompiledModel

from tests.fuzz.onnx_cases import onnxruntime_run
from tests.fuzz.outcomes import Tally, judge, outcome_of
from tests.onnx.test_frontend import mlp

KERNELS = """
def matmul(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }
def lookup(float(V, D) E, int32(B) Idx, float alpha) -> (O) { O(b, d) = alpha * E(Idx(b), d) }
def softmax(float(N, D) I) -> (O, mx, sm) {
  mx(n) max=! I(n, d)
  sm(n) +=! exp(I(n, d) - mx(n))
  O(n, d) = exp(I(n, d) - mx(n)) / sm(n)
}
"""
# subject -> (argument shapes with their size names, dtypes)
SIGNATURES = {
    "mlp": {"x": (("B", 16), np.float32)},
    "embedding": {"ids": (("B", "S"), np.int64)},
    "matmul": {"A": (("M", "K"), np.float32), "B": (("K", "N"), np.float32)},
    "lookup": {"E": (("V", "D"), np.float32), "Idx": (("B",), np.int32), "alpha": ((), float)},
    "softmax": {"I": (("N", "D"), np.float32)},
}
SPECIAL = [np.nan, np.inf, -np.inf, 1e38, -1e38, 1e-45, 0.0, -0.0, 3e4]


def embedding_model():
    table = np.random.default_rng(3).standard_normal((10, 4)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="gather"),
             helper.make_node("ReduceSum", ["e", "axes"], ["y"], name="sum", keepdims=0)]
    graph = helper.make_graph(
        nodes, "embedding", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 4])],
        [numpy_helper.from_array(table, "table"),
         numpy_helper.from_array(np.asarray([1], np.int64), "axes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model.SerializeToString()


@functools.cache
def model_bytes(name: str) -> bytes:
    if name == "mlp":
        m = mlp()
        m.ir_version = 10
        return m.SerializeToString()
    return embedding_model()


@functools.cache
def compiled(name: str, target: str):
    if name in ("mlp", "embedding"):
        return pf.compile(model_bytes(name), target=target)
    return getattr(pf.define(KERNELS, target=target), name)


@st.composite
def value(draw, shape_names, dtype, sizes):
    """A right argument, or now and then a wrong one."""
    shape = tuple(sizes[s] if isinstance(s, str) else s for s in shape_names)
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    if dtype is float:
        return draw(st.sampled_from([0.5, -2.0, 1e30, float("nan"), 3, True, "1", None,
                                     np.float32(2), np.float64(1e300), [1.0], 2**70]))
    if np.issubdtype(dtype, np.integer):
        a = rng.integers(-1, 12, size=shape).astype(dtype)
        if draw(st.integers(0, 3)) == 0 and a.size:
            a.flat[0] = draw(st.sampled_from([-2**31, 2**31 - 1, 10, -11, 2**40 % 2**31]))
    else:
        a = rng.standard_normal(shape).astype(dtype)
        if draw(st.booleans()) and a.size:
            a.flat[draw(st.integers(0, a.size - 1))] = draw(st.sampled_from(SPECIAL))
    wrong = draw(st.integers(0, 24))
    if wrong == 0:
        return a.astype(np.float64 if a.dtype != np.float64 else np.float32)
    if wrong == 1:
        return a.reshape(a.shape + (1,))
    if wrong == 2:
        return a.tolist()
    if wrong == 3:
        return np.asfortranarray(a)
    if wrong == 4 and a.ndim:
        return np.repeat(a, 2, axis=-1)[..., ::2]  # a strided view
    if wrong == 5:
        a.setflags(write=False)
        return a
    if wrong == 6:
        return draw(st.sampled_from([None, "x", 1.5, b"\x00", object(), np.array(["a"]),
                                     np.array([object()])]))
    if wrong == 7:
        return a.astype(np.int32 if a.dtype.kind == "f" else np.float32)
    if wrong == 8 and a.ndim:
        return np.zeros((0,) + a.shape[1:], a.dtype)
    return a


@st.composite
def cases(draw):
    name = draw(st.sampled_from(sorted(SIGNATURES)))
    signature = SIGNATURES[name]
    sizes = {s: draw(st.integers(1, 5)) for s in "BSMKNVD"}
    args = {k: draw(value(shape, dtype, sizes)) for k, (shape, dtype) in signature.items()}
    form = draw(st.integers(0, 9))
    if form == 0 and args:
        args.pop(draw(st.sampled_from(sorted(args))))
    elif form == 1:
        args["extra"] = np.ones(2, np.float32)
    return name, args, draw(st.integers(0, 3)) == 0  # positional?


def _describe(v) -> str:
    if isinstance(v, np.ndarray):
        return f"{v.dtype}{v.shape}{'' if v.flags.c_contiguous else ' strided'}"
    return type(v).__name__ if isinstance(v, (list, object)) and not isinstance(v, (int, float)) \
        else repr(v)


def _run(subject, args: dict, positional: bool) -> list:
    """Call a model (``run`` with a dict, or positionally) or a kernel (by keyword or
    positionally)."""
    if isinstance(subject, CompiledModel):
        return [subject(*args.values())] if positional else list(subject.run(args).values())
    return subject(*args.values()) if positional else subject(**args)


def run_case(case, target: str, tally: Tally) -> None:
    name, args, positional = case
    label = f"{name} positional={positional} " + ", ".join(f"{k}: {_describe(v)}"
                                                           for k, v in args.items())
    is_model = name in ("mlp", "embedding")
    if is_model:
        want = outcome_of(lambda: onnxruntime_run(model_bytes(name), args))
    else:
        want = outcome_of(lambda: _run(compiled(name, "reference"), args, positional))
        if want[0] == "raw":
            return tally.record("raw", "reference: " + label, want[1])
    extreme = any(isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.size
                  and not (np.isfinite(v).all() and np.abs(v).max() < 1e30) for v in args.values())
    judge(tally, want, outcome_of(lambda: _run(compiled(name, target), args, positional)), label,
          reference_refused="lenient" if is_model else "wrong", finite_only=extreme)
