"""A model planned at a new shape packs its weights once: plans whose kernels pack a
weight alike share one packed copy (runtime/program.py ``shared_packed_copy``), which
lives as long as the weight does. Checked against numpy at each shape."""

import gc

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from polyfuse.runtime import program


def _model(w: np.ndarray):
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", w.shape[0]])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", w.shape[1]])],
        [numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_plans_at_two_shapes_share_the_packed_weights():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 512)).astype(np.float32)
    model = pf.compile(_model(w), target="host")
    for rows in (256, 512):
        x = rng.standard_normal((rows, 256)).astype(np.float32)
        np.testing.assert_allclose(model(x), np.maximum(x.astype(np.float64) @ w, 0), rtol=1e-4, atol=1e-4)
    first, second = (dict(p.program.layout.constants) for p in model._plans.values())
    packed = [name for name in first if name.startswith("W=") and name in second]
    assert packed, "both plans pack the weight alike"
    assert all(first[name] is second[name] for name in packed)
    held = len(program._SHARED_PACKINGS)
    del model, first, second
    gc.collect()
    assert len(program._SHARED_PACKINGS) < held   # gone with the weights
