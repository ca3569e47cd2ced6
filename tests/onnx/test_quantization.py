"""int8 quantization: profiles against onnxruntime's intermediates, calibration against
numpy formulas, QDQ models (polyfuse's and onnxruntime's quantize_static/quantize_dynamic)
against onnxruntime, and the integer kernels fuse_integer_ops makes against an exact
numpy integer reference."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from polyfuse.cli import main
from polyfuse.frontends.onnx_quantize import model_digest, quantize
from polyfuse.ir.profile import Profile, TensorRange
from polyfuse.lowering.calibration import (activation_quantization, uint8_quantization,
                                           weight_quantization)
from tests.arm_tools import AARCH64
from tests.onnx.ort_compare import onnxruntime_as_written as onnxruntime_outputs

RNG = np.random.default_rng(16)


def make_model(nodes, inputs, outputs, initializers, opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs,
                          [numpy_helper.from_array(np.asarray(a), n) for n, a in initializers.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def small_cnn():
    """Conv + Relu + MaxPool + Conv(stride 2) + Relu + Reshape + Gemm on a 1x3x8x8 input."""
    init = {"w1": RNG.normal(0, .3, (8, 3, 3, 3)), "b1": RNG.normal(0, .1, 8),
            "w2": RNG.normal(0, .2, (8, 8, 3, 3)), "b2": RNG.normal(0, .1, 8),
            "wg": RNG.normal(0, .1, (10, 128)), "bg": RNG.normal(0, .1, 10)}
    init = {n: a.astype(np.float32) for n, a in init.items()} | {"shape": np.array([1, -1])}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4, name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], pads=[1] * 4, name="pool1"),
             helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1] * 4, strides=[2, 2],
                              name="conv2"),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("Reshape", ["r2", "shape"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], transB=1, name="fc")]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], init)


@pytest.fixture(scope="module")
def cnn():
    return small_cnn()


def samples(n=4, shape=(1, 3, 8, 8)):
    return [{"x": RNG.normal(0, 1, shape).astype(np.float32)} for _ in range(n)]


@pytest.fixture(scope="module")
def calibration():
    return samples()


@pytest.fixture(scope="module")
def profile(cnn, calibration):
    return pf.compile(cnn, target="host").profile_ranges(calibration)


def intermediates(model, feeds):
    """Every value of the model by name, as onnxruntime computes them."""
    inferred = onnx.shape_inference.infer_shapes(model)
    extra = onnx.ModelProto()
    extra.CopyFrom(inferred)
    extra.graph.output.extend(v for v in inferred.graph.value_info)
    names = [o.name for o in extra.graph.output]
    return dict(zip(names, onnxruntime_outputs(extra, feeds)))


def cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


# --- profiles ---------------------------------------------------------------------------------

def test_profile_ranges_are_the_extremes_of_every_float_tensor(cnn, calibration, profile):
    seen = [intermediates(cnn, f) for f in calibration]
    assert set(profile.tensors) == {"x", "c1", "r1", "p1", "c2", "r2", "f", "y"}
    assert profile.samples == 4 and profile.digest == model_digest(cnn)
    for name, r in profile.tensors.items():
        values = np.concatenate([s[name].ravel() for s in seen] if name != "x" else
                                [f["x"].ravel() for f in calibration])
        # the input exactly; computed tensors as polyfuse computes them (float rounding)
        tol = 0 if name == "x" else 1e-5
        np.testing.assert_allclose([r.min, r.max], [values.min(), values.max()], rtol=tol, atol=tol)
        assert r.counts.sum() == pytest.approx(values.size)


def test_profile_min_max_exact_through_exact_ops():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["n"]),
             helper.make_node("Add", ["n", "x"], ["y"])]
    m = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 7])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 7])], {})
    feeds = [{"x": RNG.normal(0, 3, (5, 7)).astype(np.float32)} for _ in range(3)]
    p = pf.compile(m, target="host").profile_ranges(feeds)
    for name in ("r", "n", "y"):
        values = np.stack([intermediates(m, f)[name] for f in feeds])
        assert (p.tensors[name].min, p.tensors[name].max) == (values.min(), values.max())


@pytest.mark.unit
def test_histogram_of_one_batch_is_numpys_and_merging_keeps_every_count():
    a, b = RNG.normal(0, 1, 1000), RNG.normal(3, 2, 500)
    r = TensorRange.of(a, bins=64)
    want, _ = np.histogram(a, 64, (min(a.min(), 0), max(a.max(), 0)))
    np.testing.assert_array_equal(r.counts, want)
    merged = r.merged(TensorRange.of(b, bins=64))
    assert merged.counts.sum() == pytest.approx(1500)
    assert (merged.min, merged.max) == (min(a.min(), b.min()), max(a.max(), b.max()))
    # re-binned counts stay close to a histogram of all values at once (within a bin's spill)
    direct, _ = np.histogram(np.concatenate([a, b]), 64, (merged.lo, merged.hi))
    assert np.abs(np.cumsum(merged.counts) - np.cumsum(direct)).max() < 60
    same = r.merged(TensorRange.of(a, bins=64))   # the same range: counts add exactly
    np.testing.assert_array_equal(same.counts, 2 * want)


@pytest.mark.unit
def test_profile_file_round_trips_and_refuses_other_versions(profile, tmp_path):
    path = tmp_path / "p.json"
    profile.save(path)
    data = json.loads(path.read_text())
    assert (data["format"], data["version"], data["model"]["sha256"]) == \
        ("polyfuse-profile", 1, profile.digest)
    back = Profile.load(path)
    assert back.tensors.keys() == profile.tensors.keys()
    np.testing.assert_array_equal(back.tensors["r1"].counts, profile.tensors["r1"].counts)
    data["version"] = 2
    path.write_text(json.dumps(data))
    with pytest.raises(pf.ArgumentError, match="version 2"):
        Profile.load(path)
    path.write_text("{}")
    with pytest.raises(pf.ArgumentError, match="not a polyfuse profile"):
        Profile.load(path)


# --- calibration ------------------------------------------------------------------------------

@pytest.mark.unit
def test_uint8_and_per_channel_int8_parameters_follow_the_formulas():
    q = uint8_quantization(-1.0, 3.0)
    assert q.scale == np.float32(4 / 255) and q.zero_point == np.rint(1 / np.float32(4 / 255))
    q = uint8_quantization(0.5, 2.0)            # widened to hold 0
    assert q.scale == np.float32(2 / 255) and q.zero_point == 0
    w = RNG.normal(0, 1, (6, 3, 2, 2)).astype(np.float32)
    wq, p = weight_quantization(w, 0)
    scale = (np.abs(w).reshape(6, -1).max(1) / 127).astype(np.float32)
    np.testing.assert_array_equal(p.scale, scale)
    np.testing.assert_array_equal(wq, np.rint(w / scale[:, None, None, None].astype(np.float64)))
    assert wq.dtype == np.int8 and not p.zero_point.any()
    wq, p = weight_quantization(w, None)
    assert p.scale.shape == () and p.scale == np.float32(np.abs(w).max() / 127)


@pytest.mark.unit
def test_percentile_and_entropy_clip_outliers_that_minmax_keeps():
    values = np.concatenate([RNG.normal(0, 1, 100_000), [60.0, -40.0]])
    r = TensorRange.of(values)
    minmax = activation_quantization(r, "minmax")
    assert minmax.scale == np.float32(100 / 255)
    lo, hi = np.percentile(values, [0.05, 99.95])
    pq = activation_quantization(r, "percentile", percentile=99.9)
    width = (r.hi - r.lo) / len(r.counts)
    assert pq.scale == pytest.approx((hi - lo) / 255, abs=2 * width / 255)
    eq = activation_quantization(r, "entropy")
    assert eq.scale < minmax.scale / 4   # the outliers clipped
    assert eq.scale * 255 > 5            # most of the mass kept


# --- QDQ models -------------------------------------------------------------------------------

def test_cli_profile_and_quantize_write_a_model_onnxruntime_and_polyfuse_agree_on(cnn, tmp_path, capsys):
    model_path, calib = tmp_path / "cnn.onnx", tmp_path / "calib.npz"
    onnx.save(cnn, model_path)
    np.savez(calib, x=np.stack([f["x"] for f in samples(3)]))
    assert main(["profile", str(model_path), "--inputs", str(calib), "-o", str(tmp_path / "p.json")]) == 0
    assert main(["quantize", str(model_path), "--profile", str(tmp_path / "p.json"),
                 "-o", str(tmp_path / "q.onnx"), "--method", "entropy"]) == 0
    q = onnx.load(tmp_path / "q.onnx")
    onnx.checker.check_model(q)
    ops = [n.op_type for n in q.graph.node]
    assert ops.count("QuantizeLinear") == 5 and "Conv" in ops   # x, r1, p1, r2, f
    x = samples(1)[0]
    want = onnxruntime_outputs(q, x)[0]
    compiled = pf.compile(q, target="host")
    got = compiled.run(x)["y"]
    init = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    # the pool and the flatten keep their inputs' quantization, so they move uint8 values
    assert init["p1_scale"] == init["r1_scale"] and init["f_scale"] == init["r2_scale"]
    graph = compiled.dump("partition_fusion_groups")
    assert "QLinearConv" in graph
    # (the pool on the channels-last twins the layout pass gives the integer convolutions)
    assert '%"p1_quantized:channels_last" = MaxPool(%"r1_quantized:channels_last"' in graph
    assert "%f_quantized = Reshape(%r2_quantized" in graph
    # within one step of the quantized features in each term of the float classifier
    wg = init["wg_quantized"].astype(np.float32) * init["wg_scale"][:, None]
    np.testing.assert_array_less(np.abs(got - want)[0], init["f_scale"] * np.abs(wg).sum(1) + 1e-6)


def test_int8_compile_stays_close_to_float(cnn, profile):
    x = samples(1)[0]
    f = pf.compile(cnn, target="host").run(x)["y"]
    q = pf.compile(cnn, target="host", precision="int8", profile=profile).run(x)["y"]
    assert cosine(f, q) >= 0.99
    kept = pf.compile(cnn, target="host", precision="int8", profile=profile,
                      quantization=pf.QuantizeOptions(keep_float=frozenset({"conv2"}), per_channel=False))
    assert "QLinearConv" in kept.dump("partition_fusion_groups")
    assert "Conv(" in kept.dump("partition_fusion_groups")
    assert cosine(f, kept.run(x)["y"]) >= 0.99


def test_attention_products_of_two_activations_quantize_and_softmax_stays_float(tmp_path):
    d = 16
    init = {n: RNG.normal(0, .3, (d, d)).astype(np.float32) for n in ("wq", "wk", "wv")}
    init |= {"bq": RNG.normal(0, .1, d).astype(np.float32), "scale": np.float32(0.25),
             "gamma": np.ones(d, np.float32), "beta": np.zeros(d, np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q0"], name="q_proj"),
             helper.make_node("Add", ["q0", "bq"], ["q"]),
             helper.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj"),
             helper.make_node("MatMul", ["x", "wv"], ["v"], name="v_proj"),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[1, 0]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"], name="scores"),
             helper.make_node("Mul", ["s0", "scale"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["a"], name="context"),
             helper.make_node("LayerNormalization", ["a", "gamma", "beta"], ["y"], axis=-1)]
    m = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, d])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, d])], init)
    feeds = [{"x": RNG.normal(0, 1, (8, d)).astype(np.float32)} for _ in range(4)]
    profile = pf.compile(m, target="host").profile_ranges(feeds)
    q = quantize(m, profile)
    ops = [n.op_type for n in q.graph.node]
    assert "Softmax" in ops and "LayerNormalization" in ops
    compiled = pf.compile(q, target="host")
    graph = compiled.dump("partition_fusion_groups")
    # the projections, q @ k^T and p @ v (two uint8 activations each) on integers
    assert graph.count("QLinearMatMul") == 5 and "Softmax" in graph
    x = feeds[0]
    got, want = compiled.run(x)["y"], onnxruntime_outputs(q, x)[0]
    np.testing.assert_allclose(got, want, atol=0.05)
    assert cosine(got, pf.compile(m, target="host").run(x)["y"]) >= 0.99


def test_quantize_static_model_matches_onnxruntime_within_one_step(cnn, tmp_path):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter(samples(4))

        def get_next(self):
            return next(self.feeds, None)

    onnx.save(cnn, tmp_path / "cnn.onnx")
    quantize_static(str(tmp_path / "cnn.onnx"), str(tmp_path / "qdq.onnx"), Reader(),
                    quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    q = onnx.load(tmp_path / "qdq.onnx")
    compiled = pf.compile(q, target="host")
    graph = compiled.dump("partition_fusion_groups")
    assert "QLinearConv" in graph and "QLinearGemm" in graph and " Conv(" not in graph
    y_scale = next(numpy_helper.to_array(t) for t in q.graph.initializer if t.name == "y_scale")
    for x in samples(3):
        got, want = compiled.run(x)["y"], onnxruntime_outputs(q, x)[0]
        np.testing.assert_array_less(np.abs(got - want), y_scale * 1.001)


def test_quantize_dynamic_model_matches_onnxruntime(tmp_path):
    from onnxruntime.quantization import quantize_dynamic
    w1, w2 = RNG.normal(0, .2, (16, 32)).astype(np.float32), RNG.normal(0, .2, (32, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    m = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], {"w1": w1, "w2": w2})
    onnx.save(m, tmp_path / "m.onnx")
    quantize_dynamic(str(tmp_path / "m.onnx"), str(tmp_path / "d.onnx"))
    q = onnx.load(tmp_path / "d.onnx")
    assert "MatMulInteger" in [n.op_type for n in q.graph.node]
    x = {"x": RNG.normal(0, 1, (4, 16)).astype(np.float32)}
    np.testing.assert_allclose(pf.compile(q, target="host").run(x)["y"], onnxruntime_outputs(q, x)[0],
                               rtol=1e-5, atol=1e-5)


# --- the integer kernels ----------------------------------------------------------------------

def requantized(acc, sx, sw, sy, zy):
    """ONNX's QLinear requantization of int32 sums: the factor rounded to float32."""
    factor = (np.float32(sx) * sw.astype(np.float32)).astype(np.float32) / np.float32(sy)
    return np.clip(np.rint(acc.astype(np.float64) * factor.astype(np.float32).astype(np.float64)) + zy,
                   0, 255).astype(np.uint8)


