"""The quantization ops against exact numpy references (ONNX's formulas in int32 and
float64) and onnxruntime, at odd sizes, per-axis and blocked scales and negative zero
points, on native code and the reference interpreter."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import polyfuse as pf
from tests.onnx.ort_compare import one_node_model, onnx_reference_outputs, onnxruntime_outputs

RNG = np.random.default_rng(7)
TARGETS = ["host", "reference"]


def ints(dtype, *shape):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def model(op, feeds, outputs, constants=None, opset=21, **attrs):
    names = [*feeds, *(constants or {})]
    node = helper.make_node(op, names, list(outputs), name="q", **attrs)
    return one_node_model(node, feeds, outputs, constants, opset=opset)


def run(m, feeds, target):
    got = pf.compile(m, target=target).run(feeds)
    return [got[o.name] for o in m.graph.output]


def assert_same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def saturate(v, dtype):
    info = np.iinfo(dtype)
    return np.clip(v, info.min, info.max).astype(dtype)


# --- QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear ------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_quantize_per_tensor_rounds_half_to_even_and_saturates(target):
    x = (RNG.integers(-300, 300, (3, 5, 7)) * 0.5).astype(np.float32)  # many exact halves
    x[0, 0, :3] = [1e9, -1e9, 2.5]
    s, z = np.float32(0.5), np.int8(-3)
    m = model("QuantizeLinear", {"x": x}, {"y": TensorProto.INT8}, {"s": s, "z": z})
    (got,) = run(m, {"x": x}, target)
    assert_same(got, saturate(np.rint(x / s) + z, np.int8))
    assert_same(got, onnxruntime_outputs(m, {"x": x})[0])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.int16])
def test_quantize_per_axis(dtype, target):
    x = RNG.normal(0, 300, (2, 5, 3)).astype(np.float32)
    s = RNG.uniform(0.01, 3, 5).astype(np.float32)
    z = ints(dtype, 5)
    m = model("QuantizeLinear", {"x": x}, {"y": helper.np_dtype_to_tensor_dtype(np.dtype(dtype))},
              {"s": s, "z": z}, axis=-2)
    (got,) = run(m, {"x": x}, target)
    want = saturate(np.rint(x / s[:, None]) + z[:, None].astype(np.int32), dtype)
    assert_same(got, want)
    assert_same(got, onnxruntime_outputs(m, {"x": x})[0])


@pytest.mark.parametrize("target", TARGETS)
def test_quantize_blocked_with_a_short_last_block_and_output_dtype(target):
    x = RNG.normal(0, 50, (4, 7)).astype(np.float32)
    s = RNG.uniform(0.1, 2, (4, 3)).astype(np.float32)          # blocks of 3: 3 + 3 + 1
    m = model("QuantizeLinear", {"x": x}, {"y": TensorProto.INT16}, {"s": s},
              axis=1, block_size=3, output_dtype=TensorProto.INT16)
    (got,) = run(m, {"x": x}, target)
    assert_same(got, saturate(np.rint(x / np.repeat(s, 3, axis=1)[:, :7]), np.int16))


@pytest.mark.parametrize("target", TARGETS)
def test_quantize_float16_divides_in_float16(target):
    x = RNG.normal(0, 20, (9,)).astype(np.float16)
    s = np.float16(0.3)
    m = model("QuantizeLinear", {"x": x}, {"y": TensorProto.UINT8}, {"s": s, "z": np.uint8(128)})
    (got,) = run(m, {"x": x}, target)
    assert_same(got, saturate(np.rint((x / s).astype(np.float32)) + 128, np.uint8))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32])
def test_dequantize_per_axis(dtype, target):
    x, z = ints(dtype, 3, 4, 5), ints(dtype, 4)
    s = RNG.uniform(0.001, 2, 4).astype(np.float32)
    m = model("DequantizeLinear", {"x": x}, {"y": TensorProto.FLOAT}, {"s": s, "z": z})
    (got,) = run(m, {"x": x}, target)
    want = ((x.astype(np.float64) - z[:, None]) * s[:, None]).astype(np.float32)
    assert_same(got, want)
    if dtype != np.int32:   # onnxruntime computes int32's x - z in float32
        assert_same(got, onnxruntime_outputs(m, {"x": x})[0])


@pytest.mark.parametrize("target", TARGETS)
def test_dequantize_blocked_to_float16(target):
    x, z = ints(np.int8, 5, 6), ints(np.int8, 2, 6)
    s = RNG.uniform(0.01, 1, (2, 6)).astype(np.float32)
    m = model("DequantizeLinear", {"x": x}, {"y": TensorProto.FLOAT16}, {"s": s, "z": z},
              opset=23, axis=0, block_size=4, output_dtype=TensorProto.FLOAT16)
    (got,) = run(m, {"x": x}, target)
    rows = [0, 0, 0, 0, 1]
    want = ((x.astype(np.float32) - z[rows]) * s[rows]).astype(np.float16)
    assert_same(got, want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("low, high", [(-3.0, 7.0), (0.5, 9.0), (-8.0, -1.0)])
def test_dynamic_quantize(low, high, target):
    x = RNG.uniform(low, high, (3, 11)).astype(np.float32)
    m = model("DynamicQuantizeLinear", {"x": x},
              {"y": TensorProto.UINT8, "s": TensorProto.FLOAT, "z": TensorProto.UINT8})
    y, s, z = run(m, {"x": x}, target)
    hi, lo = np.float32(max(x.max(), 0)), np.float32(min(x.min(), 0))
    scale = np.float32(hi - lo) / np.float32(255)
    zero = np.rint(np.clip(np.float32(0) - lo / scale, 0, 255))
    assert_same(s, np.array(scale))
    assert_same(z, np.array(zero.astype(np.uint8)))
    assert_same(y, np.clip(np.rint(x / scale) + zero, 0, 255).astype(np.uint8))
    for got, want in zip((y, s, z), onnxruntime_outputs(m, {"x": x})):
        assert_same(got, want)


# --- MatMulInteger, QLinearMatMul ---------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_matmul_integer_batched_per_row_and_column_zero_points(target):
    a, b = ints(np.uint8, 2, 5, 301), ints(np.int8, 301, 7)   # sums far past int16
    za, zb = ints(np.uint8, 5), ints(np.int8, 7)
    m = model("MatMulInteger", {"a": a, "b": b, "za": za, "zb": zb}, {"y": TensorProto.INT32})
    (got,) = run(m, {"a": a, "b": b, "za": za, "zb": zb}, target)
    want = (a.astype(np.int64) - za[:, None]) @ (b.astype(np.int64) - zb)
    assert np.abs(want).max() > 2**16
    assert_same(got, want.astype(np.int32))


@pytest.mark.parametrize("target", TARGETS)
def test_matmul_integer_vector_and_scalar_zero_point(target):
    a, b, za = ints(np.int8, 13), ints(np.uint8, 3, 13, 4), np.int8(-5)
    m = model("MatMulInteger", {"a": a, "b": b}, {"y": TensorProto.INT32}, {"za": za})
    (got,) = run(m, {"a": a, "b": b}, target)
    assert_same(got, ((a.astype(np.int32) - za) @ b.astype(np.int32)))
    assert_same(got, onnxruntime_outputs(m, {"a": a, "b": b})[0])


def requantize(acc, factor, zero, dtype):
    return saturate(np.rint(acc.astype(np.float64) * np.float64(factor)) + zero, dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_matmul(dtype, target):
    a, b = ints(dtype, 3, 9, 17), ints(dtype, 17, 6)
    sa, sb, sy = np.float32(0.02), RNG.uniform(0.01, 0.05, 6).astype(np.float32), np.float32(0.7)
    za, zb, zy = ints(dtype, 1), ints(dtype, 6), np.array(-7 if dtype == np.int8 else 100, dtype)
    consts = {"sa": sa, "za": za, "sb": sb, "zb": zb, "sy": sy, "zy": zy}
    node = helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"],
                            name="q")
    m = one_node_model(node, {"a": a, "b": b}, {"y": helper.np_dtype_to_tensor_dtype(np.dtype(dtype))},
                       consts)
    (got,) = run(m, {"a": a, "b": b}, target)
    acc = (a.astype(np.int32) - za) @ (b.astype(np.int32) - zb)
    assert_same(got, requantize(acc, np.float32(sa * sb) / sy, zy, dtype))
    # onnxruntime requantizes in float32: a tie may round the other way
    assert np.abs(got.astype(int) - onnxruntime_outputs(m, {"a": a, "b": b})[0]).max() <= 1


# --- ConvInteger, QLinearConv ----------------------------------------------------------------

def conv(x, w, stride, pads, group):
    """Integer Conv of int64 x (N, C, H, W) with w (M, C / group, KH, KW), zero padding."""
    (n, _c, _h, _wd), (m, cg, kh, kw) = x.shape, w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh, ow = (xp.shape[2] - kh) // stride + 1, (xp.shape[3] - kw) // stride + 1
    out, mg = np.zeros((n, m, oh, ow), np.int64), m // group
    for g in range(group):
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg, i:i + stride * oh:stride, j:j + stride * ow:stride]
                out[:, g * mg:(g + 1) * mg] += np.einsum("nchw,mc->nmhw", patch,
                                                         w[g * mg:(g + 1) * mg, :, i, j])
    return out


CONVS = [  # x shape, w shape, stride, pads, group
    ((2, 3, 7, 6), (5, 3, 3, 3), 1, (1, 0, 1, 2), 1),
    ((1, 4, 9, 9), (6, 2, 3, 2), 2, (2, 1, 0, 1), 2),
    ((1, 5, 6, 7), (5, 1, 3, 3), 1, (1, 1, 1, 1), 5),
]
# constant weights sum channels-last, 8-bit ones 4 channels a word (dot4): channel counts
# no multiple of 4 or of a vector, maps no register block divides
WORD_CONVS = [
    ((1, 3, 9, 5), (17, 3, 3, 3), 2, (1, 1, 1, 1), 1),
    ((2, 17, 7, 7), (40, 17, 3, 3), 1, (1, 0, 2, 1), 1),
    ((1, 40, 7, 7), (3, 40, 1, 1), 1, (0, 0, 0, 0), 1),
    # no padding and whole words: the product reads the words in place, no copy
    ((1, 24, 9, 7), (20, 24, 1, 1), 2, (0, 0, 0, 0), 1),
    ((2, 8, 7, 6), (33, 8, 3, 2), 1, (0, 0, 0, 0), 1),
    ((1, 16, 12, 12), (64, 16, 1, 1), 1, (0, 0, 0, 0), 1),   # 4 words: register blocks still
    ((1, 40, 9, 5), (40, 1, 3, 3), 2, (1, 1, 1, 1), 40),   # depthwise: int32 products
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("xs, ws, stride, pads, group", CONVS)
def test_conv_integer_per_channel_zero_point(xs, ws, stride, pads, group, target):
    x, w = ints(np.uint8, *xs), ints(np.int8, *ws)
    zx, zw = np.uint8(131), ints(np.int8, ws[0])
    m = model("ConvInteger", {"x": x, "w": w}, {"y": TensorProto.INT32}, {"zx": zx, "zw": zw},
              strides=[stride] * 2, pads=list(pads), group=group)
    (got,) = run(m, {"x": x, "w": w}, target)
    want = conv(x.astype(np.int64) - zx, w.astype(np.int64) - zw[:, None, None, None], stride,
                pads, group)
    assert_same(got, want.astype(np.int32))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("xs, ws, stride, pads, group", CONVS + WORD_CONVS)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_conv_with_bias_and_per_channel_scales(dtype, xs, ws, stride, pads, group, target):
    x, w = ints(dtype, *xs), ints(np.int8, *ws)
    sx, zx = np.float32(0.05), np.array(-9 if dtype == np.int8 else 140, dtype)
    sw, zw = RNG.uniform(0.005, 0.02, ws[0]).astype(np.float32), np.zeros(ws[0], np.int8)
    sy, zy = np.float32(0.4), np.array(5, dtype)
    bias = RNG.integers(-3000, 3000, ws[0]).astype(np.int32)
    consts = {"sx": sx, "zx": zx, "w": w, "sw": sw, "zw": zw, "sy": sy, "zy": zy, "b": bias}
    node = helper.make_node("QLinearConv", ["x", *consts], ["y"], name="q", strides=[stride] * 2,
                            pads=list(pads), group=group)
    m = one_node_model(node, {"x": x}, {"y": helper.np_dtype_to_tensor_dtype(np.dtype(dtype))},
                       consts)
    compiled = pf.compile(m, target=target)
    got = compiled.run({"x": x})["y"]
    acc = conv(x.astype(np.int64) - zx, w.astype(np.int64), stride, pads, group)
    acc += bias[:, None, None]
    want = requantize(acc, (np.float32(sx * sw) / sy)[:, None, None], zy, dtype)
    assert_same(got, want)
    assert len(np.unique(got)) > 20
    assert np.abs(got.astype(int) - onnx_reference_outputs(m, {"x": x})[0]).max() <= 1
    # the weights (constants) are words of 4 channels, but for grouped convolutions'; the
    # input is copied into words where padding or a short last word needs it
    text = compiled.dump("specialized")
    assert ("dot4(" in text) == (group == 1)
    assert ("dot4(P(" in text) == (group == 1 and (any(pads) or xs[1] % 4 != 0))
    if ws == (64, 16, 1, 1) and target == "host":   # each dot4 step sums 4 channels: deep enough
        assert "acc(0, " in compiled.dump("loops")


def one_hot_conv(x, sw, zy, bias=None):
    """QLinearConv 1x1 of x whose output channel m is ``x[:, 0] * sw[m] + bias[m]`` requantized,
    with unit input and output scales (so the factor is sw[m] itself)."""
    m, dtype = len(sw), x.dtype.type
    w = np.zeros((m, x.shape[1], 1, 1), np.int8)
    w[:, 0] = 1
    consts = {"sx": np.float32(1), "zx": np.array(0, dtype), "w": w, "sw": sw,
              "zw": np.zeros(m, np.int8), "sy": np.float32(1), "zy": zy}
    if bias is not None:
        consts["b"] = bias
    node = helper.make_node("QLinearConv", ["x", *consts], ["y"], name="q")
    return one_node_model(node, {"x": x}, {"y": helper.np_dtype_to_tensor_dtype(np.dtype(dtype))},
                          consts)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_requantization_rounds_the_exact_product_at_ties(dtype, target):
    # factors h / a0 put a0 * factor just off a tie h + 0.5 that float32's product rounds onto
    info = np.iinfo(dtype)
    x = ints(dtype, 1, 4, 16, 16)
    x[0, 0] = RNG.permutation(np.arange(info.min, info.max + 1)).reshape(16, 16)   # every value
    a0 = RNG.integers(30, 127, 40) * RNG.choice([-1, 1], 40)
    sw = ((RNG.integers(0, 60, 40) + 0.5) * np.sign(a0) / a0).astype(np.float32)
    zy = np.array(-5 if dtype == np.int8 else 120, dtype)
    bias = RNG.integers(-3, 3, 40).astype(np.int32)
    got = pf.compile(one_hot_conv(x, sw, zy, bias), target=target).run({"x": x})["y"]
    acc = x[:, :1].astype(np.int64) + bias[:, None, None]
    want = requantize(acc, sw[:, None, None], zy, dtype)
    assert_same(got, want)
    float32_product = saturate(np.rint(acc.astype(np.float32) * sw[:, None, None]) + zy, dtype)
    assert (float32_product != want).sum() > 20    # the ties this test is about


@pytest.mark.parametrize("target", TARGETS)
def test_sums_past_float32s_integers_requantize_exactly(target):
    # 600 channels of 255 * -128: sums to about -2**24.2, scaled back into range
    x = np.full((1, 600, 2, 3), 255, np.uint8)
    x[0, :, 1] = RNG.integers(0, 256, (600, 3))
    w = np.full((2, 600, 1, 1), -128, np.int8)
    sw = np.array([2.0**-17 * 1.000001, 3e-6], np.float32)
    consts = {"sx": np.float32(1), "zx": np.array(0, np.uint8), "w": w, "sw": sw,
              "zw": np.zeros(2, np.int8), "sy": np.float32(1), "zy": np.array(255, np.uint8)}
    node = helper.make_node("QLinearConv", ["x", *consts], ["y"], name="q")
    m = one_node_model(node, {"x": x}, {"y": TensorProto.UINT8}, consts)
    compiled = pf.compile(m, target=target)
    got = compiled.run({"x": x})["y"]
    acc = np.einsum("nchw,mc->nmhw", x.astype(np.int64), w[:, :, 0, 0].astype(np.int64))
    assert np.abs(acc).max() > 2**24
    assert_same(got, requantize(acc, sw[:, None, None], np.uint8(255), np.uint8))
    assert 0 < got.min() and got.max() < 255


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("zw", [0, 1])
def test_conv_integer_with_constant_weights_and_zero_points(zw, target):
    """int8 weights less per-channel zero points run as words; uint8 ones less theirs
    (beyond int8) as int32 products."""
    x = ints(np.uint8, 2, 17, 9, 5)
    for wt in (np.int8, np.uint8):
        w = ints(wt, 6, 17, 3, 3)
        zws = (ints(wt, 6) // 2 if zw else np.zeros(6, wt))
        zx = np.uint8(77)
        m = model("ConvInteger", {"x": x}, {"y": TensorProto.INT32},
                  {"w": w, "zx": zx, "zw": zws}, strides=[2, 2], pads=[1, 2, 0, 1])
        m.graph.node[0].input[:] = ["x", "w", "zx", "zw"]
        (got,) = run(m, {"x": x}, target)
        want = conv(x.astype(np.int64) - zx, w.astype(np.int64) - zws[:, None, None, None], 2,
                    (1, 2, 0, 1), 1)
        assert_same(got, want.astype(np.int32))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("k, n", [(17, 6), (40, 33)])
def test_qlinear_matmul_with_constant_weights(dtype, k, n, target):
    a, b = ints(dtype, 2, 5, k), ints(np.int8, k, n)
    sa, sb, sy = np.float32(0.02), RNG.uniform(0.01, 0.05, n).astype(np.float32), np.float32(0.3)
    za, zb = np.array(3 if dtype == np.int8 else 120, dtype), np.zeros(n, np.int8)
    zy = np.array(0 if dtype == np.int8 else 128, dtype)
    consts = {"sa": sa, "za": za, "b": b, "sb": sb, "zb": zb, "sy": sy, "zy": zy}
    node = helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"],
                            name="q")
    m = one_node_model(node, {"a": a}, {"y": helper.np_dtype_to_tensor_dtype(np.dtype(dtype))}, consts)
    compiled = pf.compile(m, target=target)
    got = compiled.run({"a": a})["y"]
    acc = (a.astype(np.int64) - za) @ b.astype(np.int64)
    assert_same(got, requantize(acc, np.float32(sa * sb) / sy, zy, dtype))
    text = compiled.dump("specialized")
    assert len(np.unique(got)) > 20 and "dot4(" in text
    assert ("dot4(Ap(" in text) == (k % 4 != 0)   # whole words of A are read in place


# --- errors ----------------------------------------------------------------------------------

@pytest.mark.unit
def test_a_scale_of_the_wrong_shape_names_the_node():
    x = np.zeros((2, 3), np.float32)
    m = model("QuantizeLinear", {"x": x}, {"y": TensorProto.UINT8},
              {"s": np.ones(2, np.float32), "z": np.zeros(2, np.uint8)}, axis=1)
    with pytest.raises(pf.ModelError, match=r"node 'q' \(QuantizeLinear\): input 1 has shape \(2,\)"):
        run(m, {"x": x}, "reference")


@pytest.mark.unit
def test_a_zero_point_per_column_of_the_wrong_size_names_the_node():
    a, b = ints(np.uint8, 4, 5), ints(np.uint8, 5, 3)
    m = model("MatMulInteger", {"a": a, "b": b}, {"y": TensorProto.INT32},
              {"za": np.zeros(1, np.uint8), "zb": np.zeros(4, np.uint8)})
    with pytest.raises(pf.ModelError, match=r"node 'q' \(MatMulInteger\): the zero point of B"):
        run(m, {"a": a, "b": b}, "reference")


@pytest.mark.unit
def test_channels_that_do_not_split_into_groups_name_the_node():
    x, w = ints(np.uint8, 1, 3, 4, 4), ints(np.uint8, 4, 2, 1, 1)
    node = helper.make_node("ConvInteger", ["x", "w"], ["y"], name="q", group=2)
    m = one_node_model(node, {"x": x, "w": w}, {"y": TensorProto.INT32})
    with pytest.raises(pf.ModelError, match=r"node 'q' \(ConvInteger\).*do not split"):
        run(m, {"x": x, "w": w}, "reference")
