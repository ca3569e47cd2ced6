"""Graph passes: printed before/after, numerics unchanged."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from polyfuse.frontends.onnx import to_graph
from polyfuse.ir.graph import verify_graph
from polyfuse.lowering.fusion import describe_groups, partition_fusion_groups
from polyfuse.lowering.graph_passes import (DEFAULT_PASSES, PassManager, eliminate_common_subexpressions,
                                            eliminate_dead_nodes, extend_concatenations, fold_batch_norms, scale_batch_norms,
                                            simplify_movement, split_sparse_windows)
from polyfuse.driver import compile_graph
from polyfuse.targets import Target
from tests.onnx.ort_compare import assert_matches_onnxruntime
import pytest


def model():
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["a"], name="mm1"),
             helper.make_node("MatMul", ["x", "W"], ["b"], name="mm2"),      # same as mm1
             helper.make_node("Add", ["a", "b"], ["c"], name="add"),
             helper.make_node("Relu", ["a"], ["unused"], name="dead_relu"),  # feeds nothing
             helper.make_node("Sub", ["x", "x"], ["dead_sub"], name="dead_sub")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 3])],
                              [numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.unit
def test_dead_nodes_go():
    g = to_graph(model())
    after = eliminate_dead_nodes(g)
    verify_graph(after)
    assert "dead_relu" in str(g) and "dead_relu" not in str(after) and "dead_sub" not in str(after)
    assert [n.name for n in after.nodes] == ["mm1", "mm2", "add"]


@pytest.mark.unit
def test_common_subexpressions_merge():
    after = eliminate_common_subexpressions(eliminate_dead_nodes(to_graph(model())))
    verify_graph(after)
    assert [n.name for n in after.nodes] == ["mm1", "add"]
    assert "%c = Add(%a, %a)" in str(after)


def test_pass_manager_dumps_and_keeps_numerics():
    pm = PassManager(verify=True, keep=True)
    out = pm.run(to_graph(model()))
    assert [name for name, _ in pm.dumps] == ["input"] + [p.__name__ for p in DEFAULT_PASSES]
    assert len(out.nodes) == 2
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_allclose(pf.compile(model(), target="host")(x), 2 * (x @ w), rtol=1e-5)


def test_memory_plan_reuses_dead_activations():
    # Softmax does not fuse with Softmax: four kernels, three intermediates in the arena
    nodes = [helper.make_node("Softmax", [i], [o], axis=0)
             for i, o in (("x", "a"), ("a", "b"), ("b", "c"), ("c", "y"))]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])])
    m = pf.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), target="host")
    plan = m.memory_plan(x=(64, 64))
    one = 64 * 64 * 4
    temporaries = plan.naive_bytes - 4 * one     # each kernel's column maxima and sums
    assert 0 < temporaries < one
    assert "y" not in plan.offsets               # outputs get arrays of their own
    assert plan.offsets["a"] == plan.offsets["c"] != plan.offsets["b"]
    assert 2 * one <= plan.arena_bytes < 3 * one
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    want = x
    for _ in range(4):
        want = np.exp(want - want.max(0)) / np.exp(want - want.max(0)).sum(0)
    np.testing.assert_allclose(m(x), want, rtol=1e-5)


# --- each rewrite: the graph before and after, and the same numbers -----------------------

def _model(nodes, inputs, outputs, initializers):
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
        [numpy_helper.from_array(a, n) for n, a in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _same_numbers(before, after, feeds):
    """Both graphs on the reference interpreter give the same outputs."""
    verify_graph(after)
    want = compile_graph(before, Target.parse("reference")).run(feeds)
    got = compile_graph(after, Target.parse("reference")).run(feeds)
    assert want.keys() == got.keys()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)


RNG = np.random.default_rng(3)


def _bn(name, x, y, channels):
    params = {f"{name}_{p}": RNG.uniform(0.5, 1.5, channels).astype(np.float32)
              for p in ("scale", "bias", "mean", "var")}
    return helper.make_node("BatchNormalization", [x, *params], [y], name=name, epsilon=1e-3), params


@pytest.mark.unit
def test_batch_norm_folds_into_conv_and_gemm():
    bn1, p1 = _bn("bn1", "c", "d", 8)
    bn2, p2 = _bn("bn2", "g", "y", 5)
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1]), bn1,
             helper.make_node("Relu", ["d"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "G"], ["g"], name="gemm", transB=1), bn2]
    inits = {"W": RNG.standard_normal((8, 3, 3, 3)).astype(np.float32),
             "B": RNG.standard_normal(8).astype(np.float32),
             "G": RNG.standard_normal((5, 8 * 4 * 4)).astype(np.float32)} | p1 | p2
    g = to_graph(_model(nodes, {"x": [1, 3, 4, 4]}, {"y": [1, 5]}, inits))
    after = fold_batch_norms(g)
    assert "BatchNormalization" in str(g) and "BatchNormalization" not in str(after)
    assert "%d = Conv(%x, %conv.folded_w, %conv.folded_b" in str(after)
    assert "%y = Gemm(%f, %gemm.folded_w, %gemm.folded_b" in str(after)
    _same_numbers(g, after, {"x": RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)})


@pytest.mark.unit
def test_batch_norm_stays_when_the_conv_output_has_another_reader():
    bn, params = _bn("bn", "c", "d", 4)
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"), bn,
             helper.make_node("Add", ["c", "d"], ["y"], name="add")]
    g = to_graph(_model(nodes, {"x": [1, 2, 3, 3]}, {"y": [1, 4, 3, 3]},
                        {"W": RNG.standard_normal((4, 2, 1, 1)).astype(np.float32)} | params))
    assert fold_batch_norms(g) == g


@pytest.mark.unit
def test_batch_norm_no_conv_takes_becomes_a_scale_and_shift():
    # after a concatenation and after a ReLU: no Conv before either to fold into
    bn1, p1 = _bn("bn1", "cat", "n1", 6)
    bn2, p2 = _bn("bn2", "r", "y", 6)
    nodes = [helper.make_node("Concat", ["x", "z"], ["cat"], name="cat", axis=1), bn1,
             helper.make_node("Relu", ["n1"], ["r"], name="relu"), bn2]
    g = to_graph(_model(nodes, {"x": [2, 4, 3, 5], "z": [2, 2, 3, 5]}, {"y": [2, 6, 3, 5]}, p1 | p2))
    after = scale_batch_norms(fold_batch_norms(g))
    assert "BatchNormalization" not in str(after)
    assert "%bn1.scaled = Mul(%cat, %bn1.scale)" in str(after) and "%n1 = Add(%bn1.scaled, %bn1.shift)" in str(after)
    assert after.constant("bn1.scale").array.shape == (6, 1, 1)
    feeds = {"x": RNG.standard_normal((2, 4, 3, 5)).astype(np.float32),
             "z": RNG.standard_normal((2, 2, 3, 5)).astype(np.float32)}
    _same_numbers(g, after, feeds)
    assert_matches_onnxruntime(_model(nodes, {"x": [2, 4, 3, 5], "z": [2, 2, 3, 5]}, {"y": [2, 6, 3, 5]},
                                      p1 | p2), feeds, rtol=1e-4, atol=1e-5, target="reference")


@pytest.mark.unit
def test_batch_norm_with_fed_statistics_stays():
    bn, params = _bn("bn", "x", "y", 3)
    fed = helper.make_node("BatchNormalization", ["x", "bn_scale", "bn_bias", "m", "bn_var"], ["y"], name="bn")
    g = to_graph(_model([fed], {"x": [1, 3, 2, 2], "m": [3]}, {"y": [1, 3, 2, 2]},
                        {k: v for k, v in params.items() if k != "bn_mean"}))
    assert scale_batch_norms(g) == g


@pytest.mark.unit
def test_a_concatenation_of_an_earlier_one_s_inputs_and_more_appends_to_it():
    """A DenseNet's layers concatenate every earlier layer's features again: each
    Concat reads the last one's result and appends what is new."""
    n = helper.make_node
    nodes = [n("Relu", ["x"], ["a"], name="ra"), n("Sigmoid", ["x"], ["b"], name="sb"),
             n("Concat", ["x", "a"], ["c1"], name="c1", axis=1), n("Neg", ["c1"], ["d"], name="nd"),
             n("Concat", ["x", "a", "d"], ["c2"], name="c2", axis=1), n("Abs", ["c2"], ["e"], name="ae"),
             n("Concat", ["x", "a", "d", "e"], ["c3"], name="c3", axis=1),
             n("Concat", ["x", "a", "b"], ["c4"], name="c4", axis=1),      # another third input
             n("Concat", ["x", "a", "b"], ["c5"], name="c5", axis=2)]  # another axis
    outputs = {"c2": [1, 4, 3], "c3": [1, 8, 3], "c4": [1, 3, 3], "c5": [1, 1, 9]}
    model = _model(nodes, {"x": [1, 1, 3]}, outputs, {})
    g = to_graph(model)
    after = extend_concatenations(g)
    text = str(after)
    assert "%c2 = Concat(%c1, %d, axis=1)" in text and "%c3 = Concat(%c2, %e, axis=1)" in text
    assert "%c4 = Concat(%c1, %b, axis=1)" in text and "%c5 = Concat(%x, %a, %b, axis=2)" in text
    feeds = {"x": RNG.standard_normal((1, 1, 3)).astype(np.float32)}
    _same_numbers(g, after, feeds)
    assert_matches_onnxruntime(model, feeds, target="reference")