def qdq_product(op, x_shape, y_shape, w, w_axis, bias=None, act=None, quantized=True, **attrs):
    """x_u8 -> DQ, w_s8 -> DQ (per channel), op, (Relu or Clip to [0, 6]), Q -> y_u8 (or,
    not ``quantized``, the float product y); and its parameters."""
    sx, zx, sy, zy = np.float32(0.02), np.uint8(131), np.float32(0.05), np.uint8(7)
    sw = RNG.uniform(0.002, 0.01, w.shape[w_axis]).astype(np.float32)
    init = {"sx": sx, "zx": zx, "w": w, "sw": sw, "zw": np.zeros_like(sw, np.int8), "sy": sy, "zy": zy,
            "lo": np.float32(0), "hi": np.float32(6)}
    ins = ["xd", "wd"]
    if bias is not None:
        init["b"] = bias
        ins.append("b")
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wd"], axis=w_axis),
             helper.make_node(op, ins, ["p"], name="product", **attrs)]
    if act:
        nodes.append(helper.make_node(act, ["p", "lo", "hi"] if act == "Clip" else ["p"], ["pa"]))
    if quantized:
        nodes.append(helper.make_node("QuantizeLinear", ["pa" if act else "p", "sy", "zy"], ["y"]))
    else:
        nodes[-1].output[0] = "y"
    m = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.UINT8, x_shape)],
                   [helper.make_tensor_value_info("y", TensorProto.UINT8 if quantized else TensorProto.FLOAT,
                                                  y_shape)], init, opset=19)
    return m, (sx, zx, sw, sy, zy)


