"""Channels-last layout (lowering/layout.py): convolutions and what runs between them on
(N, H, W, C) storage, transposes only at the graph's edges, numerics against onnxruntime
on maps and channel counts that divide no block."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from polyfuse.frontends.tc import parse
from polyfuse.ir.comprehension_interpreter import interpret
from polyfuse.lowering.layout import (CHANNELS_LAST, channels_first, channels_last, grouped_channels_last,
                                      to_channels_last)
from tests.onnx.ort_compare import assert_matches_onnxruntime

RNG = np.random.default_rng(7)


def _model(nodes, inputs, outputs, initializers, opset=17):
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
        [numpy_helper.from_array(a, n) for n, a in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10  # what the installed onnxruntime reads
    return model


def _w(*shape):
    return (RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def _steps(compiled):
    return [st.label for st, _ in compiled.plan_for().steps()]


def _transposed_only_at_the_ends(model, shape):
    """``model`` matches onnxruntime on an input ``x`` of ``shape``, and its plan changes
    layout only into channels-last at ``x`` and back at its output ``y``."""
    compiled = pf.compile(model, target="host")
    assert_matches_onnxruntime(model, {"x": RNG.standard_normal(shape).astype(np.float32)},
                               rtol=1e-4, atol=1e-5, compiled=compiled)
    labels = _steps(compiled)
    assert [label for label in labels if "channels" in label] == ["x:to_channels_last", "y:channels_first"], labels


def cnn():
    """A stem, a max pool, a residual block with a depthwise conv and a squeeze-excite
    gate, a channel concat, batch norm, average pool and a classifier: 20 channels on a
    13 x 11 map."""
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "W0", "B0"], ["c0"], name="stem", pads=[1, 1, 1, 1], strides=[2, 1]),
        n("Relu", ["c0"], ["r0"], name="relu0"),
        n("MaxPool", ["r0"], ["p0"], name="pool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        n("Conv", ["p0", "Wd"], ["d1"], name="depthwise", group=20, pads=[1, 1, 1, 1]),
        n("Clip", ["d1", "lo", "hi"], ["d2"], name="relu6"),
        n("GlobalAveragePool", ["d2"], ["s0"], name="squeeze"),
        n("Conv", ["s0", "Ws"], ["s1"], name="excite"),
        n("Sigmoid", ["s1"], ["s2"], name="gate"),
        n("Mul", ["d2", "s2"], ["d3"], name="scale"),
        n("Mul", ["d3", "perchannel"], ["d4"], name="affine"),
        n("Add", ["d4", "p0"], ["a0"], name="residual"),
        n("Concat", ["a0", "p0"], ["cat"], name="concat", axis=1),
        n("BatchNormalization", ["cat", "g", "b", "mu", "var"], ["bn"], name="bn", epsilon=1e-3),
        n("AveragePool", ["bn"], ["ap"], name="avg", kernel_shape=[2, 2], strides=[2, 2]),
        n("Flatten", ["ap"], ["f"], name="flatten"),
        n("Gemm", ["f", "G"], ["y"], name="fc", transB=1),
    ]
    inits = {"W0": _w(20, 3, 3, 3), "B0": RNG.standard_normal(20).astype(np.float32),
             "Wd": _w(20, 1, 3, 3), "Ws": _w(20, 20, 1, 1), "lo": np.float32(0), "hi": np.float32(6),
             "perchannel": RNG.uniform(0.5, 1.5, (20, 1, 1)).astype(np.float32),
             "g": RNG.uniform(0.5, 1.5, 40).astype(np.float32), "b": RNG.standard_normal(40).astype(np.float32),
             "mu": RNG.standard_normal(40).astype(np.float32), "var": RNG.uniform(0.5, 1.5, 40).astype(np.float32),
             "G": _w(5, 40 * 3 * 5)}
    return _model(nodes, {"x": ["N", 3, 13, 11]}, {"y": ["N", 5]}, inits)


@pytest.mark.parametrize("target", ["host", "reference"])
def test_a_cnn_runs_channels_last_and_matches_onnxruntime(target):
    model = cnn()
    compiled = pf.compile(model, target=target)
    for batch in (1, 3):
        x = RNG.standard_normal((batch, 3, 13, 11)).astype(np.float32)
        assert_matches_onnxruntime(model, {"x": x}, rtol=1e-4, atol=1e-5, compiled=compiled)
    graph = compiled.dump("partition_fusion_groups")
    # one transpose in, one back before Flatten; every conv, pool and norm channels-last
    assert graph.count("= Transpose(") == 2, graph
    assert graph.count(f"{CHANNELS_LAST}=1") == 6, graph  # 3 convs, 3 pools
    # the norm, a scale and shift (graph_passes.scale_batch_norms) by channels-last constants
    assert '%"bn.scale:channels_last" = constant float32[1, 1, 1, 40]' in graph, graph


def test_a_value_read_in_both_layouts_is_transposed_back_once():
    n = helper.make_node
    nodes = [n("Conv", ["x", "W"], ["c"], name="conv", pads=[0, 0, 1, 1]),
             n("Relu", ["c"], ["r"], name="relu"),
             n("Softmax", ["r"], ["s"], name="softmax", axis=1),     # reads ONNX's layout
             n("Conv", ["r", "W2"], ["c2"], name="conv2"),
             n("Add", ["s", "c2"], ["y"], name="add")]               # twin and plain: plain
    model = _model(nodes, {"x": [2, 4, 5, 7]}, {"y": [2, 6, 3, 7], "r": [2, 6, 3, 7]},
                   {"W": _w(6, 4, 3, 3), "W2": _w(6, 6, 1, 1)})
    compiled = pf.compile(model, target="host")
    assert_matches_onnxruntime(model, {"x": RNG.standard_normal((2, 4, 5, 7)).astype(np.float32)},
                               rtol=1e-4, atol=1e-5, compiled=compiled)
    labels = _steps(compiled)
    assert sum(label.endswith("r:channels_first") for label in labels) == 1, labels
    assert sum("c2:channels_first" in label for label in labels) == 1, labels


@pytest.mark.parametrize("spatial", [(9,), (4, 5, 6)], ids=["conv1d", "conv3d"])
def test_convolutions_of_other_ranks_run_channels_last(spatial):
    rank = len(spatial) + 2
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", pads=[1] * (2 * len(spatial))),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    out = [2, 12, *spatial]
    model = _model(nodes, {"x": [2, 5, *spatial]}, {"y": out},
                   {"W": _w(12, 5, *([3] * len(spatial))), "B": RNG.standard_normal(12).astype(np.float32)})
    compiled = pf.compile(model, target="host")
    assert_matches_onnxruntime(model, {"x": RNG.standard_normal((2, 5, *spatial)).astype(np.float32)},
                               rtol=1e-4, atol=1e-5, compiled=compiled)
    assert f"perm=[{', '.join(map(str, channels_last(rank)))}]" in compiled.dump("partition_fusion_groups")


@pytest.mark.parametrize("stride, pads, spatial", [(1, [1, 1, 1, 1], (13, 11)), (2, [0, 1, 1, 0], (9, 10)),
                                                   (1, [2, 2], (17,))], ids=["3x3", "strided", "conv1d"])
def test_groups_of_eight_channels_or_more_run_channels_last(stride, pads, spatial):
    """RegNet's blocks: a 1x1 conv, a grouped conv of 8 channels per group (and one of 12
    per group, with bias), a 1x1 conv, all channels-last between the graph's edges."""
    n = helper.make_node
    k = [3] * len(spatial) if len(spatial) == 2 else [5]
    nodes = [n("Conv", ["x", "W0"], ["a"], name="expand"),
             n("Relu", ["a"], ["r"], name="relu"),
             n("Conv", ["r", "Wg"], ["g"], name="grouped", group=4, pads=pads, strides=[stride] * len(spatial)),
             n("Conv", ["g", "Wh", "Bh"], ["h"], name="grouped12", group=2),
             n("Conv", ["h", "W1"], ["y"], name="project")]
    inits = {"W0": _w(32, 6, *[1] * len(spatial)), "Wg": _w(32, 8, *k), "Wh": _w(24, 16, *[1] * len(spatial)),
             "Bh": RNG.standard_normal(24).astype(np.float32), "W1": _w(10, 24, *[1] * len(spatial))}
    model = _model(nodes, {"x": ["N", 6, *spatial]}, {"y": None}, inits)
    model.graph.output[0].type.tensor_type.ClearField("shape")
    compiled = pf.compile(model, target="host")
    for batch in (1, 2):
        x = RNG.standard_normal((batch, 6, *spatial)).astype(np.float32)
        assert_matches_onnxruntime(model, {"x": x}, rtol=1e-4, atol=1e-5, compiled=compiled)
    graph = compiled.dump("partition_fusion_groups")
    assert graph.count("= Transpose(") == 2, graph    # in and out only
    assert graph.count(f"{CHANNELS_LAST}=1") == 4, graph
    kernels = [k.definition.name for _, k in compiled.plan_for().steps()]
    assert kernels.count("grouped_conv") == 2, kernels


