"""GPU check: the cuda tests, then TC's kernel set against PyTorch eager on the same GPU.

    python benchmarks/gpu_check.py [--skip-tests] [--repeat N] [--budget SECONDS]

On a machine with an NVIDIA GPU, from the repository root. It installs what is missing
with pip (polyfuse with its dev extra; torch for the comparison; on a machine without the
package index, the wheels in ``.whl/`` that ``benchmarks/gpu_wheels.sh`` downloads, then
polyfuse itself without build isolation), runs
``pytest -m cuda tests/cuda tests/torch/test_tensors.py``, then times each kernel of TC's benchmark set with its
inputs already on the GPU as torch tensors (so polyfuse copies nothing) and prints the
median time of polyfuse, of PyTorch eager (cuBLAS / cuDNN) and of ``torch.compile``
(inductor), and the ratio polyfuse / eager; every polyfuse result is checked against
PyTorch's. The set includes float32 matmul exact and on TF32 (``precision="tf32"``
against torch with ``allow_tf32``) and a bfloat16 matmul. Then whole models (an
attention block, ResNet-50 at batch 32, BERT-base at 8 x 128; random weights) exported to
ONNX and compiled for cuda, fed torch tensors on the GPU. Each stage has a time limit, and kernels
left when the budget (default 420 s for the whole script) runs out are reported as
skipped, so the check ends within 8 minutes. Without torch it still times polyfuse (numpy
inputs, copies included) and prints no ratio.
"""

from __future__ import annotations

import argparse
import importlib
import math
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
START = time.monotonic()


def elapsed() -> float:
    return time.monotonic() - START


def ensure(module: str, requirement: list[str], timeout: float) -> bool:
    """Import ``module``, pip-installing ``requirement`` first when it is missing."""
    try:
        importlib.import_module(module)
        return True
    except ImportError:
        pass
    print(f"[{elapsed():5.0f}s] pip install {' '.join(requirement)}", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *requirement], cwd=ROOT,
                       timeout=timeout, check=True)
    except (subprocess.SubprocessError, OSError) as err:
        print(f"  could not install: {err}")
        return False
    importlib.invalidate_caches()
    try:
        importlib.import_module(module)
        return True
    except ImportError as err:
        print(f"  installed but cannot import {module}: {err}")
        return False


def install_offline_wheels() -> bool:
    """Install the wheels in ``.whl/`` (``benchmarks/gpu_wheels.sh`` downloads them on a
    machine with the package index, for a GPU machine without one); whether there were any."""
    wheels = sorted((ROOT / ".whl").glob("*.whl"))
    if wheels:
        print(f"[{elapsed():5.0f}s] pip install {len(wheels)} wheels from .whl/", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        *map(str, wheels)], cwd=ROOT, check=False)
    return bool(wheels)


def run_tests(timeout: float) -> None:
    print(f"[{elapsed():5.0f}s] pytest -m cuda tests/cuda tests/torch/test_tensors.py", flush=True)
    try:
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "tests/cuda",
                                 "tests/torch/test_tensors.py", "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True,
                                text=True, timeout=timeout)
        lines = (result.stdout + result.stderr).strip().splitlines()
        failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
        print("\n".join(failures[:30] + lines[-1:]))
    except subprocess.TimeoutExpired:
        print(f"  the GPU tests did not finish in {timeout:.0f} s")


@dataclass(frozen=True)
class Case:
    label: str
    program: str                         # a canonical program of tests/tc_programs.py
    shapes: tuple[tuple[int, ...], ...]  # of its tensor inputs
    torch: Callable[..., object]         # the same result with PyTorch eager
    scalars: tuple[float, ...] = ()
    flops: float = 0.0
    precision: str = "ieee"              # define's precision; "tf32": torch's allow_tf32 too
    dtype: str = "float32"               # of the inputs: the program's float types become it

    def kernel(self, target: str = "cuda"):  # noqa: ANN201
        """The program's kernel, its tensors of ``dtype``, at ``precision``."""
        import polyfuse as pf
        from tests.tc_programs import PROGRAMS_BY_NAME
        program = PROGRAMS_BY_NAME[self.program]
        source = program.source if self.dtype == "float32" else program.source.replace("float(", f"{self.dtype}(")
        return getattr(pf.define(source, target=target, precision=self.precision), program.entry)

    @property
    def tolerance(self) -> float:
        """Of the results against torch's: products on TF32 or bfloat16 round their operands."""
        return 2e-3 if self.precision == "ieee" and self.dtype == "float32" else 2e-2


