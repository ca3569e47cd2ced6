"""int8 and bf16 against float32: polyfuse's quantized models, its bfloat16 products,
polyfuse float32 and onnxruntime's ``quantize_static`` model, in one process.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/quantized.py \\
        [--only resnet50,mobilenet_v2,bert] [--repeat 9] [--layers 2] [--samples 32]

Needs ``pip install torch torchvision transformers`` (nothing is downloaded: the models
are those of ``real_models.py``, with random weights, exported the same way). Each
model is calibrated on ``--samples`` random inputs: polyfuse profiles its float
tensors (``CompiledModel.profile_ranges``) and compiles with ``precision="int8"``
(min-max calibration, int8 weights per output channel); onnxruntime's
``quantize_static`` (QDQ, per channel, uint8 activations, int8 weights) reads the same
inputs. On one more random input, the table gives the medians of ``--repeat``
interleaved runs (onnxruntime with 2 intra-op threads), and each int8 result's cosine
similarity to polyfuse's float32 output and its agreement on the top-1 class (for
BERT, on each token's largest hidden feature). The bf16 columns are the float model
compiled with ``precision="bf16"`` (products by constant weights on bfloat16 operands,
float32 sums; no calibration).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from real_models import MODELS, bert, export, first_line, ort_session, vision
from timing import interleaved_times

import polyfuse as pf

QUANTIZED_MODELS = {"resnet50": MODELS["resnet50"], "mobilenet_v2": vision("mobilenet_v2"), "bert": bert}


def random_inputs(x: torch.Tensor, count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """``count`` feeds like ``x``: normal images, or token ids below x's largest bound."""
    rng = np.random.default_rng(seed)
    if x.dtype == torch.int64:
        return [{"input": rng.integers(0, 30000, tuple(x.shape), dtype=np.int64)} for _ in range(count)]
    return [{"input": rng.normal(0, 1, tuple(x.shape)).astype(np.float32)} for _ in range(count)]


class Reader(CalibrationDataReader):
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.feeds, None)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def top1(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(a.argmax(-1) == b.argmax(-1)))


def bench(name: str, layers: int, repeat: int, samples: int, tmp: str) -> str:
    model, x = QUANTIZED_MODELS[name](layers)
    path, qdq = os.path.join(tmp, f"{name}.onnx"), os.path.join(tmp, f"{name}.qdq.onnx")
    export(model, x, path)
    calibration = random_inputs(x, samples, seed=1)
    feed = random_inputs(x, 1, seed=2)[0]
    shapes = {"input": tuple(x.shape)}
    t = time.perf_counter()
    f32 = pf.compile(path, target="host", input_shapes=shapes)
    profile = f32.profile_ranges(calibration)
    profile_s = time.perf_counter() - t
    t = time.perf_counter()
    int8 = pf.compile(path, target="host", input_shapes=shapes, precision="int8", profile=profile)
    int8.run(feed)
    compile_s = time.perf_counter() - t
    bf16 = pf.compile(path, target="host", input_shapes=shapes, precision="bf16")
    quantize_static(path, qdq, Reader(calibration), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    session = ort_session(qdq, 2)
    want = f32.run(feed)["output"]
    got, ort_got = int8.run(feed)["output"], session.run(None, feed)[0]
    bf16_got = bf16.run(feed)["output"]
    fns: dict[str, Callable[[], object]] = {"f32": lambda: f32.run(feed), "int8": lambda: int8.run(feed),
                                            "bf16": lambda: bf16.run(feed),
                                            "ort": lambda: session.run(None, feed)}
    ms = {k: v * 1e3 for k, v in interleaved_times(fns, rounds=repeat, calls=1).items()}
    return (f"{name:<13} | {profile_s:9.1f} | {compile_s:9.1f} | {ms['f32']:8.2f} | {ms['int8']:8.2f} | "
            f"{ms['ort']:8.2f} | {ms['f32'] / ms['int8']:8.2f} | {ms['ort'] / ms['int8']:8.2f} | "
            f"{cosine(got, want):7.4f} | {top1(got, want):5.2f} | {cosine(ort_got, want):7.4f} | "
            f"{top1(ort_got, want):5.2f} | {ms['bf16']:8.2f} | {ms['f32'] / ms['bf16']:8.2f} | "
            f"{cosine(bf16_got, want):7.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help=f"comma-separated, of {','.join(QUANTIZED_MODELS)}")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--layers", type=int, default=2, help="BERT layers")
    parser.add_argument("--samples", type=int, default=32, help="calibration inputs")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(QUANTIZED_MODELS)
    unknown = [n for n in names if n not in QUANTIZED_MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {','.join(QUANTIZED_MODELS)}")
    torch.set_num_threads(2)
    print(f"{'model':<13} | {'profile s':>9} | {'int8 s':>9} | {'f32 ms':>8} | {'int8 ms':>8} | "
          f"{'ort8 ms':>8} | {'f32/int8':>8} | {'ort/int8':>8} | {'cos':>7} | {'top1':>5} | "
          f"{'ort cos':>7} | {'top1':>5} | {'bf16 ms':>8} | {'f32/bf16':>8} | {'bf16 cos':>7}",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            try:
                row = bench(name, args.layers, args.repeat, args.samples, tmp)
            except Exception as e:  # noqa: BLE001 - a benchmark row, not a test: report and go on
                row = f"{name:<13} | FAILED {first_line(e)}"
            print(row, flush=True)


if __name__ == "__main__":
    main()
