"""TC kernels compiled for this machine's CPU against numpy, in one process.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/kernels.py \
        [--repeat 7] [--only matmul1024,softmax]

For each kernel: the compile time (specialization: scheduling, LLVM, JIT), the
median time of --repeat runs after a warm-up for polyfuse and for numpy (timed in
alternation), the rate (GFLOP/s or GB/s of compulsory traffic), GFLOP/s as a fraction of
the FMA peak on as many threads (``peak.py``, measured just before the kernel is timed:
the machine's speed drifts), and speed-up = numpy time / polyfuse time. The OpenBLAS
variables are unset because they select numpy's slower kernels; OpenBLAS's threads sleep
soon after a call (``OPENBLAS_THREAD_TIMEOUT``), as polyfuse's do, instead of spinning on
the cores the next polyfuse run needs.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # before numpy loads OpenBLAS

import numpy as np

import polyfuse as pf
from peak import fma_peak
from polyfuse.runtime import native
from timing import interleaved_times


@dataclass
class Case:
    name: str
    source: str
    make: Callable[[np.random.Generator], tuple]
    numpy: Callable[..., object]
    work: float            # flops, or bytes when unit is GB/s
    unit: str = "GFLOP/s"


def _conv_numpy(x, w):
    win = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))  # n c h w kh kw
    return np.einsum("nchwij,fcij->nfhw", win, w, optimize=True)


def _gelu_numpy(x, w, b):
    y = x @ w.T + b
    return 0.5 * y * (1 + np.tanh(0.7978845608 * (y + 0.044715 * y ** 3)))


def _softmax_numpy(x):
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _layernorm_numpy(x, g, b):
    mean = x.mean(1, keepdims=True)
    var = ((x - mean) ** 2).mean(1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * g + b


def _f32(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"

CASES = [
    Case("matmul1024", MATMUL, lambda r: (_f32(r, 1024, 1024), _f32(r, 1024, 1024)),
         lambda a, b: a @ b, 2 * 1024 ** 3),
    Case("matmul2048", MATMUL, lambda r: (_f32(r, 2048, 2048), _f32(r, 2048, 2048)),
         lambda a, b: a @ b, 2 * 2048 ** 3),
    Case("matmul4096", MATMUL, lambda r: (_f32(r, 4096, 4096), _f32(r, 4096, 4096)),
         lambda a, b: a @ b, 2 * 4096 ** 3),
    # sizes that are not whole register blocks (1000 columns end in a block of 40)
    Case("matmul1000", MATMUL, lambda r: (_f32(r, 1000, 1000), _f32(r, 1000, 1000)),
         lambda a, b: a @ b, 2 * 1000 ** 3),
    Case("matmul_800", MATMUL, lambda r: (_f32(r, 1024, 1024), _f32(r, 1024, 800)),
         lambda a, b: a @ b, 2 * 1024 * 1024 * 800),
    # transposed operands: A·Bᵀ (attention's Q·Kᵀ, a Linear's weight) and Aᵀ·B (a gradient)
    Case("matmul_nt1024", "def nt(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }",
         lambda r: (_f32(r, 1024, 1024), _f32(r, 1024, 1024)), lambda a, b: a @ b.T, 2 * 1024 ** 3),
    Case("matmul_tn1024", "def tn(float(K,M) A, float(K,N) B) -> (C) { C(m,n) +=! A(k,m) * B(k,n) }",
         lambda r: (_f32(r, 1024, 1024), _f32(r, 1024, 1024)), lambda a, b: a.T @ b, 2 * 1024 ** 3),
    Case("tbmm", "def tbmm(float(B,K,M) A, float(B,N,K) W) -> (C) "
                 "{ C(b,m,n) +=! A(b,k,m) * W(b,n,k) }",
         lambda r: (_f32(r, 8, 256, 256), _f32(r, 8, 256, 256)),
         lambda a, w: np.matmul(a.transpose(0, 2, 1), w.transpose(0, 2, 1)), 2 * 8 * 256 ** 3),
    Case("conv3x3", "def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) "
                    "{ O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw) }",
         lambda r: (_f32(r, 1, 64, 58, 58), _f32(r, 64, 64, 3, 3)),
         _conv_numpy, 2 * 64 * 64 * 9 * 56 * 56),
    Case("softmax", """def softmax(float(N,D) X) -> (O, mx, sm) {
            mx(n) max=! X(n,d)
            sm(n) +=! exp(X(n,d) - mx(n))
            O(n,d) = exp(X(n,d) - mx(n)) / sm(n) }""",
         lambda r: (_f32(r, 1024, 4096),), _softmax_numpy, 2 * 4 * 1024 * 4096, "GB/s"),
    Case("layernorm", """def ln(float(N,D) X, float(D) G, float(D) Bt) -> (O, mean, var) {
            mean(n) +=! X(n,d) / float(D)
            var(n) +=! (X(n,d) - mean(n)) * (X(n,d) - mean(n)) / float(D)
            O(n,d) = (X(n,d) - mean(n)) * rsqrt(var(n) + 1e-5) * G(d) + Bt(d) }""",
         lambda r: (_f32(r, 1024, 4096), _f32(r, 4096), _f32(r, 4096)), _layernorm_numpy,
         2 * 4 * 1024 * 4096, "GB/s"),
    Case("fused_chain", "def chain(float(N) X, float(N) Y) -> (O) "
                        "{ O(i) = tanh(X(i) * Y(i) + 1.0) * 0.5 + X(i) }",
         lambda r: (_f32(r, 1 << 24), _f32(r, 1 << 24)),
         lambda x, y: np.tanh(x * y + 1) * 0.5 + x, 3 * 4 * (1 << 24), "GB/s"),
    Case("fc_gelu", """def fc(float(B,K) X, float(N,K) W, float(N) Bias) -> (Y) {
            Y(b,n) +=! X(b,k) * W(n,k)
            Y(b,n) = Y(b,n) + Bias(n)
            Y(b,n) = 0.5 * Y(b,n) * (1.0 + tanh(0.7978845608 * (Y(b,n) + 0.044715 * Y(b,n) * Y(b,n) * Y(b,n)))) }""",
         lambda r: (_f32(r, 256, 1024), _f32(r, 1024, 1024), _f32(r, 1024)), _gelu_numpy,
         2 * 256 * 1024 * 1024),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    wanted = set(filter(None, args.only.split(",")))
    rng = np.random.default_rng(0)
    threads = native.get_num_threads()
    print(f"FMA peak on {threads} threads: measured before each kernel (its 'peak' column)")
    print(f"{'kernel':<12} {'compile s':>9} {'polyfuse ms':>12} {'numpy ms':>9} "
          f"{'rate':>16} {'of peak':>8} {'peak':>6} {'vs numpy':>9}")
    for case in CASES:
        if wanted and case.name not in wanted:
            continue
        inputs = case.make(rng)
        kernel = next(iter(pf.define(case.source, target="host")))
        t = time.perf_counter()
        spec = kernel.specialize(*inputs)
        compile_s = time.perf_counter() - t
        peak = fma_peak(threads) if case.unit == "GFLOP/s" else 0.0
        times = interleaved_times({"ours": lambda: spec(*inputs), "numpy": lambda: case.numpy(*inputs)},
                                  args.repeat, calls=1)
        ours, ref = times["ours"], times["numpy"]
        got = spec(*inputs)
        got = got[0] if isinstance(got, tuple) else got
        np.testing.assert_allclose(got, case.numpy(*inputs), rtol=2e-3, atol=2e-3)
        rate = case.work / ours / 1e9
        of_peak, peak_col = (f"{rate / peak:7.0%}", f"{peak:6.0f}") if peak else ("", "")
        print(f"{case.name:<12} {compile_s:9.2f} {ours * 1e3:12.2f} {ref * 1e3:9.2f} "
              f"{rate:9.1f} {case.unit:<6} {of_peak:>8} {peak_col:>6} {ref / ours:8.2f}x", flush=True)


if __name__ == "__main__":
    main()
