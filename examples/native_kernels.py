"""TC compiled to native code for this machine's CPU: schedules, loops, speed."""

import time

import numpy as np

import polyfuse as pf
from polyfuse.scheduler.options import MappingOptions

SOURCE = """
def matmul(float(M, K) A, float(K, N) B) -> (C) {
  C(m, n) +=! A(m, k) * B(k, n)
}
def chain(float(N) X, float(N) Y) -> (O) {
  O(i) = tanh(X(i) * Y(i) + 1.0) * 0.5 + X(i)
}
"""

mod = pf.define(SOURCE, target="host")   # "host" is x86 here; the default options are a heuristic
rng = np.random.default_rng(0)
A = rng.standard_normal((512, 256), dtype=np.float32)
B = rng.standard_normal((256, 384), dtype=np.float32)

kernel = mod.matmul.specialize(A, B)       # schedule + LLVM + JIT, cached in memory and on disk
print(kernel.stages["options"])
print("\n".join(kernel.stages["loops"].splitlines()[:14]), "\n  ...")
C = kernel(A, B)
assert np.allclose(C, A @ B, rtol=1e-3, atol=1e-3)


def best(fn, repeat=5):
    fn()
    return min(_timed(fn) for _ in range(repeat))


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


print(f"matmul 512x256x384: {2 * 512 * 256 * 384 / best(lambda: kernel(A, B)) / 1e9:.1f} GFLOP/s "
      f"(numpy {2 * 512 * 256 * 384 / best(lambda: A @ B) / 1e9:.1f})")

# A transposed operand (attention's Q·Kᵀ) is copied into panels transposed, so the
# micro-kernel still vectorizes the output's contiguous index.
nt = pf.define("def nt(float(M,K) Q, float(N,K) Kt) -> (S) { S(m,n) +=! Q(m,k) * Kt(n,k) }",
               target="host").nt
Q, Kt = A, rng.standard_normal((384, 256), dtype=np.float32)
assert "Kt_packed" in nt.specialize(Q, Kt).stages["loops"]
assert np.allclose(nt(Q, Kt), Q @ Kt.T, rtol=1e-3, atol=1e-3)
print(f"Q·Kᵀ 512x256x384: {2 * 512 * 256 * 384 / best(lambda: nt(Q, Kt)) / 1e9:.1f} GFLOP/s "
      f"(numpy {2 * 512 * 256 * 384 / best(lambda: Q @ Kt.T) / 1e9:.1f})")

x = rng.standard_normal(1 << 20, dtype=np.float32)
y = rng.standard_normal(1 << 20, dtype=np.float32)
out = mod.chain(x, y)
assert np.allclose(out, np.tanh(x * y + 1) * 0.5 + x, rtol=1e-5, atol=1e-6)
print(f"fused chain on 1M floats: {best(lambda: np.tanh(x * y + 1) * 0.5 + x) / best(lambda: mod.chain(x, y)):.1f}x numpy")

# Options change the schedule: here 1 thread, no tiling, 8-wide vectors.
serial = pf.define(SOURCE, target="host", options=MappingOptions(parallel=0, vector_width=8))
assert np.allclose(serial.matmul(A, B), C, rtol=1e-3, atol=1e-3)
print("serial schedule:", serial.matmul.specialize(A, B).stages["loops"].splitlines()[1])
