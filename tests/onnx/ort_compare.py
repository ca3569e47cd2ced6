"""One comparison of a compiled model against onnxruntime, shared by the op tests."""

import numpy as np
import onnxruntime as ort

import polyfuse as pf


def onnxruntime_outputs(model, feeds):
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)


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
