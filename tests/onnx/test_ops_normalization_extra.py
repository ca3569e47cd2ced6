"""RMSNormalization, LpNormalization, MeanVarianceNormalization, RotaryEmbedding, SwiGLU,
CausalConvWithState and LinearAttention at shapes the ONNX node suite does not cover,
against onnxruntime where it runs the op and numpy (the ONNX reference ops) where not."""

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import polyfuse as pf
from polyfuse.errors import PolyfuseError
from tests.onnx.ort_compare import assert_matches_onnxruntime, one_node_model

RNG = np.random.default_rng(0)
TARGETS = ["host", "reference"]
FLOAT = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}


def _model(op, feeds, outputs, opset, **attrs):
    node = helper.make_node(op, list(feeds), list(outputs), **attrs)
    return one_node_model(node, feeds, outputs, opset=opset)


def _assert_matches_numpy(model, feeds, target, rtol, atol):
    """polyfuse against the ONNX reference implementation (numpy) of the model's op."""
    want = ReferenceEvaluator(model).run(None, feeds)
    got = pf.compile(model, target=target).run(feeds)
    for value, expected in zip(model.graph.output, want):
        assert got[value.name].dtype == expected.dtype, value.name
        np.testing.assert_allclose(got[value.name].astype(np.float32), expected.astype(np.float32),
                                   rtol=rtol, atol=atol, err_msg=value.name)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype,shape,scale,axis", [
    (np.float32, (2, 3, 17), (17,), -1), (np.float32, (4, 5, 6), (1, 6), 1),
    (np.float16, (3, 40), (40,), -1)])