@pytest.mark.unit
def test_only_groups_of_at_least_a_vector_go_channels_last():
    assert grouped_channels_last(4, (32, 8, 3, 3)) and grouped_channels_last(55, (440, 8, 3, 3))
    assert not grouped_channels_last(32, (128, 4, 3, 3))   # ResNeXt's first stage: 4 per group
    assert not grouped_channels_last(1, (32, 8, 3, 3)) and not grouped_channels_last(8, (8, 1, 3, 3))


def test_grouped_convolutions_and_convolutions_of_computed_weights_keep_onnx_layout():
    n = helper.make_node
    nodes = [n("Conv", ["x", "Wg"], ["g"], name="grouped", group=2),
             n("Conv", ["g", "w"], ["y"], name="fed_weights")]
    model = _model(nodes, {"x": [1, 4, 6, 6], "w": [3, 4, 1, 1]}, {"y": [1, 3, 6, 6]}, {"Wg": _w(4, 2, 1, 1)})
    compiled = pf.compile(model, target="host")
    feeds = {"x": RNG.standard_normal((1, 4, 6, 6)).astype(np.float32), "w": _w(3, 4, 1, 1)}
    assert_matches_onnxruntime(model, feeds, rtol=1e-4, atol=1e-5, compiled=compiled)
    assert "Transpose" not in compiled.dump("partition_fusion_groups")


