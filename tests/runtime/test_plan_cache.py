"""A model keeps its max_plans most recently used plans: older ones are dropped with
their memory (packed weights, programs, kernels no kept plan uses), and memory stays
bounded however many shapes a model is called at."""

import gc
import weakref

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from polyfuse.runtime import cache
from polyfuse.runtime.model import MAX_PLANS

RNG = np.random.default_rng(0)
W = (RNG.standard_normal((256, 2000)) * 0.05).astype(np.float32)


def two_part_model():
    """A product by constant weights on a fixed-shape input (its kernel is the same in
    every plan; each plan packs its own copy of the 2 MB of weights) and an activation
    on an input whose length varies."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("Tanh", ["z"], ["t"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 2000]),
         helper.make_tensor_value_info("t", TensorProto.FLOAT, ["n"])],
        [numpy_helper.from_array(W, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def call(model, n, x):
    z = RNG.standard_normal(n).astype(np.float32)
    out = model.run({"x": x, "z": z})
    np.testing.assert_allclose(out["t"], np.tanh(z), rtol=1e-5, atol=1e-6)
    return out


def test_two_hundred_shapes_keep_memory_bounded(monkeypatch, tmp_path):
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", "")     # nothing from the disk: every shape compiles
    monkeypatch.setattr(cache, "RECENT", 8)
    # a kernel per shape (with symbolic sizes, the activation's would serve every n)
    model = pf.compile(two_part_model(), target="host", max_plans=6, sizes="specialized")
    x = RNG.standard_normal((64, 256)).astype(np.float32)
    np.testing.assert_allclose(call(model, 1, x)["y"], x @ W, rtol=1e-4, atol=1e-4)
    first = next(iter(model._plans.values()))
    product = next(k.run for _, k in first.steps() if "MatMul" in k.stages["source"] or k.output_shapes == ((64, 2000),))
    activation = weakref.ref(next(k.run for _, k in first.steps() if k.output_shapes == ((1,),)))
    packed = [a for name, a in first.program.layout.constants.items() if name.startswith("W=")]
    assert packed and sum(a.nbytes for a in packed) >= W.nbytes   # each plan's own copy
    first = weakref.ref(first)
    for n in range(2, 31):
        call(model, n, x)
    gc.collect()
    settled = resident_mib()
    for n in range(31, 201):
        call(model, n, x)
    gc.collect()
    grown = resident_mib() - settled
    assert len(model.planned_shapes) == 6
    assert first() is None and activation() is None    # dropped, and its own kernel unloaded
    kept = [k.run for p in model._plans.values() for _, k in p.steps() if k.output_shapes == ((64, 2000),)]
    assert all(run is product for run in kept)            # the shared kernel stayed, compiled once
    # 170 more plans of 2 MB of packed weights each, had they been kept: 340 MB
    assert grown < 40, f"resident memory grew {grown:.0f} MiB over 170 new shapes"
    np.testing.assert_allclose(call(model, 1, x)["y"], x @ W, rtol=1e-4, atol=1e-4)   # planned again


def test_the_least_recently_used_plan_goes_first():
    model = pf.compile(two_part_model(), target="host", max_plans=2)
    x = RNG.standard_normal((64, 256)).astype(np.float32)
    for n in (3, 4, 3, 5):    # 3 is used again after 4, so 4 is the one dropped
        call(model, n, x)
    assert [shapes["z"] for shapes in model.planned_shapes] == [(3,), (5,)]
    model.max_plans = 1
    assert [shapes["z"] for shapes in model.planned_shapes] == [(5,)]
    assert MAX_PLANS == pf.compile(two_part_model(), target="host").max_plans


@pytest.mark.unit
@pytest.mark.parametrize("bad", [0, -1, 2.5, "8", True, None])
def test_max_plans_is_a_positive_int(bad):
    with pytest.raises(pf.OptionError, match="max_plans"):
        pf.compile(two_part_model(), target="host", max_plans=bad)


@pytest.mark.unit
def test_a_tc_kernel_keeps_its_latest_specializations(monkeypatch):
    """A TC kernel called at many sizes keeps the SPECIALIZATIONS latest; a size it let
    go is specialized again when it comes back, with the same results."""
    from polyfuse.runtime import kernel as kernel_module
    monkeypatch.setattr(kernel_module, "SPECIALIZATIONS", 4)
    scale = pf.define("def scale(float(N) A) -> (B) { B(i) = A(i) * 2.0 + 1.0 }").scale
    for n in (*range(1, 11), 2, 10):
        a = RNG.standard_normal(n).astype(np.float32)
        np.testing.assert_allclose(scale(a), a * 2 + 1, rtol=1e-6)
        assert len(scale._cache) <= 4
    assert len(scale._cache) == 4
