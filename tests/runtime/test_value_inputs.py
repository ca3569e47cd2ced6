"""A plan is specialized to the values of an input only where a lowering needs them: token
ids, positions, masks and a Gather's indices stay data (one plan serves every value), while
a Reshape's shape fed at run time, or a value computed from such an input, is planned per
value, and ``dump("plan")`` names the inputs a plan holds."""

import numpy as np
from onnx import TensorProto, helper

import polyfuse as pf
from tests.onnx.ort_compare import onnxruntime_outputs
from tests.onnx.test_models import make_model

RNG = np.random.default_rng(11)
node = helper.make_node


def embedding_model():
    """Token and position embeddings, a padding mask as an additive bias, and a layer
    norm: what a BERT encoder's first step reads from its int64 inputs."""
    init = {"tok": RNG.standard_normal((100, 16)).astype(np.float32),
            "pos": RNG.standard_normal((32, 16)).astype(np.float32),
            "g": np.ones(16, np.float32), "b": np.zeros(16, np.float32), "big": np.float32(-30),
            "one": np.float32(1), "axes": np.array([2], np.int64)}
    nodes = [node("Gather", ["tok", "ids"], ["t"]), node("Gather", ["pos", "positions"], ["p"]),
             node("Add", ["t", "p"], ["e"]), node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
             node("Sub", ["one", "m"], ["pad"]), node("Mul", ["pad", "big"], ["bias"]),
             node("Unsqueeze", ["bias", "axes"], ["bias3"]), node("Add", ["e", "bias3"], ["eb"]),
             node("LayerNormalization", ["eb", "g", "b"], ["y"], axis=-1)]
    ints = {n: (TensorProto.INT64, ["batch", "seq"]) for n in ("ids", "positions", "mask")}
    return make_model(nodes, ints, {"y": (TensorProto.FLOAT, ["batch", "seq", 16])}, init)


def token_feed(batch, seq):
    mask = np.ones((batch, seq), np.int64)
    mask[-1, seq // 2:] = 0
    return {"ids": RNG.integers(0, 100, (batch, seq)).astype(np.int64),
            "positions": np.broadcast_to(np.arange(seq, dtype=np.int64), (batch, seq)).copy(), "mask": mask}


def test_new_token_ids_reuse_the_plan():
    m = embedding_model()
    compiled = pf.compile(m, target="host")
    for _ in range(4):                        # new ids, positions and masks of one shape
        feed = token_feed(1, 7)
        np.testing.assert_allclose(compiled.run(feed)["y"], onnxruntime_outputs(m, feed)[0], rtol=1e-4, atol=1e-4)
    assert compiled.planned_shapes == [{"ids": (1, 7), "mask": (1, 7), "positions": (1, 7)}]
    plan = compiled.dump("plan")
    assert "specialized" not in plan and "Gather" in compiled.dump("kernels")
    feed = token_feed(2, 5)                   # a new shape: one more plan
    np.testing.assert_allclose(compiled.run(feed)["y"], onnxruntime_outputs(m, feed)[0], rtol=1e-4, atol=1e-4)
    assert len(compiled.planned_shapes) == 2


def test_a_shape_fed_at_run_time_specializes_the_plan_to_it_alone():
    """Reshape(x, shape): the plan holds the value of ``shape``, never of the ids gathered
    alongside; a second Reshape's shape computed from ``k`` is computed at run time and
    the nodes after it planned for its value."""
    init = {"table": RNG.standard_normal((50, 4)).astype(np.float32), "rows": np.array([-1], np.int64),
            "axes": np.array([0], np.int64)}
    nodes = [node("Reshape", ["x", "shape"], ["r"]), node("Gather", ["table", "ids"], ["g"]),
             node("Unsqueeze", ["k", "axes"], ["k1"]), node("Concat", ["rows", "k1"], ["shape2"], axis=0),
             node("Reshape", ["g", "shape2"], ["h"])]
    m = make_model(nodes, {"x": (TensorProto.FLOAT, [6, 4]), "shape": (TensorProto.INT64, [2]),
                           "ids": (TensorProto.INT64, [6]), "k": (TensorProto.INT64, [])},
                   {"r": (TensorProto.FLOAT, ["r0", "r1"]), "h": (TensorProto.FLOAT, ["h0", "h1"])}, init)
    compiled = pf.compile(m, target="host")
    x = RNG.standard_normal((6, 4)).astype(np.float32)
    for shape, k in (((3, 8), 2), ((3, 8), 2), ((8, 3), 2), ((8, 3), 6)):
        feed = {"x": x, "shape": np.array(shape, np.int64), "ids": RNG.integers(0, 50, 6).astype(np.int64),
                "k": np.array(k, np.int64)}
        for got, want in zip(compiled.run(feed).values(), onnxruntime_outputs(m, feed)):
            np.testing.assert_allclose(got, want, rtol=1e-6)
    plan = compiled.dump("plan")
    assert "  specialized to the values of %shape\n" in plan and "planned once the values it needs" in plan
    assert len(compiled.planned_shapes) == 2   # one per shape; none per ids