@pytest.mark.unit
def test_permutations_are_inverse():
    for rank in (3, 4, 5):
        x = np.arange(np.prod(range(2, rank + 2))).reshape(range(2, rank + 2))
        np.testing.assert_array_equal(x.transpose(channels_last(rank)).transpose(channels_first(rank)), x)


@pytest.mark.unit
def test_a_kernel_on_channels_last_storage_computes_the_same_values():
    """to_channels_last permutes declarations, reads and writes: the interpreter's result
    on transposed inputs is the transposed result (a max pool with padding and an extra
    per-channel read)."""
    d = parse("""
        def pool(float(N, C, H, W) X, float(C) S) -> (Y) {
          Y(n, c, h, w) max=! (h + kh >= 1 && w + kw >= 1) ? X(n, c, h + kh - 1, w + kw - 1) * S(c) : -1e30
              where n in 0:N, c in 0:C, h in 0:H - 1, w in 0:W - 1, kh in 0:2, kw in 0:2
        }""").definitions[0]
    x = RNG.standard_normal((2, 3, 5, 4)).astype(np.float32)
    s = RNG.standard_normal(3).astype(np.float32)
    want = interpret(d, {"X": x, "S": s}, {"N": 2, "C": 3, "H": 5, "W": 4})["Y"]
    moved = to_channels_last(d, {"X", "Y"})
    assert moved.params[0].rank == 4 and "X(n, h + kh - 1, w + kw - 1, c)" in str(moved)
    got = interpret(moved, {"X": np.ascontiguousarray(x.transpose(0, 2, 3, 1)), "S": s},
                    {"N": 2, "C": 3, "H": 5, "W": 4})["Y"]
    np.testing.assert_array_equal(got, want.transpose(0, 2, 3, 1))