def assert_integer_kernel(m, x, acc, params, act=None, channels=(-1,), target="host"):
    """The model's output is the int32 sums ``acc`` requantized (weight scales along
    ``channels``, then the activation), bit for bit; onnxruntime's within one step."""
    sx, zx, sw, sy, zy = params
    want = requantized(acc, sx, sw.reshape(channels), sy, zy)
    if act == "Relu":
        want = np.maximum(want, zy)
    elif act == "Clip":
        want = np.clip(want, zy, zy + np.rint(6 / np.float64(sy))).astype(np.uint8)
    compiled = pf.compile(m, target=target)
    plan = compiled.dump("partition_fusion_groups")
    assert "QLinear" in plan and "DequantizeLinear" not in plan
    got = compiled.run({"x": x})["y"]
    np.testing.assert_array_equal(got, want)
    ort = onnxruntime_outputs(m, {"x": x})[0]     # float products: ties may round apart
    assert np.abs(got.astype(int) - ort.astype(int)).max() <= 1


@pytest.mark.parametrize("act, target", [(None, "host"), ("Relu", "host"), ("Clip", "host"),
                                         pytest.param("Clip", "aarch64", marks=AARCH64.marks),
                                         pytest.param("Clip", "aarch64+i8mm", marks=AARCH64.marks),
                                         ("Relu", "reference")])