@pytest.mark.unit
def test_transposes_and_reshapes_simplify():
    shape = numpy_helper.from_array(np.array([6, 4], np.int64), "s1")
    nodes = [helper.make_node("Transpose", ["x"], ["t1"], name="t1", perm=[1, 0, 2]),
             helper.make_node("Transpose", ["t1"], ["t2"], name="t2", perm=[1, 0, 2]),  # cancels
             helper.make_node("Transpose", ["t2"], ["t3"], name="t3", perm=[2, 0, 1]),
             helper.make_node("Transpose", ["t3"], ["t4"], name="t4", perm=[0, 2, 1]),  # composes
             helper.make_node("Identity", ["t4"], ["i"], name="ident"),
             helper.make_node("Reshape", ["i", "s0"], ["r1"], name="r1"),
             helper.make_node("Reshape", ["r1", "s1"], ["y"], name="r2")]
    model = _model(nodes, {"x": [2, 3, 4]}, {"y": [6, 4]}, {})
    model.graph.initializer.extend([numpy_helper.from_array(np.array([4, 6], np.int64), "s0"), shape])
    g = to_graph(model)
    after = simplify_movement(g)
    assert [n.op for n in after.nodes] == ["Transpose", "Reshape"]
    assert "%t4 = Transpose(%x, perm=[2, 1, 0])" in str(after)
    assert "%y = Reshape(%t4, %s1)" in str(after)
    _same_numbers(g, after, {"x": RNG.standard_normal((2, 3, 4)).astype(np.float32)})


