"""torch.compile(backend="polyfuse") against eager PyTorch and torch.compile's inductor
(CPU), in one process: inference and one SGD training step.

    python benchmarks/torch_models.py [--only resnet18,mobilenet_v3_small,transformer,mlp]
                                      [--repeat 9] [--mode inference,training]

Models: torchvision ResNet-18 and MobileNetV3-Small (``weights=None``, batch 2, 3x96x96,
batch-norm statistics measured on random data), two ``nn.TransformerEncoderLayer``
(d_model 128, 4 heads, batch 4, sequence 32) and an MLP (512-1024-1024-10, batch 64).
Inference runs under ``torch.no_grad()`` with the encoder's fused fast path off, so all
three runners see the same ATen ops; a training step is forward, cross-entropy, backward
and ``SGD.step``. Each runner is compiled (and warmed up) first; compile s is that
first call. Times are medians of ``--repeat`` rounds of 3 calls, the runners interleaved.
Outputs (inference) and losses (training) are checked against eager.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from collections.abc import Callable

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.timing import interleaved_times  # noqa: E402
from tests.torch.models import calibrated  # noqa: E402


def resnet18() -> tuple[torch.nn.Module, torch.Tensor]:
    import torchvision
    x = torch.randn(2, 3, 96, 96)
    return calibrated(torchvision.models.resnet18(weights=None), x), x


def mobilenet_v3_small() -> tuple[torch.nn.Module, torch.Tensor]:
    import torchvision
    x = torch.randn(2, 3, 96, 96)
    return calibrated(torchvision.models.mobilenet_v3_small(weights=None), x), x


def transformer() -> tuple[torch.nn.Module, torch.Tensor]:
    layer = torch.nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True)
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval(), torch.randn(4, 32, 128)


def mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    net = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                              torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    return net.eval(), torch.randn(64, 512)


MODELS = {"resnet18": resnet18, "mobilenet_v3_small": mobilenet_v3_small, "transformer": transformer,
          "mlp": mlp}
RUNNERS = ("eager", "inductor", "polyfuse")


def _runner(model: torch.nn.Module, name: str) -> Callable:
    if name == "eager":
        return model
    return torch.compile(model, backend=name)


def _inference(model: torch.nn.Module, x: torch.Tensor) -> dict[str, Callable[[], object]]:
    fns = {}
    for name in RUNNERS:
        run = _runner(model, name)

        def call(run: Callable = run) -> torch.Tensor:
            with torch.no_grad():
                return run(x)
        fns[name] = call
    return fns


def _training(model: torch.nn.Module, x: torch.Tensor) -> dict[str, Callable[[], object]]:
    target = torch.arange(x.shape[0])
    fns = {}
    for name in RUNNERS:
        net = copy.deepcopy(model).train()
        for m in net.modules():   # batch-norm statistics stay fixed: the step is repeatable
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.eval()
        run, opt = _runner(net, name), torch.optim.SGD(net.parameters(), lr=1e-3)

        def step(run: Callable = run, opt: torch.optim.Optimizer = opt) -> torch.Tensor:
            opt.zero_grad()
            out = run(x)
            loss = torch.nn.functional.cross_entropy(out.reshape(out.shape[0], -1), target % out[0].numel())
            loss.backward()
            opt.step()
            return loss.detach()
        fns[name] = step
    return fns


def measure(model_name: str, mode: str, repeat: int) -> list[str]:
    torch.manual_seed(0)
    torch._dynamo.reset()
    model, x = MODELS[model_name]()
    fns = (_inference if mode == "inference" else _training)(model, x)
    compile_s, first = {}, {}
    for name, fn in fns.items():
        t = time.perf_counter()
        first[name] = fn()
        compile_s[name] = time.perf_counter() - t
    scale = float(first["eager"].abs().max()) or 1.0
    errors = {name: float((first[name] - first["eager"]).abs().max()) / scale for name in RUNNERS}
    times = interleaved_times(fns, repeat)
    eager = times["eager"]
    return [model_name, mode] + [f"{times[n] * 1e3:.2f}" for n in RUNNERS] + \
        [f"{eager / times[n]:.2f}x" for n in RUNNERS[1:]] + \
        [f"{compile_s[n]:.1f}" for n in RUNNERS[1:]] + [f"{errors['polyfuse']:.1e}"]


HEADER = ["model", "mode", "eager ms", "inductor ms", "polyfuse ms", "inductor speedup",
          "polyfuse speedup", "inductor compile s", "polyfuse compile s", "polyfuse rel err"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(MODELS))
    parser.add_argument("--mode", default="inference,training")
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    torch.backends.mha.set_fastpath_enabled(False)
    rows = [HEADER]
    for model_name in args.only.split(","):
        for mode in args.mode.split(","):
            rows.append(measure(model_name, mode, max(args.repeat, 9)))
            print("  ".join(rows[-1]), file=sys.stderr, flush=True)
    widths = [max(len(r[k]) for r in rows) for k in range(len(HEADER))]
    for r in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
    main()
