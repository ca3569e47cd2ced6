"""RNN, GRU and LSTM against onnxruntime (every direction, layout, sequence lengths,
activations with alpha and beta, clip, peepholes, optional inputs and outputs), torch's
exported nn.LSTM and nn.GRU, and the plan: one fused kernel per step, compiled once."""

import io

import numpy as np
import pytest
from onnx import TensorProto, helper

import polyfuse as pf
from polyfuse.runtime import cpu
from tests.onnx.ort_compare import assert_matches_onnxruntime, one_node_model, onnxruntime_outputs

F = TensorProto.FLOAT
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _model(op, steps=5, batch=3, size=5, hidden=7, direction="forward", layout=0,
           bias=True, lens=None, initial=False, peepholes=False, outputs=(True, True, True),
           constant_weights=False, seed=0, **attrs):
    """A one-node model of ``op`` and its feeds; ``lens`` are the sequence lengths."""
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]

    def normal(*shape):
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    x_shape = (batch, steps, size) if layout else (steps, batch, size)
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    values = {"X": normal(*x_shape), "W": normal(dirs, g * hidden, size),
              "R": normal(dirs, g * hidden, hidden)}
    if bias:
        values["B"] = normal(dirs, 2 * g * hidden)
    if lens is not None:
        values["sequence_lens"] = np.array(lens, np.int32)
    if initial:
        values["initial_h"] = normal(*state)
        if op == "LSTM":
            values["initial_c"] = normal(*state)
    if peepholes:
        values["P"] = normal(dirs, 3 * hidden)
    order = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"][:8 if op == "LSTM" else 6]
    inputs = [n if n in values else "" for n in order]
    while not inputs[-1]:
        inputs.pop()
    names = ["Y", "Y_h", "Y_c"][:3 if op == "LSTM" else 2]
    outs = [n if keep else "" for n, keep in zip(names, outputs)]
    while not outs[-1]:
        outs.pop()
    node = helper.make_node(op, inputs, outs, hidden_size=hidden, direction=direction,
                            **({"layout": layout} if layout else {}), **attrs)
    weights = {"W", "R", "B", "P"} if constant_weights else set()
    feeds = {n: a for n, a in values.items() if n not in weights}
    constants = {n: a for n, a in values.items() if n in weights}
    model = one_node_model(node, feeds, {n: F for n in outs if n}, constants, opset=22)
    return model, feeds


def _check(op, target="host", **kwargs):
    model, feeds = _model(op, **kwargs)
    want = None
    if kwargs.get("layout"):   # onnxruntime runs layout 0 only: the same data transposed
        plain, _ = _model(op, **{**kwargs, "layout": 0})
        swap = {"X": (1, 0, 2), "initial_h": (1, 0, 2), "initial_c": (1, 0, 2)}
        got = onnxruntime_outputs(plain, {n: a.transpose(swap[n]) if n in swap else a
                                          for n, a in feeds.items()})
        want = [y.transpose((2, 0, 1, 3) if y.ndim == 4 else (1, 0, 2)) for y in got]
    assert_matches_onnxruntime(model, feeds, rtol=1e-4, atol=1e-5, want=want, target=target)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_lstm_directions_layouts_lengths_states_peepholes(direction, layout):
    _check("LSTM", direction=direction, layout=layout, lens=[5, 2, 4], initial=True,
           peepholes=True)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_gru_directions_and_reset(direction, linear_before_reset):
    _check("GRU", direction=direction, lens=[3, 5, 1], initial=True,
           linear_before_reset=linear_before_reset)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_rnn_directions_layout_and_lengths(direction):
    _check("RNN", direction=direction, layout=1, lens=[4, 5, 2], initial=True)


def test_activations_with_alpha_beta_and_clip():
    _check("LSTM", direction="bidirectional", clip=0.7,
           activations=["HardSigmoid", "ScaledTanh", "Affine", "Sigmoid", "Elu", "Softsign"],
           activation_alpha=[0.3, 0.8, 1.5, 0.6], activation_beta=[0.4, 1.2, -0.2])
    _check("GRU", direction="reverse", activations=["Sigmoid", "LeakyRelu"],
           activation_alpha=[0.2], linear_before_reset=1, clip=1.5)
    _check("RNN", direction="bidirectional", activations=["ThresholdedRelu", "Softplus"],
           activation_alpha=[0.1])
    _check("RNN", activations=["Relu"], lens=[2, 5, 3])


def test_one_batch_row_reads_r_as_given_more_read_it_transposed():
    _check("GRU", batch=1, direction="bidirectional", lens=[4], initial=True)
    _check("LSTM", batch=1, direction="reverse", peepholes=True, constant_weights=True)
    _check("GRU", batch=9, direction="bidirectional", lens=[5, 4, 3, 2, 1, 5, 4, 3, 2])
    _check("LSTM", batch=8, direction="bidirectional", peepholes=True, constant_weights=True)


