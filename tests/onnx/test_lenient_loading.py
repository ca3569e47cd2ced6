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
