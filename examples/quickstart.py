"""polyfuse in one screen: TC definitions, range inference, einsum, checked calls."""

import numpy as np

import polyfuse as pf

mod = pf.define("""
def matmul(float(M, K) A, float(K, N) B) -> (C) {
  C(m, n) +=! A(m, k) * B(k, n)
}

def softmax(float(N, D) I) -> (O, maxVal, expSum) {
  maxVal(n) max=! I(n, d)
  expSum(n) +=! exp(I(n, d) - maxVal(n))
  O(n, d) = exp(I(n, d) - maxVal(n)) / expSum(n)
}

def conv_stride2(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
  O(n, f, h, w) +=! I(n, c, 2 * h + kh, 2 * w + kw) * Wt(f, c, kh, kw)
}
""", target="reference")

rng = np.random.default_rng(0)
A = rng.standard_normal((64, 32), dtype=np.float32)
B = rng.standard_normal((32, 48), dtype=np.float32)
C = mod.matmul(A, B)
print("matmul   max |C - A@B| =", float(np.abs(C - A @ B).max()))
assert np.allclose(C, A @ B, rtol=1e-4, atol=1e-4)

X = rng.standard_normal((8, 100), dtype=np.float32)
P, _, _ = mod.softmax(X)
ref = np.exp(X - X.max(1, keepdims=True))
ref /= ref.sum(1, keepdims=True)
print("softmax  max error     =", float(np.abs(P - ref).max()))
assert np.allclose(P, ref, rtol=1e-5, atol=1e-6)

image = rng.standard_normal((1, 3, 11, 11), dtype=np.float32)
weights = rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
kernel = mod.conv_stride2.specialize(image, weights)
print("conv     output shape  =", kernel.output_shapes[0], "(inferred: h in 0:(H - KH)/2 + 1)")
assert kernel.output_shapes[0] == (1, 4, 5, 5)
print(kernel.stages["comprehension"])

E = pf.einsum("bij,bjk->bik", rng.standard_normal((2, 3, 4), dtype=np.float32),
              rng.standard_normal((2, 4, 5), dtype=np.float32))
print("einsum   batched matmul shape =", E.shape)

native = pf.define("def matmul(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
                   target="host")  # the same math as native code for this CPU
assert np.allclose(native.matmul(A, B), C, rtol=1e-4, atol=1e-4)
print("native   matmul agrees with the reference")

try:
    mod.matmul(A, A)
except pf.ShapeError as err:
    print("refused:", err)
