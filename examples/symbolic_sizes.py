"""TC kernels compiled once for every size: ``pf.define(..., sizes="symbolic")``.

A kernel compiled for symbolic sizes takes them as parameters: its loop bounds and
buffer extents are expressions of the sizes, its tile loops split where the last,
partial tile starts (a floor division of the size), so full tiles keep constant bounds
and their register blocks. The first call compiles (with the options the heuristic
picks for its sizes); a call at new sizes binds them, checks the accesses and runs the
same code, in milliseconds. Each result is checked against numpy.
"""

import time

import numpy as np

import polyfuse as pf
from polyfuse.runtime import cpu

SOURCE = """
def matmul(float(M, K) A, float(K, N) B) -> (C) {
  C(m, n) +=! A(m, k) * B(k, n)
}
def softmax(float(N, D) X) -> (Y, mx, e, s) {
  mx(n) max=! X(n, d)
  e(n, d) = exp(X(n, d) - mx(n))
  s(n) +=! e(n, d)
  Y(n, d) = e(n, d) / s(n)
}
"""

rng = np.random.default_rng(0)
mod = pf.define(SOURCE, target="host", sizes="symbolic")

before = cpu.STATS["compiled"] + cpu.STATS["disk"]
print(f"{'sizes':>16} {'first call ms':>14}")
for m, k, n in ((256, 128, 192), (7, 300, 33), (1, 1, 1), (130, 257, 65), (512, 64, 1000)):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    start = time.perf_counter()
    c = mod.matmul(a, b)
    ms = (time.perf_counter() - start) * 1e3
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    print(f"{f'{m}x{k}x{n}':>16} {ms:14.1f}")
for n, d in ((64, 1000), (3, 7), (100, 129)):
    x = rng.standard_normal((n, d)).astype(np.float32)
    y = mod.softmax(x)[0]
    ref = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, ref / ref.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
built = cpu.STATS["compiled"] + cpu.STATS["disk"] - before
print(f"kernels compiled (or loaded from the disk cache) for 8 calls at 8 sizes: {built}")
assert built == 2
