"""precision="bf16": products by constant weights on bfloat16 operands, against numpy
products of the operands rounded to bfloat16 (summed in float64: the kernels' float32
sums are within a few ulps of those) and, loosely, against the float32 model."""

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

import polyfuse as pf
from polyfuse.targets.cpu import native_dots, native_tiles
from polyfuse.targets.target import Target
from tests.onnx.ort_compare import one_node_model, onnxruntime_outputs
from tests.onnx.test_quantization import make_model

RNG = np.random.default_rng(4)
F = TensorProto.FLOAT


def bf16(x):
    """``x`` rounded to bfloat16 (to nearest even), in float64."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def conv2d(x, w, stride, pad):
    """A float64 convolution of one group (NCHW, OIHW)."""
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    kh, kw = w.shape[2:]
    oh, ow = (x.shape[2] - kh) // stride + 1, (x.shape[3] - kw) // stride + 1
    out = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
            out += np.einsum("nchw,mc->nmhw", patch, w[:, :, i, j])
    return out


def weights(*shape):
    return RNG.normal(0, 1 / np.sqrt(np.prod(shape[1:]) or shape[0]), shape).astype(np.float32)


@pytest.fixture(scope="module")
def products():
    """MatMul (batched, K 13) -> Gemm (transB, alpha, beta, broadcast C, K 19) on one
    input; Conv (5 channels, 3x3, padded, strided) -> Relu and a 1x1 Conv (17 channels)
    on another: no extent a multiple of 16, every reduction of odd length."""
    init = {"w1": weights(13, 19), "w2": weights(21, 19), "c2": weights(21),
            "wc": weights(17, 5, 3, 3), "bc": weights(17), "w1x1": weights(11, 17, 1, 1)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Reshape", ["h", "shape"], ["h2"]),
             helper.make_node("Gemm", ["h2", "w2", "c2"], ["y"], transB=1, alpha=0.5, beta=2.0),
             helper.make_node("Conv", ["z", "wc", "bc"], ["c"], pads=[1] * 4, strides=[1, 2]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w1x1"], ["p"])]
    init["shape"] = np.array([-1, 19])
    return make_model(nodes, [helper.make_tensor_value_info("x", F, [2, 9, 13]),
                              helper.make_tensor_value_info("z", F, [2, 5, 7, 9])],
                      [helper.make_tensor_value_info("y", F, [18, 21]),
                       helper.make_tensor_value_info("p", F, [2, 11, 7, 5])], init), init


def oracle(init, x, z, rounded):
    """The model in float64, its products' operands rounded to bfloat16 when ``rounded``."""
    r = bf16 if rounded else (lambda a: np.asarray(a, np.float64))
    h = (r(x) @ r(init["w1"])).reshape(-1, 19).astype(np.float32)
    y = 0.5 * r(h) @ r(init["w2"]).T + 2.0 * init["c2"]
    c = conv2d(r(z), r(init["wc"]), 1, 1)[:, :, :, ::2] + init["bc"][None, :, None, None]
    relu = np.maximum(c, 0).astype(np.float32)
    return y, conv2d(r(relu), r(init["w1x1"]), 1, 0)


@pytest.mark.parametrize("target", ["host", "x86:skylake", "reference"])
def test_products_run_on_bfloat16_operands(products, target):
    model, init = products
    x, z = RNG.normal(size=(2, 9, 13)).astype(np.float32), RNG.normal(size=(2, 5, 7, 9)).astype(np.float32)
    compiled = pf.compile(model, target=target, precision="bf16")
    y, p = compiled(x, z)
    for got, want in zip((y, p), oracle(init, x, z, rounded=True)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    for got, want in zip((y, p), oracle(init, x, z, rounded=False)):
        np.testing.assert_allclose(got, want, rtol=0.05, atol=0.02 * np.abs(want).max())
        cosine = (got.ravel() @ want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want)
        assert cosine > 0.999
    graph = compiled.dump("partition_fusion_groups")
    assert "BFloat16MatMul" in graph and "BFloat16Gemm" in graph and graph.count("BFloat16Conv") == 2


def test_products_are_vdpbf16ps_on_this_cpu_and_float32_stays_float32(products):
    model, _ = products
    x, z = RNG.normal(size=(2, 9, 13)).astype(np.float32), RNG.normal(size=(2, 5, 7, 9)).astype(np.float32)
    bf = pf.compile(model, target="host", precision="bf16")
    bf(x, z)
    native = "bfdot2" in native_dots(Target.parse("host"))
    assert ("vdpbf16ps" in bf.dump("asm")) == native
    f32 = pf.compile(model, target="host")
    f32(x, z)
    assert "BFloat16" not in f32.dump("partition_fusion_groups") and "bfdot2" not in f32.dump("specialized")


# (node, input shape, weight shape, bias shape or None)
SHAPES = [
    (helper.make_node("MatMul", ["x", "w"], ["y"]), (13,), (13, 20), None),
    (helper.make_node("MatMul", ["x", "w"], ["y"]), (3, 4, 33), (33, 17), None),
    (helper.make_node("Gemm", ["x", "w"], ["y"], transA=1), (15, 6), (15, 20), None),
    (helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, beta=0.5), (10, 7), (20, 7), (20,)),
    (helper.make_node("Conv", ["x", "w"], ["y"], dilations=[2], pads=[2, 1]), (1, 3, 11), (8, 3, 3),
     None),
    (helper.make_node("Conv", ["x", "w", "b"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2]),
     (1, 7, 6, 6), (16, 7, 3, 3), (16,)),
    (helper.make_node("Conv", ["x", "w"], ["y"]), (2, 33, 4, 5), (19, 33, 1, 1), None),
]


