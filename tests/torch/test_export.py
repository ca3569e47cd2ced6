"""pf.compile of torch.export programs, in memory and saved as .pt2, against eager
PyTorch; unsupported ops named with the user's source line; the CLI on .pt2 files."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import polyfuse as pf  # noqa: E402
from polyfuse.cli import main  # noqa: E402
from tests.torch.models import assert_close, calibrated  # noqa: E402


class ConvNet(torch.nn.Module):
    """Conv, batch norm, pooling, a residual add, softmax: the common core ops."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.fc = torch.nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        h = torch.nn.functional.max_pool2d(h, 2)
        h = h + torch.nn.functional.silu(self.conv2(h))
        h = torch.nn.functional.avg_pool2d(h, 2)
        return torch.softmax(self.fc(h.flatten(1)), dim=-1)


def _convnet():
    torch.manual_seed(0)
    return calibrated(ConvNet(), torch.zeros(1, 3, 16, 16))


def test_exported_program_matches_eager():
    model = _convnet()
    x = torch.randn(2, 3, 16, 16)
    compiled = pf.compile(torch.export.export(model, (x,)), target="host")
    assert [v.name for v in compiled.inputs] == ["x"]
    assert_close(compiled(x.numpy()), model(x))


def test_pt2_file_with_a_dynamic_batch(tmp_path):
    model = _convnet()
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(model, (torch.randn(2, 3, 16, 16),), dynamic_shapes={"x": {0: batch}})
    path = tmp_path / "convnet.pt2"
    torch.export.save(program, str(path))
    compiled = pf.compile(str(path), target="host")
    assert isinstance(compiled.inputs[0].type.shape[0], str)   # the batch stays symbolic
    for n in (1, 3):
        x = torch.randn(n, 3, 16, 16)
        assert_close(compiled(x.numpy()), model(x))


class Transformerish(torch.nn.Module):
    """Layer norm, attention (scaled_dot_product_attention), GELU, embedding, slicing."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(20, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.qkv = torch.nn.Linear(16, 48)
        self.out = torch.nn.Linear(16, 16)

    def forward(self, tokens):
        h = self.norm(self.embed(tokens))
        q, k, v = self.qkv(h).view(h.shape[0], h.shape[1], 3, 2, 8).permute(2, 0, 3, 1, 4).unbind(0)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.out(a.transpose(1, 2).reshape(h.shape))
        return torch.nn.functional.gelu(h)[:, -1].mean(dim=-1, keepdim=True), h.amax(1)


def test_attention_program_matches_eager():
    torch.manual_seed(0)
    model = Transformerish().eval()
    tokens = torch.randint(0, 20, (2, 6))
    compiled = pf.compile(torch.export.export(model, (tokens,)), target="host")
    for got, want in zip(compiled(tokens.numpy()), model(tokens)):
        assert_close(got, want)


class Unsupported(torch.nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        return torch.cumprod(y, dim=1)


@pytest.mark.unit
def test_unsupported_op_is_named_with_its_source_line():
    program = torch.export.export(Unsupported(), (torch.randn(2, 3),))
    with pytest.raises(pf.UnsupportedOpError) as info:
        pf.compile(program)
    message = str(info.value)
    assert "aten.cumprod.default" in message
    assert "test_export.py:" in message and "torch.cumprod(y, dim=1)" in message


@pytest.mark.unit
def test_missing_pt2_file_is_a_model_error(tmp_path):
    with pytest.raises(pf.ModelError, match="no exported program"):
        pf.compile(str(tmp_path / "absent.pt2"))


def test_cli_runs_a_pt2_file(tmp_path, capsys):
    model = _convnet()
    x = torch.randn(2, 3, 16, 16)
    path = tmp_path / "convnet.pt2"
    torch.export.save(torch.export.export(model, (x,)), str(path))
    np.savez(tmp_path / "in.npz", x=x.numpy())
    out = tmp_path / "out.npz"
    assert main(["run", str(path), "--target", "host", "--inputs", str(tmp_path / "in.npz"),
                 "--outputs", str(out)]) == 0
    with np.load(out) as f:
        (got,) = [f[k] for k in f.files]
    assert_close(got, model(x))
    assert main(["compile", str(path), "--target", "host", "--dump", "groups"]) == 0
    assert capsys.readouterr().out.strip()


def test_precision_bf16_rounds_the_products_of_constant_weights():
    """A Linear's weights reach its Gemm through a transpose, which the bf16 pass follows;
    the grouped convolution stays float32. The result is the eager one to bfloat16's
    precision, and not to float32's (the products really round)."""
    torch.manual_seed(3)
    model = ConvNet().eval()
    x = torch.randn(2, 3, 16, 16)
    compiled = pf.compile(torch.export.export(model, (x,)), target="host", precision="bf16")
    got, want = compiled(x.numpy()), model(x).detach().numpy()
    graph = compiled.dump("use_bfloat16_products")
    assert "BFloat16Gemm" in graph and graph.count("BFloat16Conv") == 1
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-3)
    assert np.abs(got - want).max() > 1e-5
