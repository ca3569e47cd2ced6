"""A model called at new shapes compiles its kernels twice at most: the first shape's
for its sizes, the second shape's with the sizes that changed as parameters
(``compile(..., sizes="symbolic")``, the default on CPUs this process runs), and every
later shape binds them. Outputs against onnxruntime at every shape."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import polyfuse as pf
from polyfuse.runtime import cpu
from tests.onnx.ort_compare import onnxruntime_outputs
from tests.onnx.test_models import make_model

RNG = np.random.default_rng(5)
node = helper.make_node
WIDTH = 48


def attention_block():
    """A layer norm, a projection with bias and ReLU, a residual, and the rows' scores
    against each other through a softmax: contractions over the dynamic (batch, seq)
    rows with epilogues, and one over seq x seq."""
    init = {"W": (RNG.standard_normal((WIDTH, 80)) * 0.1).astype(np.float32),
            "b": (RNG.standard_normal(80) * 0.1).astype(np.float32),
            "V": (RNG.standard_normal((80, WIDTH)) * 0.1).astype(np.float32),
            "g": (1 + 0.1 * RNG.standard_normal(WIDTH)).astype(np.float32),
            "beta": (0.1 * RNG.standard_normal(WIDTH)).astype(np.float32), "scale": np.float32(0.125)}
    nodes = [node("LayerNormalization", ["x", "g", "beta"], ["n"], axis=-1),
             node("MatMul", ["n", "W"], ["nw"]), node("Add", ["nw", "b"], ["h"]), node("Relu", ["h"], ["r"]),
             node("MatMul", ["r", "V"], ["down"]), node("Add", ["down", "x"], ["y"]),
             node("Transpose", ["y"], ["yt"], perm=[0, 2, 1]), node("MatMul", ["y", "yt"], ["scores"]),
             node("Mul", ["scores", "scale"], ["scaled"]), node("Softmax", ["scaled"], ["p"], axis=-1),
             node("MatMul", ["p", "y"], ["z"])]
    return make_model(nodes, {"x": (TensorProto.FLOAT, ["batch", "seq", WIDTH])},
                      {"z": (TensorProto.FLOAT, ["batch", "seq", WIDTH])}, init)


def builds() -> int:
    return cpu.STATS["compiled"] + cpu.STATS["disk"]


def check(model, compiled, batch, seq):
    x = RNG.standard_normal((batch, seq, WIDTH)).astype(np.float32)
    got = compiled.run({"x": x})["z"]
    np.testing.assert_allclose(got, onnxruntime_outputs(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


SHAPES = [(2, 5), (3, 17), (2, 64), (4, 9), (3, 31), (5, 3), (2, 100), (6, 13)]


def test_later_shapes_run_the_kernels_compiled_for_symbolic_sizes(monkeypatch):
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", "")
    model = attention_block()
    compiled = pf.compile(model, target="host")
    counts = []
    for batch, seq in SHAPES:
        before = builds()
        check(model, compiled, batch, seq)
        counts.append(builds() - before)
    assert counts[0] > 0 and 0 < counts[1] <= counts[0]   # the first shape's, then the templates
    assert counts[2:] == [0] * (len(SHAPES) - 2)
    plan = compiled.dump("loops")
    assert "int64 S0" in plan      # the kernels take the sizes


def test_sizes_specialized_compiles_each_shape(monkeypatch):
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", "")
    model = attention_block()
    compiled = pf.compile(model, target="host", sizes="specialized")
    for batch, seq in ((7, 11), (3, 29), (9, 4)):   # shapes no other test compiled
        before = builds()
        check(model, compiled, batch, seq)
        assert builds() > before
    assert "int64 S0" not in compiled.dump("loops")


def test_sizes_is_checked():
    with pytest.raises(pf.errors.ArgumentError, match="sizes must be one of"):
        pf.compile(attention_block(), target="host", sizes="dynamic")


def test_elementwise_kernels_of_one_plan_that_differ_in_sizes_share_one_kernel(monkeypatch):
    """Issue 38: three normalize-and-ReLU chains over maps of different sizes (a DenseNet's
    over ever wider concatenations) compile one kernel for symbolic sizes, not three;
    a contraction of the same plan keeps a kernel of its own sizes."""
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", "")
    shapes = {"a": (2, 3, 5, 7), "b": (2, 3, 9, 4), "c": (2, 3, 6, 11)}
    init = {f"s{n}": RNG.uniform(0.5, 1.5, (3, 1, 1)).astype(np.float32) for n in shapes}
    init |= {f"t{n}": RNG.standard_normal((3, 1, 1)).astype(np.float32) for n in shapes}
    init["W"] = RNG.standard_normal((11, 5)).astype(np.float32)
    nodes = [n for k in shapes for n in (node("Mul", [k, f"s{k}"], [f"m{k}"]), node("Add", [f"m{k}", f"t{k}"], [f"n{k}"]),
                                         node("Relu", [f"n{k}"], [f"y{k}"]))]
    nodes.append(node("MatMul", ["yc", "W"], ["p"]))
    outputs = {f"y{k}": (TensorProto.FLOAT, s) for k, s in shapes.items()} | {"p": (TensorProto.FLOAT, (2, 3, 6, 5))}
    model = make_model(nodes, {k: (TensorProto.FLOAT, s) for k, s in shapes.items()}, outputs, init)
    compiled = pf.compile(model, target="host")
    feed = {k: RNG.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    got = compiled.run(feed)
    for name, want in zip(outputs, onnxruntime_outputs(model, feed)):
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
    plan = compiled.plan_for()
    chains = [g for st, g in zip(plan.plan.kernels, plan.generic) if "MatMul" not in st.label]
    assert len(chains) == 3 and all(g is not None for g in chains)
    assert len({id(g.kernel) for g in chains}) == 1   # one kernel for the three
    assert all(g is None for st, g in zip(plan.plan.kernels, plan.generic) if "MatMul" in st.label)
