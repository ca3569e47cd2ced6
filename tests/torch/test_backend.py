"""torch.compile(backend="polyfuse") against eager PyTorch: inference of whole models at
two batch sizes (static and dynamic sizes), an SGD step through AOTAutograd, and models
polyfuse supports only in part."""

import contextlib
import copy
import logging

import pytest

torch = pytest.importorskip("torch")

import polyfuse.torch.dynamo as pft  # noqa: E402
from polyfuse.errors import OptionError  # noqa: E402
from tests.torch.models import INPUTS, MODELS, assert_close  # noqa: E402


@pytest.fixture
def compiled_parts(monkeypatch):
    """Every part polyfuse compiles during the test."""
    parts = []
    original = pft.compile_part

    def recording(*args, **kwargs):
        parts.append(original(*args, **kwargs))
        return parts[-1]
    monkeypatch.setattr(pft, "compile_part", recording)
    torch._dynamo.reset()
    yield parts
    torch._dynamo.reset()


def _graphs(parts):
    """The graph IR of the parts that have run."""
    return [p.model.graph for p in parts if p.model is not None]


def _ops(parts):
    return {n.op for g in _graphs(parts) for n in g.nodes}


@contextlib.contextmanager
def _inference():
    # the encoder's fused fast path is one opaque op; without it, its ATen ops are traced
    fast = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad():
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fast)


# model, dynamic sizes, batch sizes, graph ops its compiled parts must hold
CASES = [
    pytest.param("mlp", False, (2, 3), {"Gemm", "Gelu"}),
    pytest.param("mlp", True, (2, 3), {"Gemm", "Gelu"}),
    pytest.param("transformer", True, (2, 3), {"MatMul", "Softmax", "LayerNormalization"}),
    pytest.param("resnet18", False, (2,), {"Conv", "MaxPool", "Gemm"}),
    pytest.param("transformer", False, (2, 3), {"MatMul", "Softmax"}, marks=pytest.mark.slow),
    pytest.param("resnet18", False, (1, 2), {"Conv", "MaxPool"}, marks=pytest.mark.slow),
    pytest.param("resnet18", True, (1, 2), {"Conv", "MaxPool"}, marks=pytest.mark.slow),
    pytest.param("mobilenet_v3_small", False, (1, 2), {"Conv", "Clip"}, marks=pytest.mark.slow),
    pytest.param("mobilenet_v3_small", True, (1, 2), {"Conv", "Clip"}, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name, dynamic, batches, expected_ops", CASES)
def test_inference_matches_eager(name, dynamic, batches, expected_ops, compiled_parts, caplog):
    model = MODELS[name]()
    compiled = torch.compile(model, backend="polyfuse", dynamic=dynamic)
    with caplog.at_level(logging.INFO, logger="polyfuse.torch"), _inference():
        for batch in batches:
            x = INPUTS[name](batch)
            assert_close(compiled(x), model(x))
    assert expected_ops <= _ops(compiled_parts)
    assert not [r for r in caplog.records if "eager" in r.getMessage()], "an op fell back to eager"
    if dynamic:   # one compilation serves both batch sizes: its batch size is a symbol
        assert any(isinstance(d, str) for g in _graphs(compiled_parts) for v in g.inputs for d in v.type.shape)


def test_inference_weights_are_constants_until_they_change(compiled_parts):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    compiled = torch.compile(model, backend="polyfuse")
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert_close(compiled(x), model(x))
        (graph,) = _graphs(compiled_parts)
        assert len(graph.inputs) == 1 and len(graph.constants) >= 4   # the weights are folded in
        model[0].weight.mul_(2)     # in place: the part compiles again with the new values
        assert_close(compiled(x), model(x))


def _sgd_step(model, x, target):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), target)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    opt.step()
    return loss.detach(), grads, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("name", ["small_cnn", "mlp"])
def test_training_step_matches_eager(name, compiled_parts, caplog):
    model = MODELS[name]().train()
    eager = copy.deepcopy(model)
    x, target = INPUTS[name](4), torch.arange(4) % 10
    with caplog.at_level(logging.INFO, logger="polyfuse.torch"):
        loss, grads, params = _sgd_step(torch.compile(model, backend="polyfuse"), x, target)
    want_loss, want_grads, want_params = _sgd_step(eager, x, target)
    assert_close(loss, want_loss)
    for got, want in zip(grads + params, want_grads + want_params):
        assert_close(got, want)
    # the backward graph ran through polyfuse too
    assert {"ConvTranspose"} <= _ops(compiled_parts) if name == "small_cnn" else \
        {"Gemm", "MatMul"} <= _ops(compiled_parts)
    assert not [r for r in caplog.records if "eager" in r.getMessage()]


class PartlySupported(torch.nn.Module):
    """A running product (cumprod: no graph op) between layers polyfuse compiles."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        return self.b(torch.cumprod(h * 0.5 + 1, dim=1))


def test_unsupported_ops_fall_back_to_eager(compiled_parts, caplog):
    torch.manual_seed(0)
    model = PartlySupported().eval()
    compiled = torch.compile(model, backend="polyfuse")
    with caplog.at_level(logging.INFO, logger="polyfuse.torch"), torch.no_grad():
        for batch in (3, 5):
            x = torch.randn(batch, 8)
            assert_close(compiled(x), model(x))
    assert len(_graphs(compiled_parts)) >= 2 and "Gemm" in _ops(compiled_parts)
    messages = [r.getMessage() for r in caplog.records if "aten.cumprod" in r.getMessage()]
    assert len(messages) == 1 and "eager" in messages[0]   # logged once, not per call


@pytest.mark.unit
def test_options_are_checked():
    torch._dynamo.reset()
    compiled = torch.compile(torch.nn.Linear(2, 2), backend="polyfuse", options={"targte": "host"})
    with pytest.raises(Exception) as info:
        compiled(torch.randn(1, 2))
    assert isinstance(info.value, OptionError) or isinstance(info.value.__cause__, OptionError) \
        or "targte" in str(info.value)


@pytest.mark.unit
def test_backend_callable_with_target_option(compiled_parts):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU()).eval()
    compiled = torch.compile(model, backend=pft.backend, options={"target": "reference"})
    with torch.no_grad():
        x = torch.randn(3, 6)
        assert_close(compiled(x), model(x))
    assert compiled_parts