def _cases() -> list[Case]:
    import torch
    import torch.nn.functional as F

    def group_conv(i, w):
        n, g, c, h, wd = i.shape
        _, f, _, kh, kw = w.shape
        out = F.conv2d(i.reshape(n, g * c, h, wd), w.reshape(g * f, c, kh, kw), groups=g)
        return out.reshape(n, g, f, out.shape[-2], out.shape[-1])

    def kru3(x, w2, w1, w0):
        xw2 = torch.einsum("mabc,zc->mabz", x, w2)
        xw21 = torch.einsum("mabz,yb->mayz", xw2, w1)
        return xw2, xw21, torch.einsum("mayz,xa->mxyz", xw21, w0)

    def mlp3(i, w1, b1, w2, b2, w3, b3):
        o1 = torch.relu(F.linear(i, w1, b1))
        o2 = torch.relu(F.linear(o1, w2, b2))
        return o1, o2, torch.relu(F.linear(o2, w3, b3))

    def softmax(x):
        return torch.softmax(x, dim=1), x.amax(dim=1), torch.exp(x - x.amax(dim=1, keepdim=True)).sum(1)

    def layernorm(x, gamma, beta, eps):
        mean, var = x.mean(dim=1), x.var(dim=1, unbiased=False)
        return F.layer_norm(x, x.shape[1:], gamma, beta, eps), mean, var

    return [
        Case("matmul 4096^3", "matmul", ((4096, 4096), (4096, 4096)), lambda a, b: a @ b,
             flops=2 * 4096**3),
        Case("matmul 4096^3 tf32", "matmul", ((4096, 4096), (4096, 4096)), lambda a, b: a @ b,
             flops=2 * 4096**3, precision="tf32"),
        Case("matmul 8192^3 bfloat16", "matmul", ((8192, 8192), (8192, 8192)), lambda a, b: a @ b,
             flops=2 * 8192**3, dtype="bfloat16"),
        Case("tmm 128x1024x1024", "matmul_transposed", ((1024, 128), (1024, 1024)),
             lambda a, b: a.T @ b.T, flops=2 * 128 * 1024 * 1024),
        Case("tmm 128x16384x4096", "matmul_transposed", ((4096, 128), (16384, 4096)),
             lambda a, b: a.T @ b.T, flops=2 * 128 * 16384 * 4096),
        Case("bmm 500x26x72x26", "batch_matmul", ((500, 26, 72), (500, 72, 26)), torch.bmm,
             flops=2 * 500 * 26 * 72 * 26),
        Case("group conv 32x32x16x56x56 3x3", "group_conv", ((32, 32, 16, 56, 56), (32, 16, 16, 3, 3)),
             group_conv, flops=2 * 32 * 32 * 16 * 54 * 54 * 16 * 9),
        Case("kronecker3 256x16^3", "kronecker3", ((256, 16, 16, 16), (16, 16), (16, 16), (16, 16)),
             kru3, flops=3 * 2 * 256 * 16**4),
        Case("fc+relu mlp3 128x1024", "mlp3",
             ((128, 1024), (1024, 1024), (1024,), (512, 1024), (512,), (256, 512), (256,)), mlp3,
             flops=2 * 128 * (1024 * 1024 + 1024 * 512 + 512 * 256)),
        Case("softmax 16384x1024", "softmax", ((16384, 1024),), softmax),
        Case("layernorm 16384x1024", "layernorm", ((16384, 1024), (1024,), (1024,)), layernorm,
             scalars=(1e-5,)),
    ]


