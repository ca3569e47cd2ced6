"""Split-k on the GPU (issue 37): a deep sum over few output tiles runs in slices on
blocks of their own, then a second launch adds the slices (``MappingOptions.split_k``,
chosen by the heuristic where the tiles fill less than half the GPU, and a tuning gene).
Checked on the rewrite itself, the heuristic and the space, and on the emulator against
numpy and onnxruntime at sizes no tile divides, with epilogues, 16-bit operands and in
a model (whose scratch sums live in the program's arena)."""

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto

import polyfuse as pf
from polyfuse.autotune.space import SearchSpace
from polyfuse.autotune.task import Task
from polyfuse.frontends.tc import parse_definition
from polyfuse.scheduler.gpu_heuristics import default_gpu_options
from polyfuse.scheduler.gpu_split import MIN_SLICE, split_options, split_reductions
from polyfuse.scheduler.options import MappingOptions
from tests.cuda.test_emulated import emulated  # noqa: F401

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"


@pytest.mark.unit
def test_a_sum_splits_into_slices_and_a_sum_of_them():
    split, scratch, position = split_reductions(parse_definition(MM), {"M": 8, "K": 256, "N": 8}, 4)
    assert scratch == ("C_parts",) and position == 2
    assert str(split) == str(parse_definition("""
def mm(float(M,K) A, float(K,N) B) -> (C, C_parts) {
  C_parts(m, n, k_part) +=! A(m, k_part * 64 + k) * B(k_part * 64 + k, n) where k in 0:64, k_part in 0:4
  C(m, n) +=! C_parts(m, n, k_part)
}"""))


@pytest.mark.unit
@pytest.mark.parametrize("source, sizes", [
    (MM, {"M": 8, "K": 250, "N": 8}),                     # 4 does not divide the depth
    (MM, {"M": 8, "K": 4 * MIN_SLICE // 16 - 4, "N": 8}),   # nor this
    (MM, {"M": 8, "K": 32, "N": 8}),                      # slices too short
    ("def mx(float(M,K) A) -> (C) { C(m) max=! A(m, k) }", {"M": 8, "K": 256}),
    ("def two(float(M,K,L) A) -> (C) { C(m) +=! A(m, k, l) }", {"M": 8, "K": 64, "L": 64}),
    ("def cnt(int32(M,K) A) -> (C) { C(m) +=! A(m, k) }", {"M": 8, "K": 256}),
], ids=["indivisible", "indivisible-2", "shallow", "max", "two-indices", "integers"])
def test_sums_that_do_not_split_stay(source, sizes):
    d = parse_definition(source)
    assert split_reductions(d, sizes, 4) == (d, (), 0)


@pytest.mark.unit
def test_the_options_take_a_tile_of_one_for_the_slices():
    o = MappingOptions(tile_sizes=(32, 64, 16), tile_order=(1, 0, 2), point_order=(2, 0, 1), split_k=4)
    got = split_options(o, 2)
    assert got.tile_sizes == (32, 64, 1, 16)
    assert got.tile_order == (1, 0, 2, 3) and got.point_order == (2, 3, 0, 1)


@pytest.mark.unit
def test_the_heuristic_splits_where_the_tiles_leave_the_gpu_idle():
    d = parse_definition(MM)
    assert default_gpu_options(d, {"M": 128, "K": 4096, "N": 256}).split_k == 4
    assert default_gpu_options(d, {"M": 4096, "K": 4096, "N": 4096}).split_k == 1
    assert default_gpu_options(d, {"M": 128, "K": 300, "N": 256}).split_k == 1   # slices too short
    space = SearchSpace.for_task(Task.of(d, [np.zeros((128, 4096), np.float32), np.zeros((4096, 256), np.float32)],
                                         "cuda"))
    assert set(space.candidates["split_k"]) == {1, 2, 4, 8}
    assert space.default().split_k == 4 and space.is_valid(replace(space.default(), split_k=8))


def options_for(source, sizes, parts):
    return replace(default_gpu_options(parse_definition(source), sizes), split_k=parts)


@pytest.mark.parametrize("source, make, oracle", [
    (MM, lambda r: (r.standard_normal((130, 1024)), r.standard_normal((1024, 71))), lambda a, b: a @ b),
    ("def fc(float(M,K) A, float(K,N) B, float(N) bias) -> (C) {\n"
     "  C(m, n) +=! A(m, k) * B(k, n)\n  C(m, n) = max(C(m, n) + bias(n), 0.0)\n}",
     lambda r: (r.standard_normal((100, 512)), r.standard_normal((512, 90)), r.standard_normal(90)),
     lambda a, b, bias: np.maximum(a @ b + bias, 0)),
    ("def bmm(float(B,M,K) A, float(B,K,N) X) -> (C) { C(b, m, n) +=! A(b, m, k) * X(b, k, n) }",
     lambda r: (r.standard_normal((2, 70, 768)), r.standard_normal((2, 768, 66))), lambda a, x: a @ x),
], ids=["mm", "fc+relu", "bmm"])
def test_split_sums_run_right_on_the_emulator(source, make, oracle, emulated):  # noqa: F811
    args = tuple(a.astype(np.float32) for a in make(np.random.default_rng(0)))
    sizes = dict(zip(("M", "K", "N"), (args[0].shape[-2], args[0].shape[-1], args[1].shape[-1])))
    (kernel,) = pf.define(source, target="cuda", options=options_for(source, sizes | {"B": 2}, 4))
    spec = kernel.specialize(*args)
    assert "temp float32" in spec.stages["gpu"].splitlines()[0]   # the slices' sums: scratch, not an output
    got = kernel(*args)
    assert len(emulated.launches) >= 2
    np.testing.assert_allclose(got, oracle(*(a.astype(np.float64) for a in args)), rtol=1e-4, atol=1e-4)


def test_a_split_sum_of_bfloat16_operands_adds_float32_slices(emulated):  # noqa: F811
    source = "def mm(bfloat16(M,K) A, bfloat16(K,N) B) -> (C) { C(m, n) +=! float(A(m, k)) * float(B(k, n)) }"
    rng = np.random.default_rng(1)
    a = rng.standard_normal((100, 1024)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((1024, 96)).astype(ml_dtypes.bfloat16)
    (kernel,) = pf.define(source, target="cuda", options=options_for(source, {"M": 100, "K": 1024, "N": 96}, 8))
    assert "temp float32" in kernel.specialize(a, b).stages["gpu"].splitlines()[0]
    got = kernel(a, b)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-3)


def test_a_model_keeps_its_split_sums_in_the_arena(emulated):  # noqa: F811
    from tests.onnx.ort_compare import assert_matches_onnxruntime
    from tests.onnx.test_models import make_model, randn, weights
    from onnx import helper
    F = TensorProto.FLOAT
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
                        helper.make_node("Relu", ["hb"], ["y"])],
                       {"x": (F, [128, 2048])}, {"y": (F, [128, 256])}, {"w": weights(2048, 256), "b": randn(256)})
    compiled = pf.compile(model, target="cuda")
    compiled.run({"x": randn(128, 2048)})
    (step, kernel), = compiled.plan_for().steps()
    assert kernel.run.layout.scratch and kernel.stages["gpu"].count("launch ") >= 2
    assert_matches_onnxruntime(model, {"x": randn(128, 2048)}, 1e-4, 1e-4, target="cuda")