def test_fusion_groups_take_epilogues_and_keep_the_order_topological():
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["a"], name="bias"),
             helper.make_node("Softmax", ["a"], ["s"], name="softmax"),   # reads the group early
             helper.make_node("Relu", ["a"], ["r"], name="relu"),         # so relu cannot join
             helper.make_node("Add", ["r", "s"], ["y"], name="sum"),
             helper.make_node("Exp", ["y"], ["e"], name="exp"),
             helper.make_node("Softmax", ["e"], ["z"], name="softmax2")]  # prologue: joins exp
    g = to_graph(_model(nodes, {"x": [3, 4]}, {"z": [3, 5]},
                        {"W": RNG.standard_normal((4, 5)).astype(np.float32),
                         "b": RNG.standard_normal(5).astype(np.float32)}))
    after = partition_fusion_groups(g)
    text = str(after)
    assert "# mm @g0" in text and "# bias @g0" in text and "# softmax\n" in text
    assert describe_groups(after).splitlines() == [
        "g0: mm (MatMul) -> bias (Add)", "g1: relu (Relu) -> sum (Add) -> exp (Exp) -> softmax2 (Softmax)"]
    _same_numbers(g, after, {"x": RNG.standard_normal((3, 4)).astype(np.float32)})
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    model = _model(nodes, {"x": [3, 4]}, {"z": [3, 5]},
                   {"W": RNG.standard_normal((4, 5)).astype(np.float32),
                    "b": RNG.standard_normal(5).astype(np.float32)})
    assert_matches_onnxruntime(model, {"x": x}, rtol=1e-4)


