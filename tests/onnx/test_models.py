"""Whole models built with onnx.helper, compiled and compared with onnxruntime: a CNN, a
transformer block whose reshapes come from runtime shapes, an MLP at two batch sizes,
and the inputs polyfuse must refuse with its own errors."""

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from tests.onnx.ort_compare import assert_matches_onnxruntime, onnxruntime_outputs
from tests.arm_tools import AARCH64
from tests.onnx.test_frontend import mlp

RNG = np.random.default_rng(0)
RTOL, ATOL = 1e-3, 1e-4
node = helper.make_node


def randn(*shape, scale=1.0):
    return (scale * RNG.standard_normal(shape)).astype(np.float32)


def weights(*shape):
    return randn(*shape, scale=1 / math.sqrt(math.prod(shape[1:])))


def make_model(nodes, inputs, outputs, initializers, opset=17):
    """``inputs``/``outputs``: name -> (elem type, shape with ints or symbolic names)."""
    graph = helper.make_graph(
        nodes, "model",
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in outputs.items()],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10  # what the installed onnxruntime reads
    onnx.checker.check_model(model)
    return model


def batch_norm(name, channels):
    return {f"{name}_scale": 1 + randn(channels, scale=0.1),
            f"{name}_bias": randn(channels, scale=0.1), f"{name}_mean": randn(channels, scale=0.1),
            f"{name}_var": np.abs(randn(channels)).astype(np.float32) + 0.5}


def bn_inputs(name):
    return [f"{name}_scale", f"{name}_bias", f"{name}_mean", f"{name}_var"]


# --- a CNN -----------------------------------------------------------------------------

def cnn():
    """Conv-BN-Relu, MaxPool, a grouped conv, a strided depthwise conv with BN and Relu6,
    a pooled shortcut added back, global pooling and a softmax classifier."""
    nodes = [
        node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
        node("BatchNormalization", ["c1", *bn_inputs("bn1")], ["n1"], epsilon=1e-5),
        node("Relu", ["n1"], ["r1"]),
        node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),           # 8x16x16
        node("Conv", ["p1", "W2"], ["c2"], pads=[1, 1, 1, 1], group=2),                 # 16x16x16
        node("Conv", ["c2", "W3", "B3"], ["c3"], pads=[1, 1, 1, 1], strides=[2, 2],
             group=16),                                                                  # 16x8x8
        node("BatchNormalization", ["c3", *bn_inputs("bn2")], ["n3"], epsilon=1e-3),
        node("Clip", ["n3", "zero", "six"], ["r3"]),
        node("AveragePool", ["c2"], ["shortcut"], kernel_shape=[3, 3], strides=[2, 2],
             pads=[1, 1, 1, 1]),                                                         # 16x8x8
        node("Add", ["r3", "shortcut"], ["res"]),
        node("GlobalAveragePool", ["res"], ["g"]),
        node("Flatten", ["g"], ["f"]),
        node("Gemm", ["f", "W4", "B4"], ["logits"], transB=1),
        node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    init = {"W1": weights(8, 3, 3, 3), "B1": randn(8, scale=0.1), "W2": weights(16, 4, 3, 3),
            "W3": weights(16, 1, 3, 3), "B3": randn(16, scale=0.1), "W4": weights(10, 16),
            "B4": randn(10, scale=0.1), "zero": np.float32(0), "six": np.float32(6),
            **batch_norm("bn1", 8), **batch_norm("bn2", 16)}
    return make_model(nodes, {"x": (TensorProto.FLOAT, [1, 3, 32, 32])},
                      {"y": (TensorProto.FLOAT, [1, 10])}, init)


@pytest.mark.parametrize("target", ["x86", AARCH64, "reference"])
def test_cnn_matches_onnxruntime(target):
    assert_matches_onnxruntime(cnn(), {"x": randn(1, 3, 32, 32)}, RTOL, ATOL, target=target)


# --- a transformer block -------------------------------------------------------------

HIDDEN, HEADS = 32, 4
HEAD = HIDDEN // HEADS


def _ints(*values):
    return np.array(values, np.int64)


def shape_of(x, axis, out):
    """What exporters emit for one runtime dimension: Shape -> Gather -> Unsqueeze."""
    return [node("Shape", [x], [f"{out}_shape"]),
            node("Gather", [f"{out}_shape", f"axis{axis}"], [f"{out}_dim"], axis=0),
            node("Unsqueeze", [f"{out}_dim", "axes0"], [out])]


