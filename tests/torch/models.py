"""Small models the torch tests compile, with parameters at scales that make their
outputs meaningful (batch-norm statistics measured on data, not left at 0 and 1)."""

import numpy as np
import torch


def calibrated(model: torch.nn.Module, example: torch.Tensor, seed: int = 0) -> torch.nn.Module:
    """``model`` in eval mode with random batch-norm scales and shifts and running
    statistics measured on a random batch shaped like ``example``."""
    gen = torch.Generator().manual_seed(seed)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    with torch.no_grad():
        for m in norms:
            m.reset_running_stats()
            m.momentum = None   # a cumulative average: the statistics of the batch
            m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
            m.bias.copy_(torch.rand(m.bias.shape, generator=gen) * 0.2 - 0.1)
        model.train()
        model(torch.randn((4,) + tuple(example.shape[1:]), generator=gen))
    return model.eval()


def resnet18() -> torch.nn.Module:
    import torchvision
    torch.manual_seed(0)
    return calibrated(torchvision.models.resnet18(weights=None, num_classes=10), torch.zeros(1, 3, 32, 32))


def mobilenet_v3_small() -> torch.nn.Module:
    import torchvision
    torch.manual_seed(0)
    return calibrated(torchvision.models.mobilenet_v3_small(weights=None, num_classes=10),
                      torch.zeros(1, 3, 64, 64))


def transformer() -> torch.nn.Module:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 32),
                               torch.nn.SiLU(), torch.nn.Linear(32, 10)).eval()


def small_cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))


# model -> input of batch size n
INPUTS = {
    "resnet18": lambda n: torch.randn(n, 3, 32, 32),
    "mobilenet_v3_small": lambda n: torch.randn(n, 3, 64, 64),
    "transformer": lambda n: torch.randn(n, 8, 32),
    "mlp": lambda n: torch.randn(n, 16),
    "small_cnn": lambda n: torch.randn(n, 3, 16, 16),
}
MODELS = {"resnet18": resnet18, "mobilenet_v3_small": mobilenet_v3_small, "transformer": transformer,
          "mlp": mlp, "small_cnn": small_cnn}


def assert_close(got, want, rtol: float = 1e-4) -> None:
    """Within ``rtol`` of ``want``, and an absolute tolerance of ``rtol`` times its
    largest magnitude (sums of many terms cancel to values near 0)."""
    got, want = (t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t) for t in (got, want))
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * float(np.abs(want).max()) + 1e-7)