def median_seconds(fn: Callable[[], object], repeat: int, sync: Callable[[], None]) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def benchmark(repeat: int, budget: float) -> list[list[str]]:
    import torch

    import polyfuse as pf

    rows = []
    for case in _cases():
        if elapsed() > budget:
            rows.append([case.label, "-", "-", "-", "-", "skipped (time budget)"])
            continue
        kernel = case.kernel()
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = case.precision == "tf32"
        gen = torch.Generator(device="cuda").manual_seed(0)
        inputs = [(torch.rand(s, device="cuda", generator=gen) - 0.5).to(getattr(torch, case.dtype))
                  for s in case.shapes]
        args = [*inputs, *case.scalars]
        try:
            t = time.perf_counter()
            got = kernel(*args)
            first = time.perf_counter() - t
            ours = median_seconds(lambda: kernel(*args), repeat, torch.cuda.synchronize)
        except pf.PolyfuseError as err:
            rows.append([case.label, "-", "-", "-", "-", f"error: {str(err).splitlines()[0][:60]}"])
            continue
        want = case.torch(*args)
        theirs = median_seconds(lambda: case.torch(*args), repeat, torch.cuda.synchronize)
        inductor = inductor_seconds(case.torch, args, repeat, budget * 0.6)
        got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
        ok = all(torch.allclose(g.float(), w.float(), rtol=case.tolerance, atol=case.tolerance)
                 for g, w in zip(got, want))
        rate = f" {case.flops / ours / 1e12:.2f} TFLOP/s" if case.flops else ""
        rows.append([case.label, f"{ours * 1e3:.3f}", f"{theirs * 1e3:.3f}",
                     f"{inductor * 1e3:.3f}" if inductor else "-", f"{ours / theirs:.2f}",
                     ("ok" if ok else "MISMATCH") + rate + f" (first call {first:.1f} s)"])
        print(f"[{elapsed():5.0f}s] {' | '.join(rows[-1])}", flush=True)
    return rows


def inductor_seconds(fn: Callable[..., object], args: list, repeat: int, budget: float) -> float | None:
    """The median of ``torch.compile(fn)`` (inductor) on ``args``, or None when the budget
    is spent or inductor cannot compile it here."""
    import torch
    if elapsed() > budget:
        return None
    try:
        compiled = torch.compile(fn)
        compiled(*args)
        return median_seconds(lambda: compiled(*args), repeat, torch.cuda.synchronize)
    except Exception as err:   # inductor needs triton and a C compiler: say so, go on
        print(f"  inductor: {type(err).__name__}: {str(err).splitlines()[0][:80]}", flush=True)
        return None