@pytest.mark.parametrize("dtype, code, tolerance", [(np.float64, TensorProto.DOUBLE, 1e-12),
                                                     (np.float16, TensorProto.FLOAT16, 3e-3)])
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_float64_and_float16_against_the_onnx_reference(op, dtype, code, tolerance):
    """onnxruntime runs these ops in float32 only; the reference computes float16 in
    float16, polyfuse in float32 rounding each state to float16."""
    from onnx.reference import ReferenceEvaluator
    rng = np.random.default_rng(1)
    g = GATES[op]
    feeds = {"X": rng.standard_normal((4, 2, 3)), "W": rng.standard_normal((2, g * 5, 3)) * 0.5,
             "R": rng.standard_normal((2, g * 5, 5)) * 0.5, "B": rng.standard_normal((2, 2 * g * 5)),
             "initial_h": rng.standard_normal((2, 2, 5))}
    feeds = {n: a.astype(dtype) for n, a in feeds.items()}
    node = helper.make_node(op, ["X", "W", "R", "B", "", "initial_h"], ["Y", "Y_h"], hidden_size=5,
                            direction="bidirectional")
    model = one_node_model(node, feeds, {"Y": code, "Y_h": code}, opset=22)
    got = pf.compile(model, target="host").run(feeds)
    for name, want in zip(["Y", "Y_h"], ReferenceEvaluator(model).run(None, feeds)):
        assert got[name].dtype == dtype
        np.testing.assert_allclose(got[name].astype(np.float64), want.astype(np.float64),
                                   rtol=tolerance, atol=tolerance)


def test_long_sequences_stack_in_chunks():
    _check("RNN", steps=37, batch=2, size=3, hidden=4, direction="bidirectional", layout=1)
    _check("GRU", steps=21, batch=2, size=3, hidden=3, direction="reverse", lens=[21, 9])


def test_input_forget_without_bias_and_initial_states():
    _check("LSTM", direction="bidirectional", input_forget=1, bias=False, peepholes=True)


@pytest.mark.parametrize("outputs", [(True, False, False), (False, True, False),
                                     (False, False, True), (False, True, True)])
def test_optional_outputs(outputs):
    _check("LSTM", direction="bidirectional", lens=[5, 3, 4], outputs=outputs)


def test_constant_weights_odd_shapes_and_the_interpreter():
    _check("LSTM", steps=4, batch=5, size=9, hidden=13, direction="bidirectional",
           constant_weights=True, peepholes=True, initial=True)
    _check("GRU", steps=3, batch=2, hidden=6, lens=[3, 2], direction="bidirectional",
           target="reference", initial=True)


def test_steps_are_one_kernel_each_compiled_once(capfd):
    model, feeds = _model("LSTM", steps=9, batch=2, size=3, hidden=5, direction="bidirectional",
                          constant_weights=True, seed=3)
    before = sum(cpu.STATS.values())
    compiled = pf.compile(model, target="host")
    assert_matches_onnxruntime(model, feeds, rtol=1e-4, atol=1e-5, compiled=compiled)
    kernels = list(compiled.plan_for().steps())
    steps = [(st, k) for st, k in kernels if "/step" in st.label]
    assert len(steps) == 9 * 2      # one kernel per step and direction, nothing else per step
    assert len({st.source for st, _ in steps}) == 1 and len({id(k) for _, k in steps}) == 1
    # the projection, the step, Y, and Y_h with Y_c (one text): each built once
    assert len(kernels) == 1 + 18 + 3
    assert len({id(k) for _, k in kernels}) == 4 == sum(cpu.STATS.values()) - before
    assert [t.name.split("/")[-1] for t in compiled.tasks()][:2] == ["xw", "step0.f"]
    assert len(compiled.tasks()) == 4      # the autotuner tunes the step once
    assert "= view %\"LSTM_0:xw\" +40  // LSTM_0/step1.f.xw" in compiled.dump("plan")
    assert capfd.readouterr().err == ""     # compiling is quiet


@pytest.mark.unit
def test_wrong_shapes_and_activations_name_the_node():
    feeds = {"X": np.zeros((5, 3, 4), np.float32), "W": np.zeros((1, 21, 5), np.float32),
             "R": np.zeros((1, 21, 7), np.float32)}
    model = one_node_model(helper.make_node("GRU", ["X", "W", "R"], ["Y"], name="gru"), feeds,
                           {"Y": F}, opset=22)
    with pytest.raises(pf.ModelError, match=r"'gru' \(GRU\): input 1 has shape \(1, 21, 5\)"):
        pf.compile(model, target="host").run(feeds)
    model, feeds = _model("RNN", activations=["Gelu"])
    with pytest.raises(pf.UnsupportedOpError, match="activation 'Gelu' is not one of"):
        pf.compile(model, target="host").run(feeds)
    # polyfuse's own step ops are no ONNX ops: the backend does not claim them
    import polyfuse.backend
    assert {"RNN", "GRU", "LSTM"} <= polyfuse.backend.supported_ops()
    assert not {"LSTMStep", "TimeSlice", "RecurrentStack"} & polyfuse.backend.supported_ops()


@pytest.mark.filterwarnings("ignore")   # the TorchScript exporter's notices
@pytest.mark.parametrize("batch_first", [False, True])
def test_torch_lstm_and_gru_two_layers_bidirectional(batch_first):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(6, 10, num_layers=2, bidirectional=True, batch_first=batch_first)
            self.gru = torch.nn.GRU(20, 7, batch_first=batch_first)

        def forward(self, x):
            y, (h, c) = self.lstm(x)
            z, g = self.gru(y)
            return z, h, c, g

    x = torch.randn((3, 7, 6) if batch_first else (7, 3, 6))
    buffer = io.BytesIO()
    torch.onnx.export(Net().eval(), (x,), buffer, dynamo=False, input_names=["x"])
    import onnx
    model = onnx.load_from_string(buffer.getvalue())
    assert {n.op_type for n in model.graph.node} >= {"LSTM", "GRU"}
    assert_matches_onnxruntime(model, {"x": x.numpy()}, rtol=1e-4, atol=1e-4)