def test_the_arms_of_an_elementwise_diamond_run_as_one_group():
    """GELU's tanh form: ``0.5 * x`` and ``1 + tanh(c * (x + 0.044715 * x^3))`` start
    apart from ``x`` (two groups) and meet in one product, which merges them: one kernel,
    one pass over memory. A group with a contraction takes no such second arm."""
    c = {k: np.array(v, np.float32) for k, v in
         {"half": 0.5, "three": 3.0, "k": 0.044715, "s": 0.7978846, "one": 1.0}.items()}
    gelu = [helper.make_node("Mul", ["x", "half"], ["h"], name="half_x"),
            helper.make_node("Pow", ["x", "three"], ["p"], name="cube"),
            helper.make_node("Mul", ["p", "k"], ["pk"], name="scale"),
            helper.make_node("Add", ["x", "pk"], ["inner"], name="inner"),
            helper.make_node("Mul", ["inner", "s"], ["arg"], name="arg"),
            helper.make_node("Tanh", ["arg"], ["t"], name="tanh"),
            helper.make_node("Add", ["t", "one"], ["t1"], name="plus_one"),
            helper.make_node("Mul", ["h", "t1"], ["y"], name="product")]
    model = _model(gelu, {"x": [4, 24]}, {"y": [4, 24]}, c)
    g = to_graph(model)
    after = partition_fusion_groups(g)
    assert describe_groups(after).splitlines() == [
        "g0: half_x (Mul) -> cube (Pow) -> scale (Mul) -> inner (Add) -> arg (Mul) -> tanh (Tanh)"
        " -> plus_one (Add) -> product (Mul)"]
    x = RNG.standard_normal((4, 24)).astype(np.float32)
    _same_numbers(g, after, {"x": x})
    assert_matches_onnxruntime(model, {"x": x}, rtol=1e-5, atol=1e-6)
    anchored = [helper.make_node("MatMul", ["x", "W"], ["x2"], name="mm"),
                helper.make_node("Exp", ["x"], ["e"], name="exp"),
                helper.make_node("Add", ["x2", "e"], ["y"], name="add")]
    g = to_graph(_model(anchored, {"x": [4, 4]}, {"y": [4, 4]},
                        {"W": RNG.standard_normal((4, 4)).astype(np.float32)}))
    assert describe_groups(partition_fusion_groups(g)).splitlines() == ["g0: mm (MatMul) -> add (Add)"]


def test_a_dequantization_joins_its_readers_group_so_the_integers_cross_memory():
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quant"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="deq"),
             helper.make_node("MatMul", ["y", "W"], ["m"], name="mm"),
             helper.make_node("QuantizeLinear", ["m", "s", "z"], ["mq"], name="mquant"),
             helper.make_node("DequantizeLinear", ["mq", "s", "z"], ["md"], name="mdeq"),
             helper.make_node("Add", ["md", "d"], ["a"], name="add"),           # residual: deq joins
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["e"], name="deq2"),
             helper.make_node("Softmax", ["e"], ["t"], name="softmax")]         # not elementwise
    model = _model(nodes, {"x": [3, 5], "y": [3, 4]}, {"a": [3, 5], "t": [3, 5]},
                   {"W": RNG.standard_normal((4, 5)).astype(np.float32),
                    "s": np.array(0.05, np.float32), "z": np.array(128, np.uint8)})
    g = to_graph(model)
    after = partition_fusion_groups(g)
    # quant writes uint8 that deq reads in g0 (the softmax is no elementwise reader)
    assert describe_groups(after).splitlines() == [
        "g0: mm (MatMul) -> mquant (QuantizeLinear) -> deq (DequantizeLinear) -> mdeq (DequantizeLinear)"
        " -> add (Add)",
        "g1: deq2 (DequantizeLinear) -> softmax (Softmax)"]
    assert "%q = QuantizeLinear(%x, %s, %z)  # quant\n" in str(after)
    feeds = {"x": RNG.standard_normal((3, 5)).astype(np.float32),
             "y": RNG.standard_normal((3, 4)).astype(np.float32)}
    _same_numbers(g, after, feeds)
    assert_matches_onnxruntime(model, feeds, rtol=1e-4, atol=0.06)   # a quantization step at ties


