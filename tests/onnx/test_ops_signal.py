"""DFT, STFT, the windows, MelWeightMatrix, Upsample and RoiAlign against numpy and
onnxruntime, at shapes the node suite does not cover."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import polyfuse as pf
from tests.onnx.ort_compare import assert_matches_onnxruntime, one_node_model

TARGETS = ["host", "reference"]
F = TensorProto.FLOAT


def _complex(y):
    return y[..., 0] + 1j * y[..., 1]


def _dft(x, attrs, opset=20, axis=None, length=None):
    inputs = ["x", "n" if length is not None else "", "axis" if axis is not None else ""]
    consts = {k: np.array(v, np.int64) for k, v in (("n", length), ("axis", axis)) if v is not None}
    while not inputs[-1]:
        inputs.pop()
    node = helper.make_node("DFT", inputs, ["y"], **attrs)
    return one_node_model(node, {"x": x}, {"y": F}, consts, opset=opset)


@pytest.mark.parametrize("target", TARGETS)
def test_dft_complex_forward_and_inverse_with_padding(target):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 7, 3, 2)).astype(np.float32)
    z = _complex(x.astype(np.float64))
    got = pf.compile(_dft(x, {}, axis=1, length=12), target=target).run({"x": x})["y"]
    np.testing.assert_allclose(_complex(got), np.fft.fft(z, n=12, axis=1), rtol=1e-5, atol=1e-5)
    got = pf.compile(_dft(x, {"inverse": 1}, axis=-2, length=5), target=target).run({"x": x})["y"]
    np.testing.assert_allclose(_complex(got), np.fft.ifft(z, n=5, axis=2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
def test_dft_rfft_irfft_odd_length_opset17(target):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 9, 1)).astype(np.float32)
    got = pf.compile(_dft(x, {"onesided": 1, "axis": 1}, opset=17), target=target).run({"x": x})["y"]
    spectrum = np.fft.rfft(x[..., 0].astype(np.float64), axis=1)
    assert got.shape == (3, 5, 2)
    np.testing.assert_allclose(_complex(got), spectrum, rtol=1e-5, atol=1e-5)
    half = np.stack([spectrum.real, spectrum.imag], -1).astype(np.float32)
    model = _dft(half, {"onesided": 1, "inverse": 1}, axis=1, length=9)
    back = pf.compile(model, target=target).run({"x": half})["y"]
    assert back.shape == (3, 9, 1)
    np.testing.assert_allclose(back[..., 0], x[..., 0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
def test_stft_with_hann_window_matches_numpy(target):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 50, 1)).astype(np.float32)
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(12) / 12)).astype(np.float32)
    node = helper.make_node("STFT", ["x", "step", "w"], ["y"], onesided=1)
    model = one_node_model(node, {"x": x, "w": window}, {"y": F},
                           {"step": np.array(5, np.int64)}, opset=17)
    got = pf.compile(model, target=target).run({"x": x, "w": window})["y"]
    frames = np.stack([x[:, 5 * f:5 * f + 12, 0] for f in range(1 + (50 - 12) // 5)], 1)
    want = np.fft.rfft(frames.astype(np.float64) * window, axis=-1)
    assert got.shape == (2, 8, 7, 2)
    np.testing.assert_allclose(_complex(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.unit
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
def test_windows_match_numpy(target, op):
    node = helper.make_node(op, ["n"], ["y"], periodic=0, output_datatype=TensorProto.DOUBLE)
    model = one_node_model(node, {}, {"y": TensorProto.DOUBLE}, {"n": np.array(17, np.int64)},
                           opset=17)
    got = pf.compile(model, target=target).run({})["y"]
    want = {"HannWindow": np.hanning, "HammingWindow": None, "BlackmanWindow": np.blackman}[op]
    t = 2 * np.pi * np.arange(17) / 16
    want = want(17) if want else 25 / 46 - 21 / 46 * np.cos(t)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.unit
@pytest.mark.parametrize("target", TARGETS)
def test_mel_weight_matrix_matches_the_reference(target):
    from onnx.reference import ReferenceEvaluator
    names = ["bins", "length", "rate", "lo", "hi"]
    consts = {"bins": np.array(10, np.int64), "length": np.array(64, np.int64),
              "rate": np.array(16000, np.int64), "lo": np.array(60.0, np.float32),
              "hi": np.array(7600.0, np.float32)}
    node = helper.make_node("MelWeightMatrix", names, ["y"])
    model = one_node_model(node, {}, {"y": F}, consts, opset=17)
    got = pf.compile(model, target=target).run({})["y"]
    want = ReferenceEvaluator(model).run(None, {})[0]
    assert got.shape == (33, 10) and want.sum() > 0
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_opset7_attribute_scales(target, mode):
    x = np.random.default_rng(3).standard_normal((1, 2, 3, 4)).astype(np.float32)
    node = helper.make_node("Upsample", ["x"], ["y"], mode=mode, scales=[1.0, 1.0, 2.0, 1.5])
    model = one_node_model(node, {"x": x}, {"y": F}, opset=7)
    got = pf.compile(model, target=target).run({"x": x})["y"]
    assert got.shape == (1, 2, 6, 6)
    if mode == "nearest":  # asymmetric, floor: element o reads o / scale
        np.testing.assert_array_equal(got, x[:, :, [0, 0, 1, 1, 2, 2]][..., [0, 0, 1, 2, 2, 3]])
    else:
        np.testing.assert_allclose(got[:, :, ::2, 0], x[:, :, :, 0], rtol=1e-6)


def _roi_model(attrs, x, rois, indices, constant_rois):
    node = helper.make_node("RoiAlign", ["x", "rois", "idx"], ["y"], **attrs)
    feeds = {"x": x, "idx": indices} | ({} if constant_rois else {"rois": rois})
    model = one_node_model(node, feeds, {"y": F}, {"rois": rois} if constant_rois else None,
                           opset=16)
    return model, feeds


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("constant_rois", [True, False])
@pytest.mark.parametrize("transform", ["half_pixel", "output_half_pixel"])
def test_roi_align_adaptive_sampling_matches_onnxruntime(target, constant_rois, transform):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    rois = np.array([[0.5, 1.0, 9.0, 8.5], [2.0, 0.0, 4.0, 3.0], [-1.0, -2.0, 12.0, 10.0]],
                    np.float32)
    indices = np.array([1, 0, 1], np.int64)
    attrs = {"output_height": 3, "output_width": 2, "sampling_ratio": 0,
             "spatial_scale": 0.9, "coordinate_transformation_mode": transform}
    model, feeds = _roi_model(attrs, x, rois, indices, constant_rois)
    assert_matches_onnxruntime(model, feeds, rtol=1e-5, atol=1e-6, target=target)


@pytest.mark.parametrize("target", TARGETS)
def test_roi_align_max_matches_the_reference(target):
    from onnx.reference import ReferenceEvaluator
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 2, 8, 8)).astype(np.float32)
    rois = np.array([[1.0, 1.0, 6.0, 5.0], [0.0, 3.0, 7.5, 7.5]], np.float32)
    indices = np.zeros(2, np.int64)
    attrs = {"mode": "max", "output_height": 2, "output_width": 3, "sampling_ratio": 3}
    model, feeds = _roi_model(attrs, x, rois, indices, False)
    got = pf.compile(model, target=target).run(feeds)["y"]
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_roi_larger_than_the_sampling_bound_is_an_error():
    x = np.zeros((1, 1, 4, 4), np.float32)
    small = np.array([[0.0, 0.0, 3.0, 3.0]], np.float32)
    model, feeds = _roi_model({"sampling_ratio": 0}, x, small, np.zeros(1, np.int64), False)
    compiled = pf.compile(model, target="host")
    assert compiled.run(feeds)["y"].shape == (1, 1, 1, 1)
    with pytest.raises(pf.PolyfuseError):
        compiled.run(feeds | {"rois": np.array([[0.0, 0.0, 40.0, 40.0]], np.float32)})


@pytest.mark.unit
def test_bad_nodes_are_polyfuse_errors_naming_the_node():
    x = np.zeros((1, 8, 3), np.float32)
    with pytest.raises(pf.ModelError, match="'DFT_0' .*end in 1 .* or 2"):
        pf.compile(_dft(x, {}, axis=1), target="host").run({"x": x})
    x = np.zeros((1, 8, 1), np.float32)
    with pytest.raises(pf.ModelError, match="'DFT_0' .*axis 2 must name a signal axis"):
        pf.compile(_dft(x, {}, axis=2), target="host").run({"x": x})
    node = helper.make_node("STFT", ["x", "step", "", "len"], ["y"])
    model = one_node_model(node, {"x": x}, {"y": F},
                           {"step": np.array(2, np.int64), "len": np.array(20, np.int64)}, opset=17)
    with pytest.raises(pf.ModelError, match="'STFT_0' .*frame length 20"):
        pf.compile(model, target="host").run({"x": x})


@pytest.mark.parametrize("target", TARGETS)
def test_deform_conv_groups_stride_dilation_mask_bias_match_the_reference(target):
    from onnx.reference import ReferenceEvaluator
    rng = np.random.default_rng(6)
    feeds = {"x": rng.standard_normal((2, 4, 7, 6)).astype(np.float32),
             "w": rng.standard_normal((6, 2, 2, 3)).astype(np.float32),
             "off": (2 * rng.standard_normal((2, 2 * 6 * 2, 4, 2))).astype(np.float32),
             "b": rng.standard_normal(6).astype(np.float32),
             "m": rng.random((2, 2 * 6, 4, 2)).astype(np.float32)}
    node = helper.make_node("DeformConv", list(feeds), ["y"], group=2, offset_group=2,
                            strides=[2, 2], dilations=[2, 1], pads=[1, 0, 1, 0])
    model = one_node_model(node, feeds, {"y": F}, opset=22)
    got = pf.compile(model, target=target).run(feeds)["y"]
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    assert got.shape == (2, 6, 4, 2)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