def test_rms_normalization(target, dtype, shape, scale, axis):
    x = RNG.standard_normal(shape).astype(dtype)
    w = RNG.uniform(0.5, 1.5, scale).astype(dtype)
    feeds = {"x": x, "w": w}
    model = _model("RMSNormalization", feeds, {"y": FLOAT[dtype]}, 23, axis=axis, epsilon=1e-3)
    # numpy: X / sqrt(mean(X²) + eps) in float32, rounded to X's type, times the scale
    x32 = x.astype(np.float32)
    axes = tuple(range(axis % len(shape), len(shape)))
    normed = (x32 / np.sqrt((x32 * x32).mean(axis=axes, keepdims=True) + 1e-3)).astype(dtype)
    want = [(normed * w).astype(dtype)]
    tol = 2e-3 if dtype == np.float16 else 1e-5
    assert_matches_onnxruntime(model, feeds, rtol=tol, atol=tol, want=want, target=target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("p,axis", [(1, 0), (2, 1), (1, -1)])
def test_lp_normalization(target, p, axis):
    x = RNG.standard_normal((5, 6, 7)).astype(np.float32)
    x[:, 2, :] = 0   # a zero norm along axis 2 gives zeros, not NaN
    feeds = {"x": x}
    model = _model("LpNormalization", feeds, {"y": TensorProto.FLOAT}, 22, p=p, axis=axis)
    norm = np.linalg.norm(x, ord=p, axis=axis, keepdims=True)
    want = [np.where(norm == 0, 0, x / np.where(norm == 0, 1, norm)).astype(np.float32)]
    assert_matches_onnxruntime(model, feeds, rtol=1e-5, atol=1e-6, want=want, target=target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("axes", [[0, 2, 3], [1], [2, 3]])
def test_mean_variance_normalization(target, axes):
    x = RNG.standard_normal((3, 4, 5, 6)).astype(np.float32) * 3 + 1
    feeds = {"x": x}
    model = _model("MeanVarianceNormalization", feeds, {"y": TensorProto.FLOAT}, 13, axes=axes)
    assert_matches_onnxruntime(model, feeds, rtol=1e-4, atol=1e-5, target=target)


def _rotary(x, cos, sin, pos, interleaved, dim, heads):
    """numpy RoPE on (batch, heads, sequence, channels) or (batch, sequence, hidden)."""
    x4 = x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(0, 2, 1, 3) if x.ndim == 3 else x
    x4 = x4.astype(np.float32)
    c, s = (cos[pos], sin[pos]) if pos is not None else (cos, sin)
    c, s = c[:, None].astype(np.float32), s[:, None].astype(np.float32)
    rot = x4[..., :dim]
    x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if interleaved else np.split(rot, 2, axis=-1)
    real, imag = c * x1 - s * x2, s * x1 + c * x2
    out = np.stack([real, imag], -1).reshape(rot.shape) if interleaved else \
        np.concatenate([real, imag], -1)
    y = np.concatenate([out, x4[..., dim:]], -1)
    if x.ndim == 3:
        y = y.transpose(0, 2, 1, 3).reshape(x.shape)
    return y.astype(x.dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype,shape,interleaved,dim,positions", [
    (np.float32, (2, 5, 3 * 10), 1, 6, True), (np.float32, (1, 2, 7, 12), 0, 8, False),
    (np.float16, (2, 4, 2 * 8), 0, 0, True), (np.float32, (3, 3, 4, 6), 1, 0, False)])
def test_rotary_embedding(target, dtype, shape, interleaved, dim, positions):
    heads = shape[2] // (10 if shape[2] == 30 else 8) if len(shape) == 3 else shape[1]
    width = shape[-1] // heads if len(shape) == 3 else shape[-1]
    half = (dim or width) // 2
    batch, length = shape[0], shape[1] if len(shape) == 3 else shape[2]
    x = RNG.standard_normal(shape).astype(dtype)
    pos = RNG.integers(0, 20, (batch, length)).astype(np.int64) if positions else None
    cache = (20, half) if positions else (batch, length, half)
    cos, sin = (RNG.uniform(-1, 1, cache).astype(dtype) for _ in range(2))
    feeds = {"x": x, "cos": cos, "sin": sin} | ({"pos": pos} if positions else {})
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": dim}
    if len(shape) == 3:
        attrs["num_heads"] = heads
    model = _model("RotaryEmbedding", feeds, {"y": FLOAT[dtype]}, 23, **attrs)
    want = [_rotary(x, cos, sin, pos, interleaved, dim or width, heads)]
    tol = 2e-3 if dtype == np.float16 else 1e-5
    assert_matches_onnxruntime(model, feeds, rtol=tol, atol=tol, want=want, target=target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_swiglu(target, dtype):
    a, b = (RNG.standard_normal((3, 5, 9)).astype(dtype) for _ in range(2))
    feeds = {"a": a, "b": b}
    model = _model("SwiGLU", feeds, {"y": FLOAT[dtype]}, 28, alpha=1.702)
    a32 = a.astype(np.float32)
    want = (a32 / (1 + np.exp(-1.702 * a32)) * b.astype(np.float32))
    got = pf.compile(model, target=target).run(feeds)["y"]
    assert got.dtype == dtype
    tol = 3e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("k,bias,past,activation", [
    (4, True, True, "silu"), (3, False, False, "none"), (2, True, False, "swish")])
def test_causal_conv_with_state(target, k, bias, past, activation):
    batch, channels, length = 2, 5, 11
    feeds = {"x": RNG.standard_normal((batch, channels, length)).astype(np.float32),
             "w": RNG.standard_normal((channels, 1, k)).astype(np.float32)}
    if bias:
        feeds["b"] = RNG.standard_normal(channels).astype(np.float32)
    if past:
        feeds["p"] = RNG.standard_normal((batch, channels, k - 1)).astype(np.float32)
    inputs = ["x", "w", "b" if bias else "", "p" if past else ""]
    node = helper.make_node("CausalConvWithState", inputs, ["y", "state"], activation=activation)
    model = one_node_model(node, feeds, {"y": TensorProto.FLOAT, "state": TensorProto.FLOAT},
                           opset=27)
    # numpy: the padded sequence, a depthwise sum over each position's window
    pad = feeds["p"] if past else np.zeros((batch, channels, k - 1), np.float32)
    padded = np.concatenate([pad, feeds["x"]], axis=2)
    y = sum(padded[:, :, j:j + length] * feeds["w"][None, :, 0, j, None] for j in range(k))
    y = y + (feeds["b"][None, :, None] if bias else 0)
    if activation != "none":
        y = y / (1 + np.exp(-y))
    got = pf.compile(model, target=target).run(feeds)
    np.testing.assert_allclose(got["y"], y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["state"], padded[:, :, length:], rtol=0, atol=0)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("rule,heads,decay_per_channel,steps", [
    ("gated_delta", (4, 2), True, 5), ("delta", (3, 3), False, 3), ("gated", (2, 1), False, 6),
    ("linear", (2, 2), False, 4)])
def test_linear_attention(target, rule, heads, decay_per_channel, steps):
    (hq, hk), dk, dv, batch = heads, 4, 3, 2
    feeds = {"q": RNG.standard_normal((batch, steps, hq * dk)).astype(np.float32),
             "k": RNG.standard_normal((batch, steps, hk * dk)).astype(np.float32) * 0.5,
             "v": RNG.standard_normal((batch, steps, hk * dv)).astype(np.float32),
             "past": RNG.standard_normal((batch, hk, dk, dv)).astype(np.float32)}
    if "gated" in rule:
        width = hk * dk if decay_per_channel else hk
        feeds["g"] = -RNG.uniform(0.05, 1, (batch, steps, width)).astype(np.float32)
    if "delta" in rule:
        feeds["beta"] = RNG.uniform(0, 1, (batch, steps, hk)).astype(np.float32)
    inputs = ["q", "k", "v", "past", "g" if "g" in feeds else "", "beta" if "beta" in feeds else ""]
    node = helper.make_node("LinearAttention", inputs, ["y", "state"], update_rule=rule,
                            q_num_heads=hq, kv_num_heads=hk)
    model = one_node_model(node, feeds, {"y": TensorProto.FLOAT, "state": TensorProto.FLOAT},
                           opset=27)
    _assert_matches_numpy(model, feeds, target, rtol=1e-4, atol=1e-5)


@pytest.mark.unit
@pytest.mark.parametrize("op,feeds,attrs,opset,message", [
    ("RMSNormalization", {"x": (2, 3, 4), "w": (3,)}, {}, 23, "does not broadcast"),
    ("LpNormalization", {"x": (2, 3)}, {"p": 3}, 22, "p is 3"),
    ("RotaryEmbedding", {"x": (1, 2, 8), "cos": (1, 2, 2), "sin": (1, 2, 2)}, {}, 23,
     "num_heads"),
    ("RotaryEmbedding", {"x": (1, 2, 3, 8), "cos": (1, 3, 3), "sin": (1, 3, 3)}, {}, 23,
     "must have shape (1, 3, 4)"),
    ("SwiGLU", {"a": (2, 3), "b": (3,)}, {}, 28, "must be equal"),
    ("CausalConvWithState", {"x": (1, 2, 5), "w": (3, 1, 2)}, {}, 27, "must be (2, 1, k)"),
    ("LinearAttention", {"q": (1, 2, 8), "k": (1, 2, 8), "v": (1, 2, 6)},
     {"update_rule": "linear", "q_num_heads": 3, "kv_num_heads": 2}, 27, "do not split"),
    ("LinearAttention", {"q": (1, 2, 8), "k": (1, 2, 8), "v": (1, 2, 6)},
     {"q_num_heads": 2, "kv_num_heads": 2}, 27, "needs input 4")])
def test_bad_nodes_name_the_node(op, feeds, attrs, opset, message):
    arrays = {n: np.zeros(s, np.float32) for n, s in feeds.items()}
    outputs = ["y", "state"] if op in ("CausalConvWithState", "LinearAttention") else ["y"]
    node = helper.make_node(op, list(arrays), outputs, name="bad", **attrs)
    model = one_node_model(node, arrays, dict.fromkeys(outputs, TensorProto.FLOAT), opset=opset)
    with pytest.raises(PolyfuseError, match=r"node 'bad'.*" + message.replace("(", r"\(")
                       .replace(")", r"\)")):
        pf.compile(model, target="reference").run(arrays)