def test_a_fused_conv_epilogue_is_one_statement():
    """Conv, BatchNormalization, Relu and a residual Add: one kernel whose last statement
    computes the whole epilogue from the channels-last accumulator, on channels-last
    tensors, with the only transposes at the graph's input and output."""
    bn, params = _bn("bn", "c", "d", 16)
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv", pads=[1, 1, 1, 1]), bn,
             helper.make_node("Add", ["d", "x"], ["s"], name="residual"),
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    model = _model(nodes, {"x": [1, 16, 6, 6]}, {"y": [1, 16, 6, 6]},
                   {"W": RNG.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1} | params)
    compiled = pf.compile(model, target="host")
    x = RNG.standard_normal((1, 16, 6, 6)).astype(np.float32)
    assert_matches_onnxruntime(model, {"x": x}, rtol=1e-4, atol=1e-5, compiled=compiled)
    steps = list(compiled.plan_for().steps())
    assert [st.label for st, _ in steps] == ["x:to_channels_last", "g0[conv residual relu]",
                                             "y:channels_first"]
    step, kernel = steps[1]
    text = kernel.stages["specialized"]
    assert text.count(" = ") + text.count(" +=! ") == 3, text   # pad, accumulate, epilogue
    assert "max(" in text.splitlines()[-3]


