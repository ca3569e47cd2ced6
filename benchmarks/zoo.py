"""A zoo of architectures nobody tuned for: polyfuse against onnxruntime and OpenVINO.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/zoo.py \\
        [--only resnet50,bert] [--threads 2,1] [--repeat 20] [--reexport]

Unset the OpenBLAS variables for the run: they change the BLAS under numpy and torch,
and so the baselines. Needs torch, torchvision, transformers, onnxruntime and openvino;
nothing is downloaded, every model has random weights.

Vision models from torchvision (``weights=None``; convolution and linear weights drawn
again at He scale, batch-norm scales random and their statistics measured on random
data, so no head or residual branch starts at zero) and encoders and a decoder from
``transformers`` configs (their own random initialization), chosen for their op
patterns: residual, dense, grouped, depthwise, shuffled, squeeze-excite, windowed and
global attention, relative position bias, 1-d convolutions, a segmentation head and a
detection backbone (its five feature maps are the outputs). Each is exported once with
``torch.onnx.export(dynamo=False, opset_version=17)`` into ``--cache`` and reused from
there (``--reexport`` exports again).

Per model: polyfuse is compiled cold (a fresh, empty ``POLYFUSE_CACHE_DIR`` and no
kernel in memory; compile s includes the first run, where kernels are built; one
compile serves every thread count), OpenVINO
is compiled for each thread count (float32 precision hint, latency mode; compile s is
``read_model`` and ``compile_model``), onnxruntime gets ``intra_op_num_threads`` = N,
one inter-op thread, sequential execution. The runtimes are timed in turn, ``ROUNDS``
short blocks each (this host's speed drifts over seconds, benchmarks/LOG.md), each
block after a pause and a warm-up call (:func:`models.fresh_times`: spinning pools slow
whoever runs next on few cores), a new input for every call; a runtime's time is the
median of its ``--repeat`` calls. polyfuse and OpenVINO outputs are checked against onnxruntime's: err is
max|got - want| / max|want| over the outputs, and a value outside rtol 1e-3, atol
1e-3 max|want| is marked MISMATCH. ratio = the faster of onnxruntime and OpenVINO /
polyfuse (> 1: polyfuse faster). A runtime that fails shows its error's class in its
cell, listed with its message under the table, and the run goes on.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(1, str(ROOT))   # polyfuse and tests/ from this checkout
# benchmarks/ is on sys.path here; real_models takes it off (it shadows a package of
# transformers), so models goes first
from models import fresh_times  # noqa: E402
from real_models import LastHidden, export, first_line, reinit  # noqa: E402

import torch  # noqa: E402 - after real_models, which sets torch's OpenMP wait policy
from tests.torch.models import calibrated  # noqa: E402

import polyfuse as pf  # noqa: E402
from polyfuse.runtime import cpu, native, saved_programs  # noqa: E402

RTOL = 1e-3


@dataclass(frozen=True)
class Input:
    """The model's one input, named ``input``: float32 normal, or token ids below ``vocab``."""
    shape: tuple[int, ...]
    vocab: int = 0

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        if self.vocab:
            return rng.integers(0, self.vocab, self.shape, dtype=np.int64)
        return rng.standard_normal(self.shape, dtype=np.float32)


@dataclass(frozen=True)
class Entry:
    build: Callable[[], torch.nn.Module]
    input: Input