@pytest.mark.parametrize("stride, channels, pitch", [(2, 256, 272), (1, 256, 256), (1, 512, 528)])
def test_a_convolution_pads_its_channels_last_copy_by_a_cache_line(stride, channels, pitch):
    # 256 channels, stride 2, or 512 unstrided: neighbouring outputs read pixels 2 KiB
    # apart, which share L1 sets; the padded copy holds 16 more (zero) channels per
    # pixel. 256 unstrided keep the input's pitch
    from polyfuse.lowering.ops.conv import WindowAxis, channel_pitch
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1],
                              strides=[stride, stride]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    out = [(s + 2 - 3) // stride + 1 for s in (13, 11)]
    # (40 output channels: no Winograd transform for the unstrided one)
    model = _model(nodes, {"x": [2, channels, 13, 11]}, {"y": [2, 40, *out]},
                   {"W": _w(40, channels, 3, 3), "B": RNG.standard_normal(40).astype(np.float32)})
    compiled = pf.compile(model, target="host")
    assert_matches_onnxruntime(model, {"x": RNG.standard_normal((2, channels, 13, 11)).astype(np.float32)},
                               rtol=1e-4, atol=1e-4, compiled=compiled)
    assert f", {pitch}) t0_P" in compiled.dump("loops")
    axis = WindowAxis(size=14, kernel=3, stride=2, dilation=1, out=7, pad=1, pad_end=0)
    assert [channel_pitch(c, [axis], 4) for c in (128, 256, 512, 520)] == [128, 272, 528, 520]
    assert channel_pitch(512, [axis], 2) == 544 and channel_pitch(512, [], 4) == 512
    unstrided = WindowAxis(size=7, kernel=3, stride=1, dilation=1, out=7, pad=1, pad_end=1)
    assert [channel_pitch(c, [unstrided], 4) for c in (256, 512, 1024)] == [256, 528, 1040]


def shuffle_block(spatial=("H", "W"), split=None):
    """ShuffleNet's block as torch exports it: two branches of convolutions concatenated,
    the channels shuffled (Reshape into 2 groups, Transpose, Reshape back), the result
    split in halves by Slices whose ends come from its Shape, and a convolution of each.
    ``split``: the first Reshape's target (default: the channels in 2 groups of 6)."""
    n = helper.make_node
    nodes = [n("Conv", ["x", "Wa"], ["a"], name="a", pads=[1, 1, 1, 1]), n("Relu", ["a"], ["ra"]),
             n("Conv", ["x", "Wb"], ["b"], name="b"), n("Relu", ["b"], ["rb"]),
             n("Concat", ["ra", "rb"], ["cat"], axis=1),
             n("Reshape", ["cat", "split"], ["grouped"]),
             n("Transpose", ["grouped"], ["swapped"], perm=[0, 2, 1, 3, 4]),
             n("Reshape", ["swapped", "join"], ["shuffled"]),
             n("Shape", ["shuffled"], ["shape"]), n("Gather", ["shape", "one"], ["channels"], axis=0),
             n("Div", ["channels", "two"], ["half"]),
             n("Slice", ["shuffled", "zero", "half", "axis1"], ["left"]),
             n("Slice", ["shuffled", "half", "channels", "axis1"], ["right"]),
             n("Conv", ["left", "Wl"], ["l"], name="l"), n("Conv", ["right", "Wr"], ["r"], name="r", pads=[1, 1, 1, 1]),
             n("Concat", ["l", "r"], ["y"], axis=1)]
    inits = {"Wa": _w(6, 3, 3, 3), "Wb": _w(6, 3, 1, 1), "Wl": _w(4, 6, 1, 1), "Wr": _w(4, 6, 3, 3),
             "split": np.array(split or [1, 2, 6, 5, 7], np.int64), "join": np.array([1, -1, 5, 7], np.int64),
             "one": np.array([1], np.int64), "two": np.array([2], np.int64), "zero": np.array([0], np.int64),
             "axis1": np.array([1], np.int64)}
    return _model(nodes, {"x": [1, 3, *spatial]}, {"y": [1, 8, *(["h", "w"] if split else [5, 7])]}, inits)


def test_a_channel_shuffle_and_its_slices_run_channels_last():
    model = shuffle_block()
    # into channels-last once, out once for the output: the shuffle, the shape and the halves on the twins
    _transposed_only_at_the_ends(model, (1, 3, 5, 7))


def test_a_reshape_of_other_dimensions_is_not_taken_for_a_shuffle():
    """The same three nodes on a (1, 12, 5, 7) tensor split as (1, 2, 6, 7, 5): the
    spatial dimensions are not kept, so it is no channel shuffle. With the input's sizes
    known the graph keeps ONNX's layout there; with sizes known only when planned,
    the channels-last Reshape refuses them (a polyfuse error, never other values)."""
    model = shuffle_block(spatial=(5, 7), split=[1, 2, 6, 7, 5])
    model.graph.node[7].input[1] = "join2"
    model.graph.initializer.append(numpy_helper.from_array(np.array([1, -1, 7, 5], np.int64), "join2"))
    x = RNG.standard_normal((1, 3, 5, 7)).astype(np.float32)
    assert_matches_onnxruntime(model, {"x": x}, rtol=1e-4, atol=1e-5, compiled=pf.compile(model, target="host"))
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "H"
    model.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "W"
    with pytest.raises(pf.UnsupportedOpError, match="channel shuffle"):
        pf.compile(model, target="host").run({"x": x})


@pytest.mark.parametrize("by", ["scales", "sizes"])
def test_an_upsampled_map_added_to_a_lateral_one_runs_channels_last(by):
    """An FPN's top-down step: a coarse map resized to the lateral map's size (by scales,
    or by sizes computed from the lateral map's Shape) and added to it, then a
    convolution; and the upsampling of a graph output stays in ONNX's layout."""
    n = helper.make_node
    resize = n("Resize", ["top", "", "scales"], ["up"], mode="nearest") if by == "scales" else \
        n("Resize", ["top", "", "", "size"], ["up"], mode="nearest")
    nodes = [n("Conv", ["x", "Wl"], ["lateral"], name="lateral"),
             n("Conv", ["x", "Wt"], ["top"], name="top", strides=[2, 2]),
             n("Shape", ["lateral"], ["size"]), resize,
             n("Add", ["up", "lateral"], ["sum"]), n("Conv", ["sum", "Wo"], ["y"], name="out", pads=[1, 1, 1, 1]),
             n("Resize", ["y", "", "twice"], ["z"], mode="linear")]
    inits = {"Wl": _w(8, 3, 1, 1), "Wt": _w(8, 3, 1, 1), "Wo": _w(8, 8, 3, 3),
             "scales": np.array([1, 1, 2, 2], np.float32), "twice": np.array([1, 1, 2, 2], np.float32)}
    model = _model(nodes, {"x": [1, 3, 6, 10]}, {"z": [1, 8, 12, 20]}, inits)
    _transposed_only_at_the_ends(model, (1, 3, 6, 10))


def test_a_group_norm_as_torch_exports_it_stays_channels_last():
    """GroupNorm(C, C) exported: Reshape to [0, C, -1], InstanceNormalization, Reshape
    back by the Shape of its input, a scale and shift (wav2vec2's feature extractor):
    the Reshapes keep the sizes, so the normalization runs on the twin between two
    convolutions."""
    n = helper.make_node
    nodes = [n("Conv", ["x", "W1"], ["c"], name="c1", strides=[2]),
             n("Reshape", ["c", "split"], ["r"]), n("InstanceNormalization", ["r", "ones", "zeros"], ["i"]),
             n("Shape", ["c"], ["s"]), n("Reshape", ["i", "s"], ["back"]),
             n("Mul", ["back", "gamma"], ["m"]), n("Add", ["m", "beta"], ["a"]), n("Relu", ["a"], ["g"]),
             n("Conv", ["g", "W2"], ["y"], name="c2")]
    inits = {"W1": _w(8, 1, 5), "W2": _w(6, 8, 3), "split": np.array([0, 8, -1], np.int64),
             "ones": np.ones(8, np.float32), "zeros": np.zeros(8, np.float32),
             "gamma": RNG.uniform(0.5, 1.5, (8, 1)).astype(np.float32), "beta": RNG.standard_normal((8, 1)).astype(np.float32)}
    model = _model(nodes, {"x": [1, 1, 41]}, {"y": [1, 6, 17]}, inits)
    _transposed_only_at_the_ends(model, (1, 1, 41))
