"""Tuned against untuned against numpy / onnxruntime, in one process.

    python benchmarks/tuning.py [--trials 64] [--model-trials 12] [--model-tasks 6]
                                [--only matmul,conv,softmax,resnet18] [--strategy genetic]

Tunes matmul 1024^3, a ResNet 3x3 conv layer (256 channels, 14x14) and a softmax
(1024x4096) with ``--trials`` candidates each, then ResNet-18 end to end: its
``--model-tasks`` slowest kernels with ``--model-trials`` each. Prints, per workload,
the tuning time and the median latency of the tuned kernel, the untuned default and
numpy (onnxruntime for the model), as ratios. Records go to a temporary file.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import polyfuse as pf
from polyfuse.autotune.task import Task
from polyfuse.frontends.tc import parse
from polyfuse.autotune.tuner import TuneConfig, tune
from timing import interleaved_times, median_time

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
CONV = """
def conv(float(N,C,H,W) X, float(3,3,C,M) Wt) -> (Y, T) {
  T(n, h, w, m) +=! X(n, c, h + kh, w + kw) * Wt(kh, kw, c, m)
      where n in 0:N, h in 0:H - 2, w in 0:W - 2, m in 0:M, c in 0:C, kh in 0:3, kw in 0:3
  Y(n, m, h, w) = T(n, h, w, m)
}
"""
SOFTMAX = """
def softmax(float(N,D) X) -> (Y, Mx, S) {
  Mx(n) max=! X(n, d)
  S(n) +=! exp(X(n, d) - Mx(n))
  Y(n, d) = exp(X(n, d) - Mx(n)) / S(n)
}
"""


def numpy_conv(x: np.ndarray, wt: np.ndarray) -> np.ndarray:
    win = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))
    return np.einsum("nchwij,ijcm->nmhw", win, wt, optimize=True)


def numpy_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def kernel_row(name: str, source: str, entry: str, arrays: list[np.ndarray], reference, args,
               records: Path) -> None:
    task = Task.of(parse(source)[entry], arrays, "x86", name)
    config = TuneConfig(trials=args.trials, strategy=args.strategy, seed=args.seed,
                        number=args.number, repeat=3)
    result = tune(task, records, config, progress=True)
    default = getattr(pf.define(source, target="host"), entry)
    tuned = getattr(pf.define(source, target="host", tuning_records=records), entry)
    np.testing.assert_allclose(_first(tuned(*arrays)), reference(*arrays), rtol=1e-3, atol=1e-3)
    # numpy's BLAS threads spin for a while after each call and would slow the next
    # kernel down: polyfuse's two variants alternate, numpy is timed after them
    times = interleaved_times({"tuned": lambda: tuned(*arrays), "default": lambda: default(*arrays)},
                              args.repeat)
    t_tuned, t_default = times["tuned"], times["default"]
    t_numpy = median_time(lambda: reference(*arrays), args.repeat)
    print(f"{name:<10} {result.seconds:8.0f} {result.trials:6d} {t_tuned * 1e3:10.3f} "
          f"{t_default * 1e3:10.3f} {t_numpy * 1e3:10.3f} {t_numpy / t_tuned:9.2f}x "
          f"{t_default / t_tuned:9.2f}x", flush=True)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def model_row(args, records: Path) -> None:
    import onnxruntime as ort
    from models import resnet18
    model, shapes = resnet18()
    feed = {k: np.random.default_rng(1).standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    default = pf.compile(model, target="host", input_shapes=shapes)
    slowest = sorted(default.profile(feed, repeat=3), key=lambda x: -x[1])[:args.model_tasks]
    tasks = {t.name: t for t in default.tasks()}
    start = time.perf_counter()
    trials = 0
    for label, _ in slowest:
        config = TuneConfig(trials=args.model_trials, strategy=args.strategy, seed=args.seed,
                            number=args.number, repeat=3)
        trials += tune(tasks[label], records, config, progress=True).trials
    seconds = time.perf_counter() - start
    tuned = pf.compile(model, target="host", input_shapes=shapes, tuning_records=records)
    sess = ort.InferenceSession(model.SerializeToString())
    np.testing.assert_allclose(list(tuned.run(feed).values())[0], sess.run(None, feed)[0], rtol=1e-2, atol=1e-2)
    times = interleaved_times({"tuned": lambda: tuned.run(feed), "default": lambda: default.run(feed)},
                              args.repeat)
    t_tuned, t_default = times["tuned"], times["default"]
    t_ort = median_time(lambda: sess.run(None, feed), args.repeat)
    print(f"{'resnet18':<10} {seconds:8.0f} {trials:6d} {t_tuned * 1e3:10.3f} {t_default * 1e3:10.3f} "
          f"{t_ort * 1e3:10.3f} {t_ort / t_tuned:9.2f}x {t_default / t_tuned:9.2f}x   (vs onnxruntime)",
          flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--model-trials", type=int, default=12)
    p.add_argument("--model-tasks", type=int, default=6)
    p.add_argument("--strategy", default="genetic")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--number", type=int, default=5)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--only", default="")
    args = p.parse_args()
    wanted = set(filter(None, args.only.split(",")))
    rng = np.random.default_rng(0)
    records = Path(tempfile.mkdtemp()) / "records.jsonl"
    print(f"{'workload':<10} {'tune s':>8} {'trials':>6} {'tuned ms':>10} {'default ms':>10} "
          f"{'numpy ms':>10} {'vs numpy':>10} {'vs default':>10}")
    f32 = np.float32
    if not wanted or "matmul" in wanted:
        a, b = rng.standard_normal((1024, 1024)).astype(f32), rng.standard_normal((1024, 1024)).astype(f32)
        kernel_row("matmul", MATMUL, "mm", [a, b], lambda x, y: x @ y, args, records)
    if not wanted or "conv" in wanted:
        x = rng.standard_normal((1, 256, 16, 16)).astype(f32)
        wt = (rng.standard_normal((3, 3, 256, 256)) * 0.05).astype(f32)
        kernel_row("conv", CONV, "conv", [x, wt], numpy_conv, args, records)
    if not wanted or "softmax" in wanted:
        x = rng.standard_normal((1024, 4096)).astype(f32)
        kernel_row("softmax", SOFTMAX, "softmax", [x], numpy_softmax, args, records)
    if not wanted or "resnet18" in wanted:
        model_row(args, records)


if __name__ == "__main__":
    main()
