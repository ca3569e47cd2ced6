"""Models onnx's checker refuses but onnxruntime runs: polyfuse loads them with one
ModelWarning and computes what onnxruntime computes; really malformed models stay
ModelErrors."""

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from polyfuse.errors import ModelError
from polyfuse.frontends.onnx import ModelWarning
from tests.onnx.ort_compare import assert_matches_onnxruntime

X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])
W = numpy_helper.from_array(np.linspace(-1, 1, 15, dtype=np.float32).reshape(3, 5), "w")
NODES = [helper.make_node("Add", ["x", "w"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]


def _model(graph, opset=13, ir=7):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir
    return model


def _defective(defect):
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])
    if defect == "unnamed graph":
        return _model(helper.make_graph(NODES, "", [X], [out], [W]))
    if defect == "untyped output":
        return _model(helper.make_graph(NODES, "g", [X], [onnx.ValueInfoProto(name="y")], [W]))
    if defect == "shapeless output":
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        return _model(helper.make_graph(NODES, "g", [X], [out], [W]))
    if defect == "IR 3 initializer not an input":
        return _model(helper.make_graph(NODES, "g", [X], [out], [W]), opset=7, ir=3)
    if defect == "all at once":
        return _model(helper.make_graph(NODES, "", [X], [onnx.ValueInfoProto(name="y")], [W]),
                      opset=7, ir=3)
    raise AssertionError(defect)


@pytest.mark.unit
@pytest.mark.parametrize("defect", ["unnamed graph", "untyped output", "shapeless output",
                                    "IR 3 initializer not an input", "all at once"])
def test_checker_complaints_onnxruntime_overlooks_load_with_one_warning(defect):
    model = _defective(defect)
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = pf.compile(model, target="reference")
    assert [w.category for w in caught] == [ModelWarning], [str(w.message) for w in caught]
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    assert_matches_onnxruntime(model, {"x": x}, compiled=compiled)
    assert compiled.outputs[0].type.dtype.value == "float32"


@pytest.mark.unit
def test_a_valid_model_loads_without_warning():
    model = _model(helper.make_graph(NODES, "g", [X],
                                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])],
                                     [W]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pf.compile(model, target="reference")


@pytest.mark.unit
def test_malformed_models_stay_errors():
    dangling = helper.make_node("Relu", ["nowhere"], ["y"])
    graph = helper.make_graph([dangling], "g", [X],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])])
    with pytest.raises(ModelError, match="invalid"):
        pf.compile(_model(graph), target="reference")
    # an output no inference can type: its producer reads an input of unknown type
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]),
                               helper.make_node("Relu", ["q"], ["z"])], "g",
                              [X, onnx.ValueInfoProto(name="q")],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5]),
                               onnx.ValueInfoProto(name="z")])
    with pytest.raises(ModelError):
        pf.compile(_model(graph), target="reference")


@pytest.mark.parametrize("outputs", [["y", "om", "ov", "sm", "sv"], ["y", "om", "ov", "sm", "sv", ""]])
def test_opset7_batchnorm_with_statistics_outputs_runs_as_onnxruntime(outputs):
    rng = np.random.default_rng(1)
    weights = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in
               [("s", rng.uniform(0.5, 2, 3)), ("b", rng.standard_normal(3)),
                ("m", rng.standard_normal(3)), ("v", rng.uniform(0.5, 2, 3))]]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], outputs[:5],
                            epsilon=1e-3, momentum=0.8)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 7])
    # an inference graph reads only y; a training-era export also exposes the statistics
    graph_outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, 7] if n == "y" else [3])
                     for n in (outputs[:1] if len(outputs) > 5 else outputs)]
    model = _model(helper.make_graph([node], "bn", [x], graph_outputs, weights), opset=7)
    feeds = {"x": rng.standard_normal((2, 3, 7)).astype(np.float32)}
    assert_matches_onnxruntime(model, feeds, rtol=1e-4, atol=1e-5)


def _heavy_model(ir=8, listed=False, rows=160):
    """x (4 x rows) times a weight above HEAVY_BYTES, plus a small bias: the weight is left
    out of what onnx's checker and shape inference see."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((rows, 128)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(128).astype(np.float32), "b")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, rows])
    inputs = [x] + ([helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in (w, b)]
                    if listed else [])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["y"])],
                              "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    return _model(graph, opset=13 if ir >= 4 else 7, ir=ir)


@pytest.mark.unit
@pytest.mark.parametrize("ir, listed", [(8, False), (8, True), (3, True)])
def test_a_model_with_weights_above_heavy_bytes_loads_and_matches_onnxruntime(ir, listed):
    from polyfuse.frontends.onnx import HEAVY_BYTES
    model = _heavy_model(ir, listed)
    assert model.graph.initializer[0].ByteSize() > HEAVY_BYTES
    with warnings.catch_warnings(record=True) as caught:   # the output's shape is inferred: one warning
        warnings.simplefilter("always")
        compiled = pf.compile(model, target="reference")
    assert [w.category for w in caught] == [ModelWarning], [str(w.message) for w in caught]
    x = np.random.default_rng(0).standard_normal((4, 160)).astype(np.float32)
    assert_matches_onnxruntime(model, {"x": x}, rtol=1e-4, atol=1e-4, compiled=compiled)
    assert [v.name for v in compiled.inputs] == ["x"]
    assert tuple(compiled.outputs[0].type.shape) == (4, 128)


@pytest.mark.unit
def test_an_ir3_weight_not_listed_as_input_still_gets_the_warning_when_heavy():
    with pytest.warns(ModelWarning, match="not listed as graph input"):
        compiled = pf.compile(_heavy_model(ir=3, listed=False), target="reference")
    x = np.random.default_rng(0).standard_normal((4, 160)).astype(np.float32)
    assert_matches_onnxruntime(_heavy_model(ir=3, listed=False), {"x": x}, rtol=1e-4, atol=1e-4, compiled=compiled)


@pytest.mark.unit
def test_a_heavy_weight_with_too_few_bytes_is_a_model_error():
    model = _heavy_model()
    w = model.graph.initializer[0]
    w.raw_data = w.raw_data[:-4]
    with pytest.raises(ModelError, match=r"initializer 'w' holds 81916 bytes; its shape \[160, 128\] and type need 81920"):
        pf.compile(model, target="reference")