def test_quantized_conv_runs_as_an_exact_integer_kernel(act, target):
    w = RNG.integers(-127, 128, (6, 4, 3, 3), dtype=np.int8)
    bias = RNG.integers(-2000, 2000, 6).astype(np.float32) * np.float32(0.02) * np.float32(0.005)
    x = RNG.integers(0, 256, (2, 4, 7, 9), dtype=np.uint8)
    m, params = qdq_product("Conv", x.shape, (2, 6, 4, 9), w, 0, bias, act, pads=[1, 0, 1, 2], strides=[2, 1])
    sx, zx, sw = params[:3]
    xp = np.pad(x.astype(np.int64) - zx, [(0, 0), (0, 0), (1, 1), (0, 2)])
    acc = np.zeros((2, 6, 4, 9), np.int64)
    for i in range(3):
        for j in range(3):
            patch = xp[:, :, i:i + 7:2, j:j + 9]
            acc += np.einsum("nchw,mc->nmhw", patch, w[:, :, i, j].astype(np.int64))
    qb = np.rint(bias.astype(np.float64) / (np.float32(sx) * sw).astype(np.float64)).astype(np.int64)
    assert_integer_kernel(m, x, acc + qb[None, :, None, None], params, act, (-1, 1, 1), target)


@pytest.mark.parametrize("target", ["host", AARCH64, *(pytest.param(f"aarch64+{f}", marks=AARCH64.marks)
                                                   for f in ("dotprod", "i8mm"))])
