"""Convolutions and pools on native code, against onnxruntime: a small CNN, then single
ops whose shapes take the paths the node tests are too small for (tiled contractions)."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf

RNG = np.random.default_rng(0)


def _weights(*shape):
    return (RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def _model(nodes, x_shape, outputs, initializers):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(name, dtype, shape) for name, dtype, shape in outputs],
        [numpy_helper.from_array(a, n) for n, a in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _compare(model, x):
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = pf.compile(model, target="host").run({"x": x})
    for value, expected in zip(model.graph.output, want):
        assert got[value.name].shape == expected.shape
        np.testing.assert_allclose(got[value.name], expected, rtol=1e-3, atol=1e-4)


def small_cnn():
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        node("Relu", ["c1"], ["r1"]),
        node("Conv", ["r1", "W2"], ["c2"], pads=[1, 1, 1, 1], group=2),
        node("Conv", ["c2", "W3", "B3"], ["c3"], pads=[1, 1, 1, 1], group=8),  # depthwise
        node("Relu", ["c3"], ["r3"]),
        node("MaxPool", ["r3"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        node("AveragePool", ["p1"], ["p2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
             count_include_pad=1),
        node("GlobalAveragePool", ["p2"], ["g"]),
        node("Flatten", ["g"], ["f"]),
        node("Gemm", ["f", "W4", "B4"], ["y"], transB=1),
    ]
    weights = {"W1": _weights(8, 3, 3, 3), "B1": _weights(8), "W2": _weights(8, 4, 3, 3),
               "W3": _weights(8, 1, 3, 3), "B3": _weights(8), "W4": _weights(10, 8),
               "B4": _weights(10)}
    return _model(nodes, [2, 3, 16, 16], [("y", TensorProto.FLOAT, [2, 10])], weights)


def test_small_cnn_matches_onnxruntime():
    _compare(small_cnn(), RNG.standard_normal((2, 3, 16, 16)).astype(np.float32))


def _single(op, x_shape, attrs, weights=(), outputs=1):
    names = ["x", *(f"w{k}" for k in range(len(weights)))]
    node = helper.make_node(op, names, [f"y{k}" for k in range(outputs)], **attrs)
    out = [(f"y{k}", TensorProto.FLOAT if k == 0 else TensorProto.INT64, None)
           for k in range(outputs)]
    return _model([node], x_shape, out, {f"w{k}": w for k, w in enumerate(weights)})


@pytest.mark.parametrize("op, x_shape, attrs, weights, outputs", [
    # big enough for the contraction schedule (tiles, register blocks) over padded reads
    ("Conv", [1, 16, 20, 19], dict(pads=[1, 2, 1, 0], strides=[2, 2]),
     (_weights(32, 16, 3, 3), _weights(32)), 1),
    ("Conv", [1, 16, 18, 16], dict(pads=[1, 1, 1, 1], group=4, dilations=[1, 2]),
     (_weights(32, 4, 3, 3),), 1),
    ("ConvTranspose", [1, 4, 5, 6], dict(strides=[2, 3], pads=[1, 0, 0, 1], output_padding=[1, 0],
                                         group=2), (_weights(4, 3, 3, 2),), 1),
    ("MaxPool", [2, 3, 9, 8], dict(kernel_shape=[3, 2], pads=[1, 1, 1, 0], strides=[2, 2]), (), 2),
    ("MaxPool", [1, 2, 7, 6], dict(kernel_shape=[2, 3], storage_order=1, ceil_mode=1,
                                   strides=[2, 2]), (), 2),
    ("AveragePool", [1, 2, 9, 8], dict(kernel_shape=[3, 2], pads=[1, 0, 2, 1], strides=[2, 3],
                                       ceil_mode=1), (), 1),
    ("LpPool", [1, 2, 7, 7], dict(kernel_shape=[3, 2], p=3, strides=[2, 2], pads=[1, 1, 0, 0]),
     (), 1),
])
def test_single_op_matches_onnxruntime(op, x_shape, attrs, weights, outputs):
    model = _single(op, x_shape, attrs, weights, outputs)
    shapes = [o.shape for o in ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.zeros(x_shape, np.float32)})]
    for value, shape in zip(model.graph.output, shapes):  # outputs need shapes to pass the checker
        value.CopyFrom(helper.make_tensor_value_info(
            value.name, value.type.tensor_type.elem_type, shape))
    _compare(model, RNG.standard_normal(x_shape).astype(np.float32))


@pytest.mark.parametrize("target", ["host", "reference"])
@pytest.mark.parametrize("rows, alpha, beta", [(13, 1.0, 1.0), (13, 0.5, 2.0), (1, 1.0, 1.0)])
def test_gemm_with_constant_transposed_weights_multiplies_their_transpose(target, rows, alpha, beta):
    """torch's Linear exports Gemm(x, W, b, transB=1) with W of shape (out, in): polyfuse
    transposes W once at compile time (a constant parameter of shape (in, out)), so the
    product runs the register-blocked micro-kernel; 70 x 37 do not divide its blocks. One
    row (a classifier head on one image) keeps W as it is, for dot products."""
    w, b = _weights(70, 37), RNG.standard_normal(70).astype(np.float32)
    node = helper.make_node("Gemm", ["x", "W", "B"], ["y"], transB=1, alpha=alpha, beta=beta)
    model = _model([node], [rows, 37], [("y", TensorProto.FLOAT, [rows, 70])], {"W": w, "B": b})
    x = RNG.standard_normal((rows, 37)).astype(np.float32)
    compiled = pf.compile(model, target=target)
    np.testing.assert_allclose(compiled(x), alpha * x @ w.T + beta * b, rtol=1e-4, atol=1e-5)
    [(step, kernel)] = list(compiled.plan_for().steps())
    assert ("float32(37, 70) B" if rows > 1 else "float32(70, 37) B") in kernel.stages["specialized"]


@pytest.mark.unit
@pytest.mark.parametrize("size, dilation, stride, pad, kept", [
    (14, 12, 1, 12, (0, 3)), (14, 24, 1, 24, (1, 1)), (14, 36, 1, 36, (1, 1)), (56, 1, 1, 1, (0, 3)),
    (9, 6, 2, 6, (0, 3)), (5, 4, 1, 4, (0, 3)), (5, 5, 1, 5, (1, 1)), (30, 20, 2, 20, (0, 3))])
def test_a_window_keeps_the_taps_that_read_inside_the_input(size, dilation, stride, pad, kept):
    from polyfuse.lowering.ops.conv import WindowAxis, live_taps
    out = (size + 2 * pad - 2 * dilation - 1) // stride + 1
    axis = WindowAxis(size, 3, stride, dilation, pad, pad, out)
    (cut,), (first,) = live_taps([axis])
    assert (first, cut.kernel) == kept
    # every output position reads the same input positions through the cut window
    for o in range(out):
        whole = [p for k in range(3) if 0 <= (p := o * stride + k * dilation - pad) < size]
        assert whole == [p for k in range(cut.kernel) if 0 <= (p := o * stride + k * dilation - cut.pad) < size]


@pytest.mark.parametrize("fed", [False, True], ids=["constant-weights", "fed-weights"])
@pytest.mark.parametrize("dilation, group, channels", [(12, 1, 16), (24, 1, 16), (36, 1, 16), (24, 16, 16),
                                                        (13, 2, 16), (20, 1, 24)])
def test_dilated_convolutions_past_a_small_map_match_onnxruntime(dilation, group, channels, fed):
    """DeepLab's atrous pyramid on a 14 x 14 map: the taps that read only padding are
    dropped (a 1 x 1 window at rates 24 and 36), the result unchanged; weights fed at run
    time are read at the kept taps."""
    w = _weights(channels, channels // group, 3, 3)
    x = RNG.standard_normal((1, channels, 14, 14)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "W", "B"], ["y"], dilations=[dilation, dilation], pads=[dilation] * 4,
                            group=group)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)]
    inputs += [helper.make_tensor_value_info("W", TensorProto.FLOAT, w.shape)] if fed else []
    weights = {"B": RNG.standard_normal(channels).astype(np.float32)} | ({} if fed else {"W": w})
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(a, n) for n, a in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feed = {"x": x} | ({"W": w} if fed else {})
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_allclose(pf.compile(model, target="host").run(feed)["y"], want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("fed", [False, True], ids=["constant-weights", "fed-weights"])
@pytest.mark.parametrize("x_shape, per_group, groups, kernel, attrs, padded", [
    # ResNeXt's first stage: 4 channels per group in ONNX's layout, over a padded copy
    ([1, 16, 20, 19], 4, 4, [3, 3], dict(pads=[1, 2, 1, 0], dilations=[1, 2]), True),
    # 16 per group channels-last, padded; 8 per group at stride 2, too few reads per
    # element for the copy: guarded reads
    ([1, 64, 9, 9], 16, 4, [3, 3], dict(pads=[1, 1, 1, 1]), True),
    ([1, 32, 11, 10], 8, 4, [3, 3], dict(pads=[1, 1, 1, 1], strides=[2, 2]), False),
    ([1, 12, 9, 9], 4, 3, [3, 3], dict(pads=[1, 1, 1, 1], strides=[2, 2]), False),
    # depthwise: ConvNeXt's 7 x 7 window over a padded copy, a 3 x 3 one guarded
    ([1, 16, 12, 11], 1, 16, [7, 7], dict(pads=[3, 3, 3, 3]), True),
    ([1, 16, 12, 11], 1, 16, [3, 3], dict(pads=[1, 1, 1, 1]), False),
    # one spatial axis: 4 per group over 9 taps, then 5
    ([2, 8, 30], 4, 2, [9], dict(pads=[4, 3]), True),
    ([2, 8, 30], 4, 2, [5], dict(pads=[2, 2]), False),
])
def test_grouped_convolutions_read_a_padded_copy_where_it_pays(x_shape, per_group, groups, kernel, attrs, padded,
                                                               fed):
    """A grouped or depthwise convolution whose input elements each feed at least
    GROUPED_PAD_READS products sums over a padded copy of its input, with no select in
    the sum, in ONNX's layout (groups narrower than a vector) or channels-last; one with
    fewer guards its reads. Every form against onnxruntime, with and without a bias,
    weights constant or fed."""
    from polyfuse.lowering.ops.conv import GROUPED_PAD_READS
    w = _weights(per_group * groups, x_shape[1] // groups, *kernel)
    strides = attrs.get("strides", [1] * len(kernel))
    assert (per_group * np.prod(kernel) / np.prod(strides) >= GROUPED_PAD_READS) == padded
    x = RNG.standard_normal(x_shape).astype(np.float32)
    for bias in (False, True):
        names = ["x", "W"] + (["B"] if bias else [])
        node = helper.make_node("Conv", names, ["c"], group=groups, kernel_shape=kernel, **attrs)
        relu = helper.make_node("Relu", ["c"], ["y"])
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)]
        inputs += [helper.make_tensor_value_info("W", TensorProto.FLOAT, w.shape)] if fed else []
        weights = ({"B": RNG.standard_normal(w.shape[0]).astype(np.float32)} if bias else {}) | \
            ({} if fed else {"W": w})
        graph = helper.make_graph([node, relu], "g", inputs,
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  [numpy_helper.from_array(a, n) for n, a in weights.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        feed = {"x": x} | ({"W": w} if fed else {})
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
        compiled = pf.compile(model, target="host")
        np.testing.assert_allclose(compiled.run(feed)["y"], want, rtol=1e-3, atol=1e-4)
        if fed and groups == x_shape[1]:
            continue   # a depthwise conv of weights fed at run time: ONNX's layout, always padded
        [sum_line] = [line for line in compiled.dump("kernels").splitlines() if "+=!" in line]
        assert ("_P(" in sum_line and "?" not in sum_line) == padded, sum_line


@pytest.mark.parametrize("x_shape, kernel, strides, copied", [
    ([1, 512, 41], [3], [2], True),           # wav2vec2's feature extractor: pixels 4 KiB apart
    ([1, 512, 40], [2], [2], True),
    ([1, 256, 9, 10], [1, 1], [2, 2], False),  # a 1x1 conv at stride 2 reads a quarter of the pixels
    ([1, 96, 41], [3], [2], False),            # pixels 768 bytes apart: no aliasing
    ([1, 512, 5, 6], [1, 1], [1, 1], False),   # a 1x1 conv reads each pixel once
])
def test_unpadded_windows_over_aliasing_pixels_read_a_copy_at_a_wider_pitch(x_shape, kernel, strides, copied):
    """A channels-last convolution whose windows need no padding, over pixels that share
    L1 sets (a multiple of ALIAS_BYTES apart at its stride) and that every window reads,
    sums over a copy of its input with a line more per pixel; the results match
    onnxruntime's either way."""
    w = _weights(32, x_shape[1], *kernel)
    node = helper.make_node("Conv", ["x", "W", "B"], ["y"], kernel_shape=kernel, strides=strides)
    weights = {"W": w, "B": RNG.standard_normal(32).astype(np.float32)}
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(a, n) for n, a in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = RNG.standard_normal(x_shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    compiled = pf.compile(model, target="host")
    np.testing.assert_allclose(compiled.run({"x": x})["y"], want, rtol=1e-3, atol=1e-4)
    kernels = compiled.dump("kernels")
    [sum_line] = [line for line in kernels.splitlines() if "+=!" in line]
    assert ("P(" in sum_line) == copied, kernels
    if copied:
        assert f"float32(1, {x_shape[2]}, {x_shape[1] + 16}) P" in kernels, kernels


def test_a_depthwise_block_of_half_vectors_keeps_its_accumulators_in_registers():
    """MobileNetV3's depthwise convolution over 88 channels: a block of 64, then a
    partial block of 24 channels, which runs as three whole half vectors in one pass
    (no masked vector, whose stores kept the block's accumulators in memory); results
    against onnxruntime."""
    import re
    w = _weights(88, 1, 3, 3)
    node = helper.make_node("Conv", ["x", "W"], ["c"], group=88, pads=[1, 1, 1, 1])
    graph = helper.make_graph([node, helper.make_node("Relu", ["c"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 88, 28, 28])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 88, 28, 28])],
                              [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = RNG.standard_normal((1, 88, 28, 28)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    compiled = pf.compile(model, target="host")
    np.testing.assert_allclose(compiled.run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)
    from polyfuse.targets.cpu import vector_bits
    if vector_bits(compiled.target) != 512:
        pytest.skip("the partial block's vectors: AVX-512")
    [llvm] = [part for part in compiled.dump("llvm").split("\n// ") if "Conv_0" in part.splitlines()[0]]
    assert "predicate.enable" not in llvm and re.search(r'"llvm.loop.vectorize.width", i32 8', llvm), llvm[-3000:]
