"""One comparison of a compiled model against onnxruntime, shared by the op tests."""

import numpy as np
import onnxruntime as ort

import polyfuse as pf


def onnxruntime_outputs(model, feeds):
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def onnxruntime_as_written(model, feeds):
    """onnxruntime's outputs with its graph optimizations off: a QDQ model runs as written
    (each DequantizeLinear, the float op, QuantizeLinear), exactly, on every CPU. Fused
    into its int8 kernels, on CPUs without AVX512-VNNI it sums pairs of byte products in
    saturating int16 (vpmaddubsw) and lands tens of steps off the exact result."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def onnx_reference_outputs(model, feeds):
    """The outputs of onnx's reference evaluator (numpy, the spec's semantics): exact for
    the integer ops (QLinearConv, ...), which onnxruntime runs on its int8 kernels even
    with its optimizations off."""
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(model).run(None, feeds)


def assert_matches_onnxruntime(model, feeds, rtol=1e-5, atol=1e-6, want=None, *,
                               target="host", compiled=None):
    """``polyfuse.compile(model, target=target)`` gives onnxruntime's dtypes, shapes, values.

    ``compiled`` reuses a model already compiled (to run it at several shapes)."""
    want = onnxruntime_outputs(model, feeds) if want is None else want
    compiled = pf.compile(model, target=target) if compiled is None else compiled
    got = compiled.run(feeds)
    for value, expected in zip(model.graph.output, want):
        assert got[value.name].dtype == expected.dtype, value.name
        assert got[value.name].shape == expected.shape, value.name
        np.testing.assert_allclose(got[value.name], expected, rtol=rtol, atol=atol,
                                   err_msg=value.name)


def one_node_model(node, feeds, outputs, constants=None, opset=21):
    """A model of ``node`` reading graph inputs ``feeds`` (name -> example array) and
    initializers ``constants``; ``outputs`` maps output names to ONNX element types.
    Output shapes come from onnx's shape inference."""
    import onnx
    from onnx import helper, numpy_helper
    graph = helper.make_graph(
        [node], node.op_type,
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in feeds.items()],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs.items()],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in (constants or {}).items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10  # what the installed onnxruntime reads
    return onnx.shape_inference.infer_shapes(m)
