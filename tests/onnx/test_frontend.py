"""polyfuse.compile on ONNX models: loading, refusals, feeds, and an MLP against onnxruntime."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf


def mlp(batch="B"):
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((16, 32)).astype(np.float32)
    b1 = rng.standard_normal(32).astype(np.float32)
    w2 = rng.standard_normal((32, 4)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="fc1"),
             helper.make_node("Add", ["h", "b1"], ["h2"], name="bias1"),
             helper.make_node("Relu", ["h2"], ["h3"], name="relu1"),
             helper.make_node("MatMul", ["h3", "W2"], ["y"], name="fc2")]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(b1, "b1"),
         numpy_helper.from_array(w2, "W2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10  # what the installed onnxruntime reads
    return model


@pytest.mark.parametrize("target", ["reference", "host"])
def test_mlp_matches_onnxruntime(target, tmp_path):
    model = mlp()
    path = tmp_path / "mlp.onnx"
    onnx.save(model, str(path))
    x = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    for source in (model, str(path), model.SerializeToString()):
        compiled = pf.compile(source, target=target)
        np.testing.assert_allclose(compiled.run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(compiled(x[:3]), want[:3], rtol=1e-4, atol=1e-5)  # another batch
    assert [v.name for v in compiled.inputs] == ["x"] and [v.name for v in compiled.outputs] == ["y"]


@pytest.mark.unit
def test_missing_file_and_bad_bytes(tmp_path):
    with pytest.raises(pf.ModelError, match="no model file"):
        pf.compile(str(tmp_path / "nope.onnx"))
    with pytest.raises(pf.ModelError):
        pf.compile(b"this is not a protobuf at all \x00\xff")
    data = mlp().SerializeToString()
    with pytest.raises(pf.ModelError):
        pf.compile(data[: len(data) // 2])


@pytest.mark.unit
def test_missing_initializer_is_a_model_error():
    model = mlp()
    del model.graph.initializer[0]
    with pytest.raises(pf.ModelError, match="W1"):
        pf.compile(model)


@pytest.mark.unit
def test_every_unsupported_op_is_listed_at_once():
    nodes = [helper.make_node("MatMul", ["x", "x"], ["a"], name="mm"),
             helper.make_node("Foo", ["a"], ["b"], name="foo1", domain="custom.ops"),
             helper.make_node("Bernoulli", ["b"], ["c"], name="coin1"),
             helper.make_node("Bernoulli", ["c"], ["d"], name="coin2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info("d", TensorProto.FLOAT, [2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("custom.ops", 1)])
    with pytest.raises(pf.UnsupportedOpError) as info:
        pf.compile(model)
    message = str(info.value)
    for word in ("custom.ops.Foo", "foo1", "Bernoulli", "coin1", "coin2"):
        assert word in message


@pytest.mark.unit
def test_bad_feeds_are_refused_before_running():
    compiled = pf.compile(mlp(), target="host")
    x = np.zeros((2, 16), np.float32)
    with pytest.raises(pf.ArgumentError, match="missing"):
        compiled.run({})
    with pytest.raises(pf.ArgumentError, match="unknown"):
        compiled.run({"x": x, "z": x})
    with pytest.raises(pf.DTypeError, match="float32"):
        compiled.run({"x": x.astype(np.float64)})
    with pytest.raises(pf.ShapeError, match="shape"):
        compiled.run({"x": np.zeros((2, 15), np.float32)})
    with pytest.raises(pf.ArgumentError):
        compiled(x, x)


@pytest.mark.unit
def test_symbolic_dims_need_a_binding_when_shapes_are_fixed_up_front():
    with pytest.raises(pf.ShapeError, match="input_shapes"):
        pf.compile(mlp(), input_shapes={"other": (1, 2)})
    compiled = pf.compile(mlp(), input_shapes={"x": (4, 16)})
    assert compiled.run({"x": np.ones((4, 16), np.float32)})["y"].shape == (4, 4)


@pytest.mark.unit
def test_onnx_shape_inference_types_the_intermediate_values():
    from polyfuse.frontends.graph_text import parse_graph
    from polyfuse.frontends.onnx import to_graph
    g = to_graph(mlp())
    assert str(g.type_of("h")) == "float32[B, 32]" and str(g.type_of("h3")) == "float32[B, 32]"
    assert "  %h2: float32[B, 32]\n" in str(g)
    assert parse_graph(str(g), g) == g