def test_quantized_matmul_and_gemm_run_as_exact_integer_kernels(target):
    x = RNG.integers(0, 256, (5, 24), dtype=np.uint8)
    w = RNG.integers(-127, 128, (24, 11), dtype=np.int8)
    m, params = qdq_product("MatMul", x.shape, (5, 11), w, 1)
    acc = (x.astype(np.int64) - params[1]) @ w.astype(np.int64)
    assert_integer_kernel(m, x, acc, params, target=target)
    wt = np.ascontiguousarray(w.T)
    bias = RNG.normal(0, 1, 11).astype(np.float32)
    m, params = qdq_product("Gemm", x.shape, (5, 11), wt, 0, bias, transB=1)
    product = (np.float32(params[0]) * params[2]).astype(np.float64)
    qb = np.rint(bias.astype(np.float64) / product).astype(np.int64)
    assert_integer_kernel(m, x, (x.astype(np.int64) - params[1]) @ w.astype(np.int64) + qb, params,
                          target=target)


@pytest.mark.parametrize("target", ["host", AARCH64])
@pytest.mark.parametrize("op", ["Gemm", "MatMul"])
def test_a_product_with_a_float_result_sums_integers_and_dequantizes_the_sums(op, target):
    # (a classifier's logits): the int32 sums and bias at sx * sw, one rounding to float32
    x = RNG.integers(0, 256, (3, 4, 36), dtype=np.uint8) if op == "MatMul" else \
        RNG.integers(0, 256, (5, 36), dtype=np.uint8)
    w = RNG.integers(-127, 128, (36, 21), dtype=np.int8)
    bias = RNG.normal(0, 1, 21).astype(np.float32) if op == "Gemm" else None
    m, (sx, zx, sw, _, _) = qdq_product(op, x.shape, (*x.shape[:-1], 21), np.ascontiguousarray(w.T)
                                        if op == "Gemm" else w, 0 if op == "Gemm" else 1, bias,
                                        quantized=False, **({"transB": 1} if op == "Gemm" else {}))
    compiled = pf.compile(m, target=target)
    assert "MatMulInteger" in compiled.dump("partition_fusion_groups")
    scale = (np.float32(sx) * sw).astype(np.float64)
    acc = (x.astype(np.int64) - zx) @ w.astype(np.int64)
    if bias is not None:
        acc += np.rint(bias.astype(np.float64) / scale).astype(np.int64)
    got = compiled.run({"x": x})["y"]
    np.testing.assert_array_equal(got, (acc * scale).astype(np.float32))
    # onnxruntime multiplies the dequantized floats; the bias here is rounded to sx * sw
    np.testing.assert_allclose(got, onnxruntime_outputs(m, {"x": x})[0], rtol=1e-5,
                               atol=float(scale.max()))