class Outputs(torch.nn.Module):
    """A model whose dict of outputs (segmentation, a detection backbone) becomes a tuple."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.model(x).values())


class Hidden(torch.nn.Module):
    """A transformers model fed float ``argument`` (pixels, audio), returning last_hidden_state."""

    def __init__(self, model: torch.nn.Module, argument: str) -> None:
        super().__init__()
        self.model = model
        self.argument = argument

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(**{self.argument: x}).last_hidden_state


IMAGE = Input((1, 3, 224, 224))
TOKENS = 128   # sequence length of the text models


def vision(make: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    """``make``'s model at sensible scales: He-scale weights, live layer scales, and
    batch-norm statistics of random 224x224 images."""
    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        model = reinit(make())
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("layer_scale"):   # ConvNeXt's start at 1e-6: blocks near identity
                    p.fill_(0.5)
        return calibrated(model, torch.zeros(IMAGE.shape))
    return build


def torchvision_model(name: str, **kwargs: object) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        import torchvision
        return getattr(torchvision.models, name)(weights=None, **kwargs)
    return vision(make)


def deeplab() -> torch.nn.Module:
    from torchvision.models.segmentation import deeplabv3_mobilenet_v3_large
    return Outputs(deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, aux_loss=False))


def fpn_backbone() -> torch.nn.Module:
    from torchvision.models.detection import fasterrcnn_resnet50_fpn
    return Outputs(fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None).backbone)


def text(config_class: str, model_class: str, **kwargs: object) -> Callable[[], torch.nn.Module]:
    """A transformers model of the default config, fed token ids."""
    def build() -> torch.nn.Module:
        import transformers
        torch.manual_seed(0)
        config = getattr(transformers, config_class)(attn_implementation="eager")
        return LastHidden(getattr(transformers, model_class)(config), **kwargs).eval()
    return build


def floats(config_class: str, model_class: str, argument: str, **kwargs: object) -> Callable[[], torch.nn.Module]:
    """A transformers model of the default config, fed pixels or audio."""
    def build() -> torch.nn.Module:
        import transformers
        torch.manual_seed(0)
        config = getattr(transformers, config_class)(attn_implementation="eager")
        return Hidden(getattr(transformers, model_class)(config, **kwargs), argument).eval()
    return build


def vocab(config_class: str) -> int:
    import transformers
    return int(getattr(transformers, config_class)().vocab_size)


def zoo() -> dict[str, Entry]:
    tv = torchvision_model
    return {
        "resnet50": Entry(tv("resnet50"), IMAGE),                          # residual bottlenecks
        "resnext50_32x4d": Entry(tv("resnext50_32x4d"), IMAGE),            # grouped 3x3, 32 groups
        "regnet_y_400mf": Entry(tv("regnet_y_400mf"), IMAGE),              # grouped (width 8) + SE
        "densenet121": Entry(tv("densenet121"), IMAGE),                    # concatenation chains
        "googlenet": Entry(tv("googlenet", aux_logits=False, init_weights=False), IMAGE),      # inception branches
        "squeezenet1_1": Entry(tv("squeezenet1_1"), IMAGE),                # fire modules, no BN
        "mobilenet_v2": Entry(tv("mobilenet_v2"), IMAGE),                  # depthwise, ReLU6
        "mobilenet_v3_small": Entry(tv("mobilenet_v3_small"), IMAGE),      # depthwise, SE, hardswish
        "mnasnet1_0": Entry(tv("mnasnet1_0"), IMAGE),                      # depthwise 5x5
        "efficientnet_b0": Entry(tv("efficientnet_b0"), IMAGE),            # SiLU, SE
        "shufflenet_v2_x1_0": Entry(tv("shufflenet_v2_x1_0"), IMAGE),      # split, channel shuffle
        "convnext_tiny": Entry(tv("convnext_tiny"), IMAGE),                # depthwise 7x7, LayerNorm, GELU
        "vit_b_16": Entry(tv("vit_b_16"), IMAGE),                          # global attention
        "swin_t": Entry(tv("swin_t"), IMAGE),                              # shifted-window attention
        "deeplabv3_mobilenet": Entry(vision(deeplab), IMAGE),              # dilated convs, ASPP, resize
        "fasterrcnn_fpn_backbone": Entry(vision(fpn_backbone), IMAGE),     # FPN: upsample + add, 5 outputs
        "bert": Entry(text("BertConfig", "BertModel"), Input((1, TOKENS), vocab("BertConfig"))),
        "distilbert": Entry(text("DistilBertConfig", "DistilBertModel"),
                            Input((1, TOKENS), vocab("DistilBertConfig"))),
        "t5_encoder": Entry(text("T5Config", "T5EncoderModel"),           # RMSNorm, relative bias
                            Input((1, TOKENS), vocab("T5Config"))),
        "gpt2": Entry(text("GPT2Config", "GPT2Model", mask=True, use_cache=False),   # causal decoder
                      Input((1, TOKENS), vocab("GPT2Config"))),
        "vit_hf": Entry(floats("ViTConfig", "ViTModel", "pixel_values", add_pooling_layer=False), IMAGE),
        "wav2vec2": Entry(floats("Wav2Vec2Config", "Wav2Vec2Model", "input_values"),   # conv1d + encoder
                          Input((1, 16000))),
    }


@dataclass
class Row:
    """One model at one thread count: a float per measurement, or the failure's class."""
    ms: dict[str, float | str] = field(default_factory=dict)        # runtime -> median ms
    compile_s: dict[str, float | str] = field(default_factory=dict)
    err: dict[str, float | str] = field(default_factory=dict)