def test_silu_and_a_squeeze_excite_gate_inline_without_repeating_work():
    """A conv's SiLU (x * sigmoid(x)) inlines its bias add into one epilogue statement (the
    biased value is read twice but costs one add); a squeeze-excite gate's sigmoid, read
    across the whole map, stays one statement per channel, and that kernel schedules its
    small statements apart from the big one (fusion min) so the map keeps channels
    innermost."""
    n = helper.make_node
    nodes = [n("Conv", ["x", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             n("Sigmoid", ["c"], ["cs"], name="sig"), n("Mul", ["c", "cs"], ["a"], name="silu"),
             n("GlobalAveragePool", ["a"], ["p"], name="squeeze"),
             n("Conv", ["p", "We", "Be"], ["e"], name="excite"),
             n("Sigmoid", ["e"], ["g"], name="gate"), n("Mul", ["a", "g"], ["y"], name="scale")]
    inits = {"W": RNG.standard_normal((24, 8, 3, 3)).astype(np.float32) * 0.2,
             "B": RNG.standard_normal(24).astype(np.float32),
             "We": RNG.standard_normal((24, 24, 1, 1)).astype(np.float32) * 0.2,
             "Be": RNG.standard_normal(24).astype(np.float32)}
    model = _model(nodes, {"x": [1, 8, 48, 48]}, {"y": [1, 24, 48, 48]}, inits)
    model.ir_version = 10
    compiled = pf.compile(model, target="host")
    x = RNG.standard_normal((1, 8, 48, 48)).astype(np.float32)
    assert_matches_onnxruntime(model, {"x": x}, rtol=1e-4, atol=1e-5, compiled=compiled)
    kernels = {st.label: k for st, k in compiled.plan_for().steps()}
    silu = next(k for label, k in kernels.items() if "silu" in label).stages["specialized"]
    epilogue = [line for line in silu.splitlines() if "sigmoid(" in line]
    assert len(epilogue) == 1, silu
    assert silu.count(" = ") == 2, silu      # the padded input and the epilogue; no biased copy
    gate = next(k for label, k in kernels.items() if "scale" in label)
    text = gate.stages["specialized"]
    [sigmoid] = [line for line in text.splitlines() if "sigmoid(" in line]
    assert "* " not in sigmoid and "where" not in sigmoid, text   # per channel, not in the map's statement
    assert "fusion=<Fusion.MIN" in gate.stages["options"]


def test_scalar_constants_become_literals_and_small_powers_products():
    """GPT-2's tanh GELU: its scalar initializers are literals in the fused kernel (no
    parameters besides the activation) and ``Pow(x, 3)`` is ``x * x * x``, not exp and
    log; a vector constant stays a parameter."""
    n = helper.make_node
    nodes = [n("Pow", ["x", "three"], ["p"], name="pow"), n("Mul", ["p", "k"], ["q"], name="scale"),
             n("Add", ["x", "q"], ["s"], name="add"), n("Tanh", ["s"], ["t"], name="tanh"),
             n("Mul", ["t", "v"], ["y"], name="weigh")]
    inits = {"three": np.array(3.0, np.float32), "k": np.array([0.044715], np.float32),
             "v": RNG.standard_normal(7).astype(np.float32)}
    model = _model(nodes, {"x": [5, 7]}, {"y": [5, 7]}, inits)
    compiled = pf.compile(model, target="host")
    x = RNG.standard_normal((5, 7)).astype(np.float32) * 3
    assert_matches_onnxruntime(model, {"x": x}, rtol=1e-5, atol=1e-6, compiled=compiled)
    [(step, kernel)] = list(compiled.plan_for().steps())
    text = kernel.stages["specialized"]
    assert "pow(" not in text and "0.044714998" in text, text
    assert text.startswith("def fused(float32(5, 7) v0, float32(7) ") and text.count("float32(7)") == 1, text
    # the power of a product's biased element, in the product's epilogue: products too
    # (as pow, it would be a scalar library call per element)
    nodes = [n("MatMul", ["x", "w"], ["m"], name="mm"), n("Add", ["m", "b"], ["a"], name="bias"),
             n("Pow", ["a", "three"], ["y"], name="cube")]
    inits = {"w": RNG.standard_normal((7, 32)).astype(np.float32), "b": RNG.standard_normal(32).astype(np.float32),
             "three": np.array(3.0, np.float32)}
    model = _model(nodes, {"x": [5, 7]}, {"y": [5, 32]}, inits)
    compiled = pf.compile(model, target="host")
    assert_matches_onnxruntime(model, {"x": x}, rtol=1e-4, atol=1e-4, compiled=compiled)
    [(step, kernel)] = list(compiled.plan_for().steps())
    assert "pow(" not in kernel.stages["specialized"] and "powf" not in kernel.stages["asm"], \
        kernel.stages["specialized"]


def _dilated(rate, size, channels=(5, 4), kernel=3, bias=True):
    nodes = [helper.make_node("Conv", ["x", "W"] + (["B"] if bias else []), ["c"], name="aspp",
                              dilations=[rate, rate], pads=[rate] * 4, kernel_shape=[kernel, kernel]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    params = {"W": RNG.standard_normal((channels[1], channels[0], kernel, kernel)).astype(np.float32)}
    if bias:
        params["B"] = RNG.standard_normal(channels[1]).astype(np.float32)
    out = size + 2 * rate - rate * (kernel - 1)
    return _model(nodes, {"x": [1, channels[0], size, size]}, {"y": [1, channels[1], out, out]}, params)


@pytest.mark.parametrize("rate, size", [(12, 14), (4, 7), (5, 9)])
def test_a_convolution_dilated_past_the_map_computes_its_live_taps_per_region(rate, size):
    """DeepLab's ASPP at rate 12 on 14 x 14 (and smaller kin): the output is cut where
    taps start or stop reading inside the input, each region a convolution of its live
    taps on the input it reads, concatenated back."""
    m = _dilated(rate, size)
    g = to_graph(m)
    after = split_sparse_windows(g)
    convs = [n for n in after.nodes if n.op == "Conv"]
    assert len(convs) == 9 and all(n.attr("pads") == (0, 0, 0, 0) for n in convs), str(after)
    computed = sum(np.prod(after.constant(n.inputs[1]).array.shape[2:]) * np.prod(after.type_of(n.outputs[0]).shape[2:])
                   for n in convs)
    live = sum(sum(1 for j in range(3) if 0 <= o + rate * (j - 1) < size) for o in range(size)) ** 2
    assert computed == live   # every tap computed reads inside the input, each once
    x = {"x": RNG.standard_normal((1, 5, size, size)).astype(np.float32)}
    _same_numbers(g, after, x)
    assert_matches_onnxruntime(m, x, rtol=1e-4, atol=1e-5, target="host")


@pytest.mark.unit
def test_a_convolution_reading_inside_at_most_positions_stays_whole():
    g = to_graph(_dilated(1, 8))   # a plain 3x3: the border taps are live at 7 of 8 positions
    assert split_sparse_windows(g) is g
    g = to_graph(_dilated(3, 7, bias=False))   # (15 / 21) ** 2 of the taps live: over LIVE_SHARE
    assert split_sparse_windows(g) is g
