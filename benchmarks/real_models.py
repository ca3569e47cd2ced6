"""Real architectures, exported from torch, against onnxruntime and torch eager, in one process.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/real_models.py \\
        [--only resnet50,mobilenet_v3_small,efficientnet_b0,vit_b16,bert,gpt2] [--repeat 9] [--layers 2] [--convs]

Needs ``pip install torch torchvision transformers`` (nothing is downloaded: every
model is built with random weights). The OpenBLAS variables are unset because they
change numpy's and torch's BLAS and so the baselines.

Builds ResNet-50, MobileNetV3-Small, EfficientNet-B0 and ViT-B/16 from torchvision
(``weights=None``, batch 1, 224x224) and stacks of ``--layers`` BERT-base and
GPT-2-small layers from ``transformers`` configs (sequence 128, int64 input_ids). The
weights are drawn again at scales that keep activations alive (torchvision zero-inits
some heads and last BatchNorm gammas, which would make the check vacuous). Each model
is exported with ``torch.onnx.export(dynamo=False, opset_version=17)``, compiled with
``pf.compile(target="host")`` (compile s includes the first run, where kernels may be
built, and uses polyfuse's disk cache: prefix ``POLYFUSE_CACHE_DIR=0`` for cold
compiles), and timed against onnxruntime with 1 and 2 intra-op threads and torch eager
with 2 threads, interleaved, as medians of ``--repeat`` runs after a warm-up.
polyfuse's output is checked against onnxruntime's (rtol = atol = 1e-3); a model that
fails to compile or mismatches is reported in its row and the run goes on.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable

# torch's OpenMP threads would otherwise spin between calls and slow the runner timed next.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import onnxruntime as ort
import torch

import polyfuse as pf
from peak import fma_peak
from timing import interleaved_times

# benchmarks/kernels.py would shadow the `kernels` package that transformers imports.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

SEQ = 128


def reinit(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights at He scale, BatchNorm/LayerNorm near identity, small biases; eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * math.sqrt(2.0 / fan_in))
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.01)
            elif isinstance(m, (torch.nn.BatchNorm2d, torch.nn.LayerNorm)):
                m.weight.copy_(1 + 0.1 * torch.randn(m.weight.shape, generator=gen))
                m.bias.copy_(0.01 * torch.randn(m.bias.shape, generator=gen))
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=gen))
                    m.running_var.copy_(1 + 0.1 * torch.rand(m.running_var.shape, generator=gen))
        for name, p in model.named_parameters():
            if "class_token" in name or "pos_embedding" in name:
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
    return model.eval()


class LastHidden(torch.nn.Module):
    """A transformers model that takes input_ids and returns last_hidden_state only.

    ``mask`` passes an all-ones attention_mask: without one GPT-2 looks for packed
    sequences with ``torch.diff``, which the TorchScript exporter cannot export."""

    def __init__(self, model: torch.nn.Module, *, mask: bool = False, **kwargs: object) -> None:
        super().__init__()
        self.model = model
        self.mask = mask
        self.kwargs = kwargs

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        extra = {"attention_mask": torch.ones_like(input_ids)} if self.mask else {}
        return self.model(input_ids=input_ids, **extra, **self.kwargs).last_hidden_state


def vision(name: str) -> Callable[[int], tuple[torch.nn.Module, torch.Tensor]]:
    def build(layers: int) -> tuple[torch.nn.Module, torch.Tensor]:
        import torchvision
        model = reinit(getattr(torchvision.models, name)(weights=None))
        return model, torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    return build


def bert(layers: int) -> tuple[torch.nn.Module, torch.Tensor]:
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=layers, attn_implementation="eager")
    model = LastHidden(BertModel(config, add_pooling_layer=False)).eval()
    ids = torch.randint(0, config.vocab_size, (1, SEQ), generator=torch.Generator().manual_seed(1))
    return model, ids


def gpt2(layers: int) -> tuple[torch.nn.Module, torch.Tensor]:
    from transformers import GPT2Config, GPT2Model
    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, attn_implementation="eager")
    model = LastHidden(GPT2Model(config), mask=True, use_cache=False).eval()
    ids = torch.randint(0, config.vocab_size, (1, SEQ), generator=torch.Generator().manual_seed(1))
    return model, ids


MODELS = {
    "resnet50": vision("resnet50"),
    "mobilenet_v3_small": vision("mobilenet_v3_small"),
    "efficientnet_b0": vision("efficientnet_b0"),
    "vit_b16": vision("vit_b_16"),
    "bert": bert,
    "gpt2": gpt2,
}
DEFAULT = list(MODELS)


def export(model: torch.nn.Module, x: torch.Tensor, path: str) -> None:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer warnings
        torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17,
                          input_names=["input"], output_names=["output"])


def ort_session(path: str, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    # A spinning pool thread would take a core from the runner timed after it.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:100]


def conv_flops(path: str) -> dict[str, tuple[str, float]]:
    """Each Conv node's name -> (its kernel size and map, e.g. '3x3 256->256 14x14', its flops)."""
    import onnx
    model = onnx.shape_inference.infer_shapes(onnx.load(path))
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in (*model.graph.value_info, *model.graph.output, *model.graph.input)}
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    out = {}
    for node in model.graph.node:
        if node.op_type == "Conv" and node.input[1] in weights and node.output[0] in shapes:
            f, c, kh, kw = weights[node.input[1]]
            n, _, h, w = shapes[node.output[0]]
            out[node.name] = (f"{kh}x{kw} {c}->{f} {h}x{w}", 2.0 * n * f * h * w * c * kh * kw)
    return out