def linear(x, name, out):
    return [node("MatMul", [x, f"{name}_W"], [f"{name}_mm"]),
            node("Add", [f"{name}_mm", f"{name}_b"], [out])]


def gelu(x, out, *, as_op):
    if as_op:
        return [node("Gelu", [x], [out])]
    return [node("Div", [x, "sqrt2"], [f"{out}_d"]), node("Erf", [f"{out}_d"], [f"{out}_e"]),
            node("Add", [f"{out}_e", "one"], [f"{out}_a"]),
            node("Mul", [x, f"{out}_a"], [f"{out}_m"]),
            node("Mul", [f"{out}_m", "half"], [out])]


def transformer_block(*, gelu_op):
    """Self-attention and an FFN, each with a residual and LayerNormalization; the head
    split and merge reshape to shapes concatenated from ``Shape`` of the input, and an
    int64 padding mask becomes an additive bias as BERT exporters write it."""
    nodes = [*shape_of("x", 0, "batch"), *shape_of("x", 1, "seq"),
             node("Concat", ["batch", "seq", "heads", "head"], ["split_shape"], axis=0),
             node("Concat", ["batch", "seq", "hidden"], ["merge_shape"], axis=0)]
    for p in "qkv":
        nodes += [*linear("x", p, f"{p}_lin"),
                  node("Reshape", [f"{p}_lin", "split_shape"], [f"{p}_heads"])]
    nodes += [
        node("Transpose", ["q_heads"], ["q"], perm=[0, 2, 1, 3]),
        node("Transpose", ["k_heads"], ["kT"], perm=[0, 2, 3, 1]),
        node("Transpose", ["v_heads"], ["v"], perm=[0, 2, 1, 3]),
        node("MatMul", ["q", "kT"], ["scores"]),
        node("Div", ["scores", "sqrt_head"], ["scaled"]),
        node("Unsqueeze", ["mask", "axes12"], ["mask4"]),
        node("Cast", ["mask4"], ["maskf"], to=TensorProto.FLOAT),
        node("Sub", ["one", "maskf"], ["masked"]),
        node("Mul", ["masked", "neg_big"], ["bias"]),
        node("Add", ["scaled", "bias"], ["biased"]),
        node("Softmax", ["biased"], ["probs"], axis=-1),
        node("MatMul", ["probs", "v"], ["context"]),
        node("Transpose", ["context"], ["context_t"], perm=[0, 2, 1, 3]),
        node("Reshape", ["context_t", "merge_shape"], ["merged"]),
        *linear("merged", "o", "attn"),
        node("Add", ["attn", "x"], ["res1"]),
        node("LayerNormalization", ["res1", "ln1_g", "ln1_b"], ["h"], axis=-1, epsilon=1e-5),
        *linear("h", "ff1", "ff1_out"),
        *gelu("ff1_out", "act", as_op=gelu_op),
        *linear("act", "ff2", "ff2_out"),
        node("Add", ["ff2_out", "h"], ["res2"]),
        node("LayerNormalization", ["res2", "ln2_g", "ln2_b"], ["y"], axis=-1, epsilon=1e-5),
    ]
    init = {"axis0": np.int64(0), "axis1": np.int64(1), "axes0": _ints(0), "axes12": _ints(1, 2),
            "heads": _ints(HEADS), "head": _ints(HEAD), "hidden": _ints(HIDDEN),
            "sqrt_head": np.float32(math.sqrt(HEAD)), "one": np.float32(1),
            "neg_big": np.float32(-10000),
            "ln1_g": 1 + randn(HIDDEN, scale=0.1), "ln1_b": randn(HIDDEN, scale=0.1),
            "ln2_g": 1 + randn(HIDDEN, scale=0.1), "ln2_b": randn(HIDDEN, scale=0.1)}
    for name, (n_in, n_out) in {"q": (HIDDEN, HIDDEN), "k": (HIDDEN, HIDDEN), "v": (HIDDEN, HIDDEN),
                                "o": (HIDDEN, HIDDEN), "ff1": (HIDDEN, 2 * HIDDEN),
                                "ff2": (2 * HIDDEN, HIDDEN)}.items():
        init[f"{name}_W"] = weights(n_out, n_in).T.copy()
        init[f"{name}_b"] = randn(n_out, scale=0.1)
    if not gelu_op:
        init |= {"sqrt2": np.float32(math.sqrt(2)), "half": np.float32(0.5)}
    return make_model(nodes, {"x": (TensorProto.FLOAT, ["batch", "seq", HIDDEN]),
                              "mask": (TensorProto.INT64, ["batch", "seq"])},
                      {"y": (TensorProto.FLOAT, ["batch", "seq", HIDDEN])}, init,
                      opset=20 if gelu_op else 17)