# --- errors -----------------------------------------------------------------------------------

@pytest.mark.unit
def test_profiles_of_other_models_and_bad_arguments_are_refused(cnn, profile, tmp_path):
    other = small_cnn()
    with pytest.raises(pf.ArgumentError, match="another model"):
        pf.compile(other, precision="int8", profile=profile)
    with pytest.raises(pf.ArgumentError, match="another model"):
        quantize(other, profile)
    with pytest.raises(pf.ArgumentError, match="precision must be"):
        pf.compile(cnn, precision="int4")
    with pytest.raises(pf.ArgumentError, match="needs profile"):
        pf.compile(cnn, precision="int8")
    with pytest.raises(pf.ArgumentError, match="precision='int8'"):
        pf.compile(cnn, profile=profile)
    with pytest.raises(pf.ArgumentError, match="calibration method"):
        pf.QuantizeOptions(method="kl")
    with pytest.raises(pf.ArgumentError, match="percentile"):
        pf.QuantizeOptions(method="percentile", percentile=20)
    with pytest.raises(pf.ArgumentError, match="keep_float names no node"):
        quantize(cnn, profile, pf.QuantizeOptions(keep_float=frozenset({"conv9"})))
    with pytest.raises(pf.ArgumentError, match="iterable of feeds"):
        pf.compile(cnn, target="host").profile_ranges({"x": samples(1)[0]["x"]})
    with pytest.raises(pf.ArgumentError, match="cannot read the profile"):
        pf.compile(cnn, precision="int8", profile=tmp_path / "none.json")
    onnx.save(cnn, tmp_path / "cnn.onnx")
    np.savez(tmp_path / "bad.npz", y=np.zeros((2, 1, 3, 8, 8), np.float32))
    assert main(["profile", str(tmp_path / "cnn.onnx"), "--inputs", str(tmp_path / "bad.npz"),
                 "-o", str(tmp_path / "p.json")]) == 1