def _attention(width: int = 768, heads: int = 12):  # noqa: ANN202
    """A pre-norm transformer block (self-attention, then an MLP, each with a residual)."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
            self.qkv, self.out = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
            self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

        def forward(self, x):  # noqa: ANN001, ANN202
            b, t, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).reshape(b, t, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(width // heads), dim=-1)
            x = x + self.out((att @ v).transpose(1, 2).reshape(b, t, width))
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))
    return Block()


def _resnet50():  # noqa: ANN202
    import torchvision
    return torchvision.models.resnet50(weights=None)


def _bert_base():  # noqa: ANN202
    import torch
    import transformers
    config = transformers.BertConfig(attn_implementation="eager")
    bert = transformers.BertModel(config, add_pooling_layer=False)

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask):  # noqa: ANN001, ANN202
            return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state
    return Encoder()


def model_cases() -> list[tuple[str, Callable[[], object], Callable[[], list]]]:
    """Whole models: label, the torch module (random weights), its inputs (on the GPU)."""
    import torch

    def images() -> list:
        return [torch.randn(32, 3, 224, 224, device="cuda")]

    def tokens() -> list:
        return [torch.randint(0, 30522, (8, 128), device="cuda"), torch.ones(8, 128, dtype=torch.int64, device="cuda")]
    return [("attention block 8x128x768", _attention, lambda: [torch.randn(8, 128, 768, device="cuda")]),
            ("ResNet-50 batch 32", _resnet50, images),
            ("BERT-base 8x128", _bert_base, tokens)]


def benchmark_models(repeat: int, budget: float) -> list[list[str]]:
    """Each whole model exported to ONNX and compiled for cuda, fed torch tensors on the
    GPU (results stay there), against torch eager and inductor; checked against eager."""
    import tempfile

    import torch

    import polyfuse as pf
    rows = []
    for label, build, make_inputs in model_cases():
        if elapsed() > budget:
            rows.append([label, "-", "-", "-", "-", "skipped (time budget)"])
            continue
        try:
            module = build().cuda().eval()
        except ImportError as err:
            rows.append([label, "-", "-", "-", "-", f"skipped ({err})"])
            continue
        inputs = make_inputs()
        with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
            path = f"{tmp}/model.onnx"
            names = [f"in{k}" for k in range(len(inputs))]
            torch.onnx.export(module, tuple(inputs), path, input_names=names, output_names=["out"], dynamo=False)
            t = time.perf_counter()
            compiled = pf.compile(path, target="cuda")
            feed = dict(zip(names, inputs))
            try:
                got = compiled.run(feed)["out"]
            except pf.PolyfuseError as err:
                rows.append([label, "-", "-", "-", "-", f"error: {str(err).splitlines()[0][:60]}"])
                continue
            first = time.perf_counter() - t
            ours = median_seconds(lambda: compiled.run(feed), repeat, torch.cuda.synchronize)
            want = module(*inputs)
            theirs = median_seconds(lambda: module(*inputs), repeat, torch.cuda.synchronize)
            inductor = inductor_seconds(module, inputs, repeat, budget)
        ok = torch.allclose(torch.as_tensor(got).float(), want.float(), rtol=1e-2, atol=1e-2)
        rows.append([label, f"{ours * 1e3:.3f}", f"{theirs * 1e3:.3f}",
                     f"{inductor * 1e3:.3f}" if inductor else "-", f"{ours / theirs:.2f}",
                     ("ok" if ok else "MISMATCH") + f" (compile + first call {first:.1f} s)"])
        print(f"[{elapsed():5.0f}s] {' | '.join(rows[-1])}", flush=True)
    return rows


def benchmark_without_torch(repeat: int, budget: float) -> list[list[str]]:
    """polyfuse alone, numpy in and out (each call copies its inputs and outputs)."""
    import polyfuse as pf
    from tests.tc_programs import PROGRAMS_BY_NAME

    rows = []
    for label, name, shapes in [("matmul 2048^3", "matmul", ((2048, 2048), (2048, 2048))),
                                ("softmax 4096x1024", "softmax", ((4096, 1024),))]:
        if elapsed() > budget:
            break
        program = PROGRAMS_BY_NAME[name]
        kernel = getattr(pf.define(program.source, target="cuda"), program.entry)
        rng = np.random.default_rng(0)
        args = [rng.uniform(-0.5, 0.5, s).astype(np.float32) for s in shapes]
        ours = median_seconds(lambda: kernel(*args), repeat, lambda: None)
        rows.append([label, f"{ours * 1e3:.3f}", "-", "-", "-", "numpy in/out, copies included"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--budget", type=float, default=420.0, help="seconds for the whole script")
    args = parser.parse_args()
    offline = install_offline_wheels()   # no package index: install polyfuse alone
    requirement = ["--no-build-isolation", "--no-deps", "-e", "."] if offline else ["-e", ".[dev]"]
    if not ensure("polyfuse", requirement, timeout=150) or \
            not ensure("cuda.bindings.nvrtc", ["cuda-python==13.0.3", "nvidia-cuda-nvrtc==13.0.88"], 120):
        sys.exit("polyfuse or cuda-python is not importable")
    from polyfuse.targets.cuda_driver import available_device
    gpu = available_device()
    if gpu is None:
        sys.exit("no NVIDIA GPU and driver here: nothing to check on a GPU")
    print(f"device: {gpu.name} ({gpu.limits.arch}, {gpu.limits.shared_bytes // 1024} KiB shared "
          "memory per block)")
    if not args.skip_tests:
        run_tests(timeout=max(30.0, min(240.0, args.budget / 2 - elapsed())))
    has_torch = ensure("torch", ["torch"], timeout=max(10.0, min(150.0, args.budget - 120 - elapsed())))
    if has_torch:
        import torch
        has_torch = torch.cuda.is_available()
    if has_torch:
        kernels = benchmark(args.repeat, args.budget * 0.6)
        rows = kernels + benchmark_models(args.repeat, args.budget)
    else:
        kernels = rows = benchmark_without_torch(args.repeat, args.budget)
    header = ["kernel", "polyfuse ms", "torch ms", "inductor ms", "ratio", "notes"]
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]
    print()
    for r in [header, ["-" * w for w in widths], *rows]:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths)))
    ratios = [float(r[4]) for r in kernels if r[4] not in ("-", "")]
    if ratios:
        print(f"geometric mean ratio over the kernels (polyfuse / torch; lower is better): "
              f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}")
    print(f"done in {elapsed():.0f} s")


if __name__ == "__main__":
    main()