@pytest.mark.parametrize("node, x_shape, w_shape, b_shape", SHAPES,
                         ids=lambda v: getattr(v, "op_type", None))
def test_each_product_is_onnxruntimes_on_rounded_operands(node, x_shape, w_shape, b_shape):
    x = RNG.normal(size=x_shape).astype(np.float32)
    constants = {"w": weights(*w_shape)} | ({"b": weights(*b_shape)} if b_shape else {})
    model = one_node_model(node, {"x": x}, {"y": F}, constants)
    compiled = pf.compile(model, target="host", precision="bf16")
    got = compiled.run({"x": x})["y"]
    assert f"BFloat16{node.op_type}" in compiled.dump("use_bfloat16_products")
    rounded = {n: a.astype(ml_dtypes.bfloat16).astype(np.float32) if n == "w" else a
               for n, a in constants.items()}
    want = onnxruntime_outputs(one_node_model(node, {"x": x}, {"y": F}, rounded),
                               {"x": bf16(x).astype(np.float32)})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_grouped_convolutions_and_activation_products_stay_float32():
    """A depthwise Conv (no reduction over channels to pair) and a MatMul of two inputs
    keep float32 operands: their results are the float32 ones."""
    init = {"wd": weights(6, 1, 3, 3)}
    nodes = [helper.make_node("Conv", ["z", "wd"], ["d"], group=6, pads=[1] * 4),
             helper.make_node("MatMul", ["a", "b"], ["m"])]
    model = make_model(nodes, [helper.make_tensor_value_info("z", F, [1, 6, 5, 5]),
                               helper.make_tensor_value_info("a", F, [3, 8]),
                               helper.make_tensor_value_info("b", F, [8, 4])],
                       [helper.make_tensor_value_info("d", F, [1, 6, 5, 5]),
                        helper.make_tensor_value_info("m", F, [3, 4])], init)
    z, a, b = (RNG.normal(size=s).astype(np.float32) for s in ((1, 6, 5, 5), (3, 8), (8, 4)))
    compiled = pf.compile(model, target="host", precision="bf16")
    d, m = compiled(z, a, b)
    np.testing.assert_allclose(m, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-6)
    want = np.stack([conv2d(z[:, c:c + 1].astype(np.float64), init["wd"][c:c + 1], 1, 1)[:, 0]
                     for c in range(6)], axis=1)
    np.testing.assert_allclose(d, want, rtol=1e-5, atol=1e-6)
    assert "BFloat16" not in compiled.dump("partition_fusion_groups")


@pytest.mark.unit
@pytest.mark.parametrize("kwargs, match", [
    ({"precision": "bfloat16"}, "precision must be one of 'float32', 'tf32', 'bf16', 'int8'"),
    ({"precision": "bf16", "profile": "p.json"}, "calibrate precision='int8'"),
])
def test_bad_precisions_are_argument_errors(products, kwargs, match):
    with pytest.raises(pf.ArgumentError, match=match):
        pf.compile(products[0], target="host", **kwargs)


@pytest.mark.skipif("bfdot2" not in native_tiles(Target.parse("host")),
                    reason="the host has no AMX-BF16 tiles (or Linux does not grant them)")
def test_products_run_on_amx_tiles_with_their_epilogues():
    """Where the host has AMX, the products deep and wide enough for tiles (two MatMuls
    with a bias and Relu between them, a Conv with bias and Relu) run on them; rows,
    columns and depths no tile divides; the epilogues apply to each block."""
    init = {"w1": weights(96, 80), "b1": weights(80), "w2": weights(80, 48), "b2": weights(48),
            "wc": weights(40, 32, 3, 3), "bc": weights(40)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["g"]), helper.make_node("MatMul", ["g", "w2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["y"]),
             helper.make_node("Conv", ["z", "wc", "bc"], ["c"], pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["r"])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F, [1, 70, 96]),
                               helper.make_tensor_value_info("z", F, [1, 32, 9, 11])],
                       [helper.make_tensor_value_info("y", F, [1, 70, 48]),
                        helper.make_tensor_value_info("r", F, [1, 40, 9, 11])], init)
    x, z = RNG.normal(size=(1, 70, 96)).astype(np.float32), RNG.normal(size=(1, 32, 9, 11)).astype(np.float32)
    compiled = pf.compile(model, target="host", precision="bf16")
    y, r = compiled(x, z)
    g = np.maximum(bf16(x) @ bf16(init["w1"]) + init["b1"], 0).astype(np.float32)
    want_y = bf16(g) @ bf16(init["w2"]) + init["b2"]
    want_r = np.maximum(conv2d(bf16(z), bf16(init["wc"]), 1, 1) + init["bc"][None, :, None, None], 0)
    for got, want in ((y, want_y), (r, want_r)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert compiled.dump("loops").count("tile bfdot2(") >= 3 and "tdpbf16ps" in compiled.dump("asm")