def conv_table(name: str, path: str, compiled: object, feed: dict, threads: int) -> str:
    """The 3x3 convolutions' kernels (with what is fused into them): time, GFLOP/s and the
    fraction of the FMA peak measured on as many threads. A convolution run as Winograd's
    F(m x m, 3x3) is its three kernels (input transform, products, output transform and
    epilogue), its rate the direct convolution's flops over their time (an effective
    rate, which can pass the peak: the method does fewer multiplications). The peak is
    measured just before the profile runs."""
    peak = fma_peak(threads)
    flops = conv_flops(path)
    lines = [f"\n{name}: 3x3 convolutions, {threads} thread(s), FMA peak {peak:.0f} GFLOP/s",
             f"{'kernel':<44} | {'conv':<22} | {'ms':>6} | {'GFLOP/s':>7} | of peak | method"]
    spent: dict[str, float] = {}
    winograd: set[str] = set()
    for label, seconds in compiled.profile(feed, repeat=9):   # type: ignore[attr-defined]
        names = label.split("[", 1)[-1].rstrip("]").split()
        conv_of_part = names[0].rsplit("/winograd_", 1)[0]   # its input transform or products
        if len(names) == 1 and conv_of_part != names[0]:
            names = [conv_of_part]
            winograd.add(conv_of_part)
        conv = next((n for n in names if n in flops and flops[n][0].startswith("3x3")), None)
        if conv is not None:
            spent[conv] = spent.get(conv, 0.0) + seconds
    for conv, seconds in spent.items():
        shape, work = flops[conv]
        rate = work / seconds / 1e9
        method = "winograd" if conv in winograd else "direct"
        lines.append(f"{conv[:44]:<44} | {shape:<22} | {seconds * 1e3:6.3f} | {rate:7.1f} | "
                     f"{rate / peak:6.0%}  | {method}")
    return "\n".join(lines) if len(lines) > 2 else ""   # a model without 3x3 convolutions: nothing


AFTER: list[str] = []   # tables printed after the main one


def bench(name: str, layers: int, repeat: int, tmp: str, convs: bool = False) -> str:
    """One row of the table (and, with ``convs``, the table of its 3x3 convolutions)."""
    model, x = MODELS[name](layers)
    path = os.path.join(tmp, f"{name}.onnx")
    export(model, x, path)
    feed = {"input": x.numpy()}
    sessions = {"ort-1": ort_session(path, 1), "ort-2": ort_session(path, 2)}
    want = sessions["ort-2"].run(None, feed)[0]
    fns: dict[str, Callable[[], object]] = {f"{k}": (lambda s=s: s.run(None, feed)) for k, s in sessions.items()}

    def eager() -> object:
        with torch.no_grad():
            return model(x)
    fns["torch"] = eager

    note, compile_s = "", float("nan")
    try:
        t = time.perf_counter()
        compiled = pf.compile(path, target="host", input_shapes={"input": tuple(x.shape)})
        got = compiled.run(feed)["output"]
        compile_s = time.perf_counter() - t
        diff = float(np.max(np.abs(got - want)))
        note = f"max|d| {diff:.1e}"
        try:
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
        except AssertionError:
            note = f"MISMATCH max|d| {diff:.1e}"
        fns = {"pf": lambda: compiled.run(feed), **fns}
        if convs:
            from polyfuse.runtime import native
            AFTER.append(conv_table(name, path, compiled, feed, native.get_num_threads()))
    except Exception as e:  # noqa: BLE001 - a benchmark row, not a test: report and go on
        note = f"FAILED {first_line(e)}"
    times = interleaved_times(fns, rounds=repeat, calls=1)
    ms = {k: v * 1e3 for k, v in times.items()}
    pf_ms = ms.get("pf", float("nan"))
    return (f"{name:<18} | {compile_s:9.1f} | {pf_ms:11.2f} | {ms['ort-1']:8.2f} | {ms['ort-2']:8.2f} | "
            f"{ms['torch']:8.2f} | {ms['ort-2'] / pf_ms:8.2f} | {ms['torch'] / pf_ms:8.2f} | {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help=f"comma-separated, of {','.join(MODELS)}")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--layers", type=int, default=2, help="BERT and GPT-2 layers")
    parser.add_argument("--convs", action="store_true",
                        help="also list each model's 3x3 convolution kernels against the FMA peak")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or DEFAULT
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {','.join(MODELS)}")
    torch.set_num_threads(2)
    torch.backends.mha.set_fastpath_enabled(False)  # ViT's fused attention has no ONNX export
    print(f"{'model':<18} | {'compile s':>9} | {'polyfuse ms':>11} | {'ort-1 ms':>8} | {'ort-2 ms':>8} | "
          f"{'torch ms':>8} | {'ort-2/pf':>8} | {'torch/pf':>8} | check", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            try:
                row = bench(name, args.layers, args.repeat, tmp, args.convs)
            except Exception as e:  # noqa: BLE001 - export or baseline failed: report and go on
                row = f"{name:<18} | FAILED before polyfuse: {first_line(e)}"
            print(row, flush=True)
    for table in filter(None, AFTER):
        print(table)


if __name__ == "__main__":
    main()
