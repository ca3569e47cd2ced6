"""TC kernels compiled once for symbolic sizes against kernels specialized per size, in
one process, with numpy as the reference.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/symbolic_kernels.py \
        [--repeat 7] [--only matmul,softmax]

For each definition, a stream of sizes (none of which the first call's tiles divide):
per size, the first call's time for ``sizes="symbolic"`` (the first size compiles, the
others bind sizes and run) and for ``sizes="specialized"`` (a compile per size), then
the median time per call of each and of numpy, timed in alternation on new inputs, and
symbolic / specialized = how much slower the kernel for every size runs. The caches
start empty (a fresh ``POLYFUSE_CACHE_DIR``) so that first calls compile.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # before numpy loads OpenBLAS
os.environ["POLYFUSE_CACHE_DIR"] = tempfile.mkdtemp(prefix="polyfuse-symbolic-bench-")

import numpy as np

import polyfuse as pf
from polyfuse.runtime import cpu
from timing import interleaved_times


@dataclass
class Case:
    name: str
    source: str
    sizes: list[tuple[int, ...]]
    make: Callable[[np.random.Generator, tuple[int, ...]], tuple]
    numpy: Callable[..., object]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


CASES = [
    Case("matmul", "def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
         [(512, 512, 512), (1000, 300, 700), (128, 768, 768), (7, 768, 768), (333, 1024, 129), (64, 64, 4000)],
         lambda rng, s: (rng.standard_normal(s[:2]).astype(np.float32),
                         rng.standard_normal(s[1:]).astype(np.float32)),
         np.matmul),
    Case("softmax", """def f(float(N,D) X) -> (Y, mx, e, s) {
           mx(n) max=! X(n,d)
           e(n,d) = exp(X(n,d) - mx(n))
           s(n) +=! e(n,d)
           Y(n,d) = e(n,d) / s(n)
         }""",
         [(1024, 1024), (7, 3000), (4096, 129), (300, 77)],
         lambda rng, s: (rng.standard_normal(s).astype(np.float32),),
         _softmax),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    rng = np.random.default_rng(0)
    print(f"{'kernel':>8} {'sizes':>16} {'first symbolic ms':>18} {'first specialized ms':>21} "
          f"{'symbolic ms':>12} {'specialized ms':>15} {'numpy ms':>9} {'sym/spec':>9}")
    for case in CASES:
        if only and case.name not in only:
            continue
        symbolic = pf.define(case.source, target="host", sizes="symbolic").f
        specialized = pf.define(case.source, target="host").f
        before = cpu.STATS["compiled"]
        for sizes in case.sizes:
            inputs = case.make(rng, sizes)
            firsts = []
            for kernel in (symbolic, specialized):
                start = time.perf_counter()
                kernel(*inputs)
                firsts.append((time.perf_counter() - start) * 1e3)
            feeds = [case.make(rng, sizes) for _ in range(4)]
            turn = iter(range(1 << 30))

            def fresh(fn: Callable[..., object]) -> Callable[[], object]:
                return lambda: fn(*feeds[next(turn) % len(feeds)])
            times = interleaved_times({"symbolic": fresh(symbolic), "specialized": fresh(specialized),
                                       "numpy": fresh(case.numpy)}, args.repeat)
            s, p, n = (times[k] * 1e3 for k in ("symbolic", "specialized", "numpy"))
            label = "x".join(map(str, sizes))
            print(f"{case.name:>8} {label:>16} {firsts[0]:18.1f} {firsts[1]:21.1f} {s:12.3f} {p:15.3f} "
                  f"{n:9.3f} {s / p:9.2f}")
        print(f"{case.name:>8} kernels compiled: {cpu.STATS['compiled'] - before} "
              f"(1 symbolic, {len(case.sizes)} specialized)")


if __name__ == "__main__":
    main()