def attention_feeds(batch, seq):
    mask = np.ones((batch, seq), np.int64)
    mask[-1, seq - seq // 3:] = 0   # the last sequence is padded
    return {"x": randn(batch, seq, HIDDEN), "mask": mask}


@pytest.mark.parametrize("target", ["x86", AARCH64, "reference"])
@pytest.mark.parametrize("gelu_op", [False, True], ids=["erf_gelu", "gelu_op"])
def test_transformer_block_at_two_shapes(gelu_op, target):
    model = transformer_block(gelu_op=gelu_op)
    compiled = pf.compile(model, target=target)
    for batch, seq in [(2, 16), (1, 7)]:
        assert_matches_onnxruntime(model, attention_feeds(batch, seq), RTOL, ATOL,
                                   compiled=compiled)



def causal_self_attention():
    """Other exporter idioms: ``Shape`` with start/end, a negative ``Gather``, ``Slice`` of a
    shape, ``Range`` to a runtime length, ``Reshape`` with 0 and -1, and a causal mask from
    ``LessOrEqual``, ``Expand`` and ``Where`` over a ``ConstantOfShape`` of -inf."""
    minus_inf = helper.make_tensor("minus_inf", TensorProto.FLOAT, [1], [-np.inf])
    nodes = [
        node("Shape", ["x"], ["batch_seq"], start=0, end=2),
        node("Shape", ["x"], ["x_shape"]),
        node("Gather", ["x_shape", "minus1"], ["hidden"], axis=0),
        node("Slice", ["x_shape", "ints1", "ints2"], ["seq1"]),
        node("Squeeze", ["seq1", "ints0"], ["seq"]),
        node("Range", ["zero", "seq", "one"], ["pos"]),
        node("Unsqueeze", ["pos", "ints0"], ["row"]),
        node("Unsqueeze", ["pos", "ints1"], ["col"]),
        node("LessOrEqual", ["row", "col"], ["causal"]),
        node("Reshape", ["x", "split_shape"], ["heads"]),
        node("Transpose", ["heads"], ["q"], perm=[0, 2, 1, 3]),
        node("Transpose", ["heads"], ["kT"], perm=[0, 2, 3, 1]),
        node("MatMul", ["q", "kT"], ["scores"]),
        node("Shape", ["scores"], ["scores_shape"]),
        node("ConstantOfShape", ["scores_shape"], ["masked_out"], value=minus_inf),
        node("Expand", ["causal", "scores_shape"], ["keep"]),
        node("Where", ["keep", "scores", "masked_out"], ["masked"]),
        node("Softmax", ["masked"], ["probs"], axis=-1),
        node("MatMul", ["probs", "q"], ["context"]),
        node("Transpose", ["context"], ["context_t"], perm=[0, 2, 1, 3]),
        node("Concat", ["batch_seq", "ints_minus1"], ["merge_shape"], axis=0),
        node("Reshape", ["context_t", "merge_shape"], ["merged"]),
        node("Cast", ["hidden"], ["hidden_f"], to=TensorProto.FLOAT),
        node("Div", ["merged", "hidden_f"], ["y"]),
    ]
    init = {"minus1": np.int64(-1), "zero": np.int64(0), "one": np.int64(1), "ints0": _ints(0),
            "ints1": _ints(1), "ints2": _ints(2), "ints_minus1": _ints(-1),
            "split_shape": _ints(0, 0, HEADS, -1)}
    return make_model(nodes, {"x": (TensorProto.FLOAT, ["batch", "seq", HIDDEN])},
                      {"y": (TensorProto.FLOAT, ["batch", "seq", HIDDEN])}, init)


@pytest.mark.parametrize("target", ["x86", AARCH64, "reference"])
def test_causal_self_attention_at_two_shapes(target):
    model = causal_self_attention()
    compiled = pf.compile(model, target=target)
    for batch, seq in [(2, 16), (1, 7)]:
        assert_matches_onnxruntime(model, {"x": randn(batch, seq, HIDDEN)}, RTOL, ATOL,
                                   compiled=compiled)

# --- an MLP with a symbolic batch ------------------------------------------------------

@pytest.mark.parametrize("target", ["x86", AARCH64, "reference"])
def test_mlp_at_batch_1_and_7(target):
    model = mlp(batch="batch")
    compiled = pf.compile(model, target=target)
    for batch in (1, 7, 1):
        assert_matches_onnxruntime(model, {"x": randn(batch, 16)}, RTOL, ATOL, compiled=compiled)


# --- inputs polyfuse must refuse (test_frontend.py covers bytes, op listing, MLP feeds) ---

@pytest.mark.unit
def test_truncated_model_file(tmp_path):
    data = cnn().SerializeToString()
    path = tmp_path / "cnn.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(pf.ModelError, match="cannot read the ONNX model"):
        pf.compile(str(path))


def test_external_data_is_read_and_its_absence_refused(tmp_path):
    model = cnn()
    feeds = {"x": randn(1, 3, 32, 32)}
    want = onnxruntime_outputs(model, feeds)
    path = tmp_path / "cnn.onnx"
    # saving moves the weights out of ``model`` too
    onnx.save_model(model, str(path), save_as_external_data=True, location="cnn.onnx.data",
                    size_threshold=0)
    assert (tmp_path / "cnn.onnx.data").exists()
    assert_matches_onnxruntime(model, feeds, RTOL, ATOL, want=want,
                               compiled=pf.compile(path, target="x86"))
    data = (tmp_path / "cnn.onnx.data").read_bytes()
    (tmp_path / "cnn.onnx.data").write_bytes(data[: len(data) // 2])
    with pytest.raises(pf.ModelError, match="exceeds available data"):
        pf.compile(path)
    (tmp_path / "cnn.onnx.data").unlink()
    with pytest.raises(pf.ModelError, match=r"W1.*cnn\.onnx\.data"):
        pf.compile(path)
    with pytest.raises(pf.ModelError, match="W1"):  # bytes have no directory to find it in
        pf.compile(onnx.load(str(path), load_external_data=False).SerializeToString())


@pytest.mark.unit
def test_bad_feeds_to_a_model_with_two_inputs():
    compiled = pf.compile(transformer_block(gelu_op=False), target="x86")
    feeds = attention_feeds(2, 16)
    with pytest.raises(pf.ShapeError,
                       match=r"'x' must have shape \('batch', 'seq', 32\), got \(16, 32\)"):
        compiled.run(feeds | {"x": feeds["x"][0]})
    with pytest.raises(pf.DTypeError, match="'mask' must be int64, got int32"):
        compiled.run(feeds | {"mask": feeds["mask"].astype(np.int32)})
    with pytest.raises(pf.ArgumentError, match="'x' must be a numpy array, got list"):
        compiled.run(feeds | {"x": feeds["x"].tolist()})
    with pytest.raises(pf.ArgumentError,
                       match=r"unknown: \['attention_mask'\] missing: \['mask'\]"):
        compiled.run({"x": feeds["x"], "attention_mask": feeds["mask"]})
    with pytest.raises(pf.ArgumentError, match=r"takes 2 inputs \(x, mask\), got 1"):
        compiled(feeds["x"])


@pytest.mark.unit
def test_a_symbolic_dim_bound_to_two_sizes_is_a_shape_error():
    compiled = pf.compile(transformer_block(gelu_op=False), target="reference")
    feeds = attention_feeds(2, 16)
    with pytest.raises(pf.ShapeError, match="batch"):
        compiled.run(feeds | {"mask": np.ones((3, 16), np.int64)})


@pytest.mark.unit
def test_input_shapes_given_for_some_inputs_only():
    with pytest.raises(pf.ShapeError, match=r"'mask\[0\]=batch', 'mask\[1\]=seq'.*input_shapes"):
        pf.compile(transformer_block(gelu_op=False), input_shapes={"x": (2, 16, HIDDEN)})


@pytest.mark.unit
@pytest.mark.parametrize("shapes", [
    {"x": (2, 16), "mask": (2, 16)},                    # x has rank 3
    {"x": (2, 16, HIDDEN + 1), "mask": (2, 16)},        # x's last dim is fixed to HIDDEN
    {"x": (2, 16, HIDDEN), "mask": (3, 16)},            # 'batch' is 2 and 3
    {"x": (2, 16, HIDDEN), "mask": (2, 16), "masks": (2, 16)},   # no input 'masks'
], ids=["rank", "fixed_dim", "symbol_twice", "unknown_name"])
def test_input_shapes_that_disagree_with_the_model_are_a_shape_error(shapes):
    with pytest.raises(pf.ShapeError):
        pf.compile(transformer_block(gelu_op=False), input_shapes=shapes)