RUNTIMES = ("ort", "ov", "pf")
ROUNDS = 4    # blocks of calls per runtime, in turn
FAILURES: list[str] = []   # "model runtime: Class: message", printed under the tables


def failed(model: str, what: str, e: BaseException) -> str:
    FAILURES.append(f"{model} {what}: {first_line(e)}")
    return type(e).__name__


def exported(name: str, entry: Entry, cache: Path, again: bool) -> Path:
    path = cache / f"{name}.onnx"
    if again or not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        model = entry.build()
        partial = cache / f"{name}.partial.onnx"
        export(model, torch.zeros(entry.input.shape, dtype=torch.int64 if entry.input.vocab else torch.float32),
               str(partial))
        os.replace(partial, path)
    return path


def polyfuse_cold(path: Path, entry: Entry, feed: dict[str, np.ndarray]) -> tuple[object, float]:
    """The model compiled with no kernel on disk or in memory, and the seconds to its first result."""
    previous = os.environ.get("POLYFUSE_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="polyfuse-zoo-") as cache:
        os.environ["POLYFUSE_CACHE_DIR"] = cache
        cpu._COMPILED.clear()   # kernels of the models before, which this one may share
        try:
            t = time.perf_counter()
            model = pf.compile(str(path), target="host", input_shapes={"input": entry.input.shape})
            model.run(feed)
            return model, time.perf_counter() - t
        finally:
            saved_programs.flush()   # (its saves into the folder, before the folder goes)
            if previous is None:
                del os.environ["POLYFUSE_CACHE_DIR"]
            else:
                os.environ["POLYFUSE_CACHE_DIR"] = previous


def ort_session(path: Path, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def openvino_model(path: Path, threads: int) -> tuple[Callable[[dict], list[np.ndarray]], float]:
    """A function from a feed to OpenVINO's outputs, and the seconds to read and compile."""
    import openvino as ov
    t = time.perf_counter()
    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(path)), "CPU", {
        "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads})
    seconds = time.perf_counter() - t
    request = compiled.create_infer_request()
    outputs = compiled.outputs

    def run(feed: dict) -> list[np.ndarray]:
        result = request.infer(feed, share_inputs=True)
        return [result[o] for o in outputs]
    return run, seconds


def error(got: list[np.ndarray], want: list[np.ndarray]) -> float | str:
    """max|got - want| / max|want| over the outputs, or MISMATCH with it when outside tolerance."""
    worst, bad = 0.0, False
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g.shape != w.shape:
            return f"shape {g.shape} != {w.shape}"
        scale = float(np.abs(w).max()) if w.size else 0.0
        diff = np.abs(g - w)
        worst = max(worst, float(diff.max()) / (scale or 1.0) if w.size else 0.0)
        bad |= bool(np.any(diff > RTOL * np.abs(w) + RTOL * scale)) or not np.all(np.isfinite(g))
    return f"MISMATCH {worst:.1e}" if bad else worst


Runner = Callable[[dict], list[np.ndarray]]


def bench(name: str, entry: Entry, threads: list[int], repeat: int, cache: Path, again: bool) -> dict[int, Row]:
    """The model's row at each thread count; a runtime that fails leaves its error's class."""
    rows = {n: Row() for n in threads}
    try:
        path = exported(name, entry, cache, again)
    except Exception as e:  # noqa: BLE001 - a benchmark row, not a test: report and go on
        cls = failed(name, "export", e)
        for row in rows.values():
            row.ms = {r: f"export: {cls}" for r in RUNTIMES}
        return rows
    rng = np.random.default_rng(1)
    feeds = [{"input": entry.input.draw(rng)} for _ in range(repeat + 1)]   # a new input every call
    pf_run: Runner | str
    try:
        compiled, pf_compile = polyfuse_cold(path, entry, feeds[0])
        pf_run = lambda f: list(compiled.run(f).values())   # noqa: E731 - in the graph's order
    except Exception as e:  # noqa: BLE001
        pf_run = pf_compile = failed(name, "polyfuse compile", e)
    for n, row in rows.items():
        runs: dict[str, Runner | str] = {"pf": pf_run}
        row.compile_s["pf"] = pf_compile
        try:
            session = ort_session(path, n)
            runs["ort"] = lambda f, s=session: s.run(None, f)
        except Exception as e:  # noqa: BLE001
            runs["ort"] = failed(name, f"onnxruntime {n}T", e)
        try:
            runs["ov"], row.compile_s["ov"] = openvino_model(path, n)
        except Exception as e:  # noqa: BLE001
            runs["ov"] = row.compile_s["ov"] = failed(name, f"OpenVINO {n}T", e)
        native.set_num_threads(n)
        measure(name, n, row, runs, feeds)
    return rows


def measure(name: str, threads: int, row: Row, runs: dict[str, Runner | str], feeds: list[dict]) -> None:
    """Check each runtime against onnxruntime on the first feed, then time the runtimes
    in turn, ``ROUNDS`` short blocks each (this host's speed drifts over seconds:
    benchmarks/LOG.md), each runtime's time the median of all its calls."""
    want = None
    times: dict[str, list[float]] = {}
    for runtime in RUNTIMES:
        run = runs[runtime]
        if isinstance(run, str):
            row.ms[runtime] = run
            continue
        try:
            got = run(feeds[0])
            if runtime == "ort":
                want = got
            elif want is not None:
                row.err[runtime] = error(got, want)
            times[runtime] = []
        except Exception as e:  # noqa: BLE001
            row.ms[runtime] = failed(name, f"{runtime} {threads}T run", e)
    per_block = max(1, (len(feeds) - 1) // ROUNDS)
    for k in range(ROUNDS):
        block = feeds[k * per_block:(k + 1) * per_block + 1]
        for runtime in list(times):
            try:
                times[runtime] += fresh_times(runs[runtime], block)  # type: ignore[arg-type]
            except Exception as e:  # noqa: BLE001
                row.ms[runtime] = failed(name, f"{runtime} {threads}T run", e)
                del times[runtime]
    for runtime, samples in times.items():
        row.ms[runtime] = statistics.median(samples) * 1e3
    print(f"{name} {threads}T: " + ", ".join(f"{k} {cell(v)}" for k, v in row.ms.items())
          + "".join(f", {k} err {cell(v, 1)}" for k, v in row.err.items()), file=sys.stderr, flush=True)


def cell(value: float | str | None, digits: int = 0) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if digits:
        return f"{value:.{digits}e}"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def ratio(row: Row) -> float | None:
    base = [v for k, v in row.ms.items() if k != "pf" and isinstance(v, float)]
    pf_ms = row.ms.get("pf")
    return min(base) / pf_ms if base and isinstance(pf_ms, float) else None


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def table(rows: dict[str, Row], threads: int) -> str:
    lines = [f"### {threads} thread{'s' if threads > 1 else ''}", "",
             "| model | ort ms | OpenVINO ms | polyfuse ms | ratio | polyfuse compile s | OpenVINO compile s "
             "| polyfuse err | OpenVINO err |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, row in rows.items():
        r = ratio(row)
        lines.append(f"| {name} | {cell(row.ms.get('ort'))} | {cell(row.ms.get('ov'))} | {cell(row.ms.get('pf'))} "
                     f"| {'' if r is None else f'{r:.2f}'} | {cell(row.compile_s.get('pf'))} "
                     f"| {cell(row.compile_s.get('ov'))} | {cell(row.err.get('pf'), 1)} "
                     f"| {cell(row.err.get('ov'), 1)} |")
    full = [row for row in rows.values() if all(isinstance(row.ms.get(k), float) for k in RUNTIMES)]
    if full:
        means = {k: geomean([row.ms[k] for row in full]) for k in RUNTIMES}   # type: ignore[misc]
        compiles = {k: [row.compile_s[k] for row in full if isinstance(row.compile_s.get(k), float)] for k in ("pf", "ov")}
        lines.append(f"| geometric mean ({len(full)} models) | {cell(means['ort'])} | {cell(means['ov'])} "
                     f"| {cell(means['pf'])} | {geomean([ratio(row) for row in full]):.2f} "   # type: ignore[misc]
                     f"| {cell(geomean(compiles['pf'])) if compiles['pf'] else ''} "
                     f"| {cell(geomean(compiles['ov'])) if compiles['ov'] else ''} | | |")
    return "\n".join(lines)


def machine() -> str:
    """The CPU as lscpu names it, its cores and caches, and the runtimes' versions."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    info = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}
    flags = set(info.get("Flags", "").split())
    isa = "amx" if "amx_tile" in flags else "avx512f" if "avx512f" in flags else "avx2" if "avx2" in flags else "-"
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    import openvino
    return (f"machine: {info.get('Model name', '?')}, {info.get('CPU(s)', '?')} CPUs "
            f"({info.get('Core(s) per socket', '?')} cores/socket x {info.get('Socket(s)', '?')}, "
            f"{info.get('Thread(s) per core', '?')} thread/core), {isa}, L1d {info.get('L1d cache', '?')}, "
            f"L2 {info.get('L2 cache', '?')}, L3 {info.get('L3 cache', '?')}\n"
            f"polyfuse {commit or '?'}, onnxruntime {ort.__version__}, openvino {openvino.__version__}, "
            f"torch {torch.__version__}; {datetime.date.today()}")


def main() -> None:
    entries = zoo()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help=f"comma-separated, of {','.join(entries)}")
    parser.add_argument("--threads", default="2,1", help="comma-separated thread counts")
    parser.add_argument("--repeat", type=int, default=20, help="timed calls per runtime, after one warm-up")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "polyfuse-zoo",
                        help="where the exported ONNX models are kept")
    parser.add_argument("--reexport", action="store_true", help="export again even when cached")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(entries)
    unknown = [n for n in names if n not in entries]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {','.join(entries)}")
    threads = [int(n) for n in args.threads.split(",") if n]
    if args.repeat < 1 or not threads or min(threads) < 1:
        parser.error("--repeat and every --threads count must be at least 1")
    torch.set_num_threads(max(threads))
    torch.backends.mha.set_fastpath_enabled(False)  # ViT's fused attention has no ONNX export
    print(machine(), flush=True)
    results = {name: bench(name, entries[name], threads, args.repeat, args.cache, args.reexport) for name in names}
    for n in threads:
        print("\n" + table({name: rows[n] for name, rows in results.items()}, n))
    if FAILURES:
        print("\nfailures:\n" + "\n".join(f"- {f}" for f in FAILURES))


if __name__ == "__main__":
    main()
