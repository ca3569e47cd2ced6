"""A catalogue of canonical TC programs with independent numpy oracles.

Every backend's tests reuse this list: each :class:`Program` carries the TC source,
the def to call, a generator of small deterministic inputs and an oracle written in
plain numpy (einsum, slicing, reductions) that does not go through TC at all.

Conventions the oracles follow (polyfuse's TC semantics):

* ``float`` is float32; float literals are float32, int literals int32.
* Every output starts zero-filled; elements no statement writes stay 0.
* Tensors start at index 0: an output's size along a dimension is the exclusive upper
  bound of the inferred range of the LHS index there, i.e. its largest index + 1, even
  when the range starts above 0 (a 3-point stencil ``O(i)`` over ``I(i-1..i+1)`` has
  length N-1 and ``O[0] == 0``; a shift ``O(i) = I(i - 1)`` has length N+1).
* The harness calls without ``out=``, so no program here reduces without ``!`` into an
  output no earlier statement wrote (that form needs the caller's initial contents; see
  tests/runtime/test_inplace.py).
* Temporaries are declared outputs and are returned too, in declared order.
* float16/bfloat16 are storage types: arithmetic runs in float32, rounded on store.
* Integer ``/`` and ``%`` truncate toward zero as in C and CUDA (``np.trunc`` of the
  quotient, ``np.fmod``); ``floordiv``/``floormod`` floor (numpy ``//`` and ``%``);
  int32 sums wrap like C.

The oracles compute floats in float64 and round to the output dtype at the end, so
they are the exact answer; the tests compare with a tolerance. ``make_inputs`` only
returns arrays of exactly the declared dtypes (and Python floats for scalar params).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import ml_dtypes
import numpy as np

f32 = np.float32
f64 = np.float64
f16 = np.float16
bf16 = ml_dtypes.bfloat16


@dataclass(frozen=True)
class Program:
    """One canonical TC program and how to check it."""

    name: str
    source: str
    entry: str
    make_inputs: Callable[[np.random.Generator], tuple]
    oracle: Callable[..., tuple]


# --------------------------------------------------------------------------- helpers


def _u(rng: np.random.Generator, *shape: int, lo: float = -1.0, hi: float = 1.0,
       dtype=f32) -> np.ndarray:
    """Uniform random array of ``shape`` stored as ``dtype``."""
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def _d(x) -> np.ndarray:
    """As float64 (exact for every float32/float16/bfloat16/int32 input)."""
    return np.asarray(x).astype(f64)


def _o32(*xs) -> tuple:
    return tuple(np.asarray(x).astype(f32) for x in xs)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[f64])(x)


PROGRAMS: list[Program] = []


def _add(name: str, source: str, entry: str, make_inputs, oracle) -> None:
    PROGRAMS.append(Program(name, source, entry, make_inputs, oracle))


# --------------------------------------------------------------------------- linear algebra

_add(
    "matmul",
    """
def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}
""",
    "matmul",
    lambda rng: (_u(rng, 7, 12), _u(rng, 12, 9)),
    lambda A, B: _o32(_d(A) @ _d(B)),
)

_add(
    "matmul_transposed",
    """
def tmm(float(K,M) A, float(N,K) B) -> (C) {
    C(m,n) +=! A(k,m) * B(n,k)
}
""",
    "tmm",
    lambda rng: (_u(rng, 11, 6), _u(rng, 8, 11)),
    lambda A, B: _o32(_d(A).T @ _d(B).T),
)

_add(
    "batch_matmul",
    """
def bmm(float(Bt,M,K) X, float(Bt,K,N) Y) -> (Z) {
    Z(b,m,n) +=! X(b,m,k) * Y(b,k,n)
}
""",
    "bmm",
    lambda rng: (_u(rng, 3, 5, 7), _u(rng, 3, 7, 4)),
    lambda X, Y: _o32(np.einsum("bmk,bkn->bmn", _d(X), _d(Y))),
)

_add(
    "gemm_alpha_beta",
    """
def gemm(float alpha, float beta, float(M,K) A, float(K,N) B, float(M,N) C) -> (O) {
    O(m,n) +=! alpha * A(m,k) * B(k,n)
    O(m,n) = O(m,n) + beta * C(m,n)
}
""",
    "gemm",
    lambda rng: (1.5, -0.75, _u(rng, 6, 10), _u(rng, 10, 5), _u(rng, 6, 5)),
    lambda alpha, beta, A, B, C: _o32(
        f64(f32(alpha)) * (_d(A) @ _d(B)) + f64(f32(beta)) * _d(C)),
)

_add(
    "transpose",
    """
def transpose(float(M,N) A) -> (B) {
    B(n,m) = A(m,n)
}
""",
    "transpose",
    lambda rng: (_u(rng, 5, 8),),
    lambda A: (np.ascontiguousarray(A.T),),
)

_add(
    "permute3",
    """
def permute3(float(P,Q,R) I) -> (O) {
    O(r,p,q) = I(p,q,r)    # move the last axis first
}
""",
    "permute3",
    lambda rng: (_u(rng, 3, 4, 5),),
    lambda I: (np.ascontiguousarray(np.transpose(I, (2, 0, 1))),),
)

_add(
    "tensordot",
    """
def tensordot(float(N,C1,C2,H,W) I0, float(N,C2,C3,H,W) I1) -> (O) {
    O(n,c1,c3,h,w) +=! I0(n,c1,r_c2,h,w) * I1(n,r_c2,c3,h,w)
}
""",
    "tensordot",
    lambda rng: (_u(rng, 2, 3, 4, 3, 2), _u(rng, 2, 4, 5, 3, 2)),
    lambda I0, I1: _o32(np.einsum("nabhw,nbchw->nachw", _d(I0), _d(I1))),
)

_add(
    "outer_product",
    """
def outer(float(M) U, float(N) V) -> (P) {
    P(i,j) = U(i) * V(j)
}
""",
    "outer",
    lambda rng: (_u(rng, 4), _u(rng, 6)),
    lambda U, V: _o32(np.outer(_d(U), _d(V))),
)


# --------------------------------------------------------------------------- convolutions


def _conv2d_stride2(I, Wt):
    I, Wt = _d(I), _d(Wt)
    N, C, H, W = I.shape
    M, _, KH, KW = Wt.shape
    Ho, Wo = (H - KH) // 2 + 1, (W - KW) // 2 + 1
    O = np.zeros((N, M, Ho, Wo))
    for kh in range(KH):
        for kw in range(KW):
            patch = I[:, :, kh:kh + 2 * (Ho - 1) + 1:2, kw:kw + 2 * (Wo - 1) + 1:2]
            O += np.einsum("nchw,mc->nmhw", patch, Wt[:, :, kh, kw])
    return _o32(O)


_add(
    "conv2d_stride2",
    """
def conv2d_s2(float(N,C,H,W) I, float(M,C,KH,KW) Wt) -> (O) {
    O(n,m,h,w) +=! I(n,c,2*h+kh,2*w+kw) * Wt(m,c,kh,kw)
}
""",
    "conv2d_s2",
    # H=10, W=9 with a 3x3 kernel: Ho = (10-3)/2+1 = 4, Wo = (9-3)/2+1 = 4.
    lambda rng: (_u(rng, 2, 3, 10, 9), _u(rng, 4, 3, 3, 3)),
    _conv2d_stride2,
)


def _group_conv(I, Wt):
    I, Wt = _d(I), _d(Wt)
    N, G, C, H, W = I.shape
    _, F, _, KH, KW = Wt.shape
    Ho, Wo = H - KH + 1, W - KW + 1
    O = np.zeros((N, G, F, Ho, Wo))
    for kh in range(KH):
        for kw in range(KW):
            O += np.einsum("ngchw,gfc->ngfhw", I[:, :, :, kh:kh + Ho, kw:kw + Wo],
                           Wt[:, :, :, kh, kw])
    return _o32(O)


_add(
    "group_conv",
    """
def group_conv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) Wt) -> (O) {
    O(n,g,f,h,w) +=! I(n,g,c,h+kh,w+kw) * Wt(g,f,c,kh,kw)
}
""",
    "group_conv",
    lambda rng: (_u(rng, 2, 2, 3, 6, 7), _u(rng, 2, 4, 3, 3, 2)),
    _group_conv,
)


def _kru3(X, W2, W1, W0):
    X, W2, W1, W0 = _d(X), _d(W2), _d(W1), _d(W0)
    XW2 = np.einsum("mabc,dc->mabd", X, W2)          # (M, N0, N1, D2)
    XW2W1 = np.einsum("mabd,eb->maed", XW2, W1)      # (M, N0, D1, D2)
    Y = np.einsum("maed,fa->mfed", XW2W1, W0)        # (M, D0, D1, D2)
    return _o32(XW2, XW2W1, Y)


_add(
    "kronecker3",
    """
def kru3(float(M,N0,N1,N2) X, float(D2,N2) W2, float(D1,N1) W1, float(D0,N0) W0)
    -> (XW2, XW2W1, Y)
{
    XW2(m,n0,n1,d2)   +=! X(m,n0,n1,n2) * W2(d2,n2)
    XW2W1(m,n0,d1,d2) +=! XW2(m,n0,n1,d2) * W1(d1,n1)
    Y(m,d0,d1,d2)     +=! XW2W1(m,n0,d1,d2) * W0(d0,n0)
}
""",
    "kru3",
    lambda rng: (_u(rng, 2, 3, 4, 5), _u(rng, 4, 5), _u(rng, 3, 4), _u(rng, 2, 3)),
    _kru3,
)


# --------------------------------------------------------------------------- layers


def _fc_relu(I, W1, B1):
    return _o32(np.maximum(_d(I) @ _d(W1).T + _d(B1), 0.0))


_add(
    "fc_bias_relu",
    """
def fc_relu(float(B,M) I, float(N,M) W1, float(N) B1) -> (O1) {
    O1(b,n) +=! I(b,m) * W1(n,m)
    O1(b,n) = O1(b,n) + B1(n)
    O1(b,n) = fmax(O1(b,n), 0)
}
""",
    "fc_relu",
    lambda rng: (_u(rng, 4, 10), _u(rng, 6, 10), _u(rng, 6)),
    _fc_relu,
)


def _mlp3(I, W1, B1, W2, B2, W3, B3):
    O1 = np.maximum(_d(I) @ _d(W1).T + _d(B1), 0.0)
    O2 = np.maximum(O1 @ _d(W2).T + _d(B2), 0.0)
    O3 = np.maximum(O2 @ _d(W3).T + _d(B3), 0.0)
    return _o32(O1, O2, O3)


_add(
    "mlp3",
    """
def mlp3(float(B,N0) I, float(N1,N0) W1, float(N1) B1, float(N2,N1) W2, float(N2) B2,
         float(N3,N2) W3, float(N3) B3) -> (O1, O2, O3) {
    # layer 1
    O1(b,n1) +=! I(b,n0) * W1(n1,n0)
    O1(b,n1) = O1(b,n1) + B1(n1)
    O1(b,n1) = fmax(O1(b,n1), 0)
    # layer 2
    O2(b,n2) +=! O1(b,n1) * W2(n2,n1)
    O2(b,n2) = O2(b,n2) + B2(n2)
    O2(b,n2) = fmax(O2(b,n2), 0)
    # layer 3
    O3(b,n3) +=! O2(b,n2) * W3(n3,n2)
    O3(b,n3) = O3(b,n3) + B3(n3)
    O3(b,n3) = fmax(O3(b,n3), 0)
}
""",
    "mlp3",
    lambda rng: (_u(rng, 3, 8), _u(rng, 7, 8), _u(rng, 7), _u(rng, 6, 7), _u(rng, 6),
                 _u(rng, 5, 6), _u(rng, 5)),
    _mlp3,
)


def _softmax(I):
    x = _d(I)
    mx = x.max(axis=1)
    e = np.exp(x - mx[:, None])
    s = e.sum(axis=1)
    return _o32(e / s[:, None], mx, s)


_add(
    "softmax",
    """
def softmax(float(N,D) I) -> (O, maxVal, expSum) {
    maxVal(n) max=! I(n,d)
    O(n,d) = exp(I(n,d) - maxVal(n))
    expSum(n) +=! O(n,d)
    O(n,d) = O(n,d) / expSum(n)
}
""",
    "softmax",
    lambda rng: (_u(rng, 5, 9, lo=-4.0, hi=4.0),),
    _softmax,
)


def _batchnorm(I, gamma, beta, eps):
    x = _d(I)
    mean = x.mean(axis=(0, 2, 3))
    centered = x - mean[None, :, None, None]
    var = (centered * centered).mean(axis=(0, 2, 3))
    inv = 1.0 / np.sqrt(var + f64(f32(eps)))
    O = _d(gamma)[None, :, None, None] * centered * inv[None, :, None, None] \
        + _d(beta)[None, :, None, None]
    return _o32(O, mean, centered, var)


_add(
    "batchnorm",
    """
def batchnorm(float(N,C,H,W) I, float(C) gamma, float(C) beta, float eps)
    -> (O, mean, centered, var)
{
    mean(c) +=! I(n,c,h,w)
    mean(c) = mean(c) / float(N*H*W)
    centered(n,c,h,w) = I(n,c,h,w) - mean(c)
    var(c) +=! centered(n,c,h,w) * centered(n,c,h,w)
    var(c) = var(c) / float(N*H*W)
    O(n,c,h,w) = gamma(c) * centered(n,c,h,w) * rsqrt(var(c) + eps) + beta(c)
}
""",
    "batchnorm",
    lambda rng: (_u(rng, 2, 3, 4, 5, lo=-2.0, hi=3.0), _u(rng, 3, lo=0.5, hi=1.5),
                 _u(rng, 3), 1e-5),
    _batchnorm,
)


def _layernorm(X, gamma, beta, eps):
    x = _d(X)
    mean = x.mean(axis=1)
    var = ((x - mean[:, None]) ** 2).mean(axis=1)
    Y = (x - mean[:, None]) / np.sqrt(var + f64(f32(eps)))[:, None] * _d(gamma) + _d(beta)
    return _o32(Y, mean, var)


_add(
    "layernorm",
    """
def layernorm(float(N,D) X, float(D) gamma, float(D) beta, float eps) -> (Y, mean, var) {
    mean(n) +=! X(n,d)
    mean(n) = mean(n) / float(D)
    var(n) +=! xc * xc where xc = X(n,d) - mean(n)
    var(n) = var(n) / float(D)
    Y(n,d) = (X(n,d) - mean(n)) * rsqrt(var(n) + eps) * gamma(d) + beta(d)
}
""",
    "layernorm",
    lambda rng: (_u(rng, 4, 10, lo=-2.0, hi=3.0), _u(rng, 10, lo=0.5, hi=1.5),
                 _u(rng, 10), 1e-5),
    _layernorm,
)


def _pool_windows(I, k, s):
    """All k*k strided windows of an NCHW array: list of (N,C,Ho,Wo) slices."""
    N, C, H, W = I.shape
    Ho, Wo = (H - k) // s + 1, (W - k) // s + 1
    return [I[:, :, kh:kh + s * (Ho - 1) + 1:s, kw:kw + s * (Wo - 1) + 1:s]
            for kh in range(k) for kw in range(k)]


_add(
    "avgpool",
    """
def avgpool(float(N,C,H,W) I) -> (O) {
    O(n,c,h,w) +=! I(n,c,2*h+kh,2*w+kw) / 9.0 where kh in 0:3, kw in 0:3
}
""",
    "avgpool",
    # H=9 -> Ho = (9-3)/2+1 = 4; W=8 -> Wo = (8-3)/2+1 = 3.
    lambda rng: (_u(rng, 2, 3, 9, 8),),
    lambda I: _o32(sum(_pool_windows(_d(I), 3, 2)) / 9.0),
)

_add(
    "maxpool",
    """
def maxpool(float(N,C,H,W) I) -> (O) {
    O(n,c,h,w) max=! I(n,c,2*h+kh,2*w+kw) where kh in 0:3, kw in 0:3
}
""",
    "maxpool",
    lambda rng: (_u(rng, 2, 3, 9, 8),),
    lambda I: (np.max(np.stack(_pool_windows(I, 3, 2)), axis=0).astype(f32),),
)


def _gelu_erf(X):
    x = _d(X)
    return _o32(0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))))


_add(
    "gelu_erf",
    """
def gelu(float(N) X) -> (Y) {
    Y(i) = 0.5 * X(i) * (1.0 + erf(X(i) * 0.7071067811865476))
}
""",
    "gelu",
    lambda rng: (_u(rng, 33, lo=-4.0, hi=4.0),),
    _gelu_erf,
)


def _gelu_tanh(X):
    x = _d(X)
    c = math.sqrt(2.0 / math.pi)
    return _o32(0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x ** 3))))


_add(
    "gelu_tanh",
    """
def gelu_tanh(float(B,N) X) -> (Y) {
    Y(b,i) = 0.5 * X(b,i) * (1.0 + tanh(0.7978845608028654 * (X(b,i) + 0.044715 * X(b,i) * X(b,i) * X(b,i))))
}
""",
    "gelu_tanh",
    lambda rng: (_u(rng, 3, 11, lo=-4.0, hi=4.0),),
    _gelu_tanh,
)


# --------------------------------------------------------------------------- data movement


def _embedding_inputs(rng):
    E = _u(rng, 10, 6)
    Idx = rng.integers(0, 10, size=7).astype(np.int32)
    Idx[0], Idx[-1] = 0, 9          # touch both ends of the table
    return E, Idx


_add(
    "embedding",
    """
def embedding(float(V,D) E, int32(B) Idx) -> (O) {
    O(b,d) = E(Idx(b), d)
}
""",
    "embedding",
    _embedding_inputs,
    lambda E, Idx: (E[Idx.astype(np.int64)].astype(f32),),
)

_add(
    "concat1d",
    """
def concat1d(float(N) A, float(M) B) -> (O) {
    O(i) = i < N ? A(i) : B(i - N) where i in 0:N+M
}
""",
    "concat1d",
    lambda rng: (_u(rng, 5), _u(rng, 7)),
    lambda A, B: (np.concatenate([A, B]).astype(f32),),
)

_add(
    "concat_rows",
    """
def concat_rows(float(N,D) A, float(M,D) B) -> (O) {
    O(i,d) = i < N ? A(i,d) : B(i - N, d) where i in 0:N+M
}
""",
    "concat_rows",
    lambda rng: (_u(rng, 3, 4), _u(rng, 5, 4)),
    lambda A, B: (np.concatenate([A, B], axis=0).astype(f32),),
)


def _stencil3(I):
    x = _d(I)
    O = np.zeros(len(x) - 1)                       # i in 1:N-1 -> size N-1, O[0] unwritten
    O[1:] = (x[:-2] + x[1:-1] + x[2:]) / 3.0
    return _o32(O)


_add(
    "stencil3",
    """
def stencil3(float(N) I) -> (O) {
    O(i) = (I(i-1) + I(i) + I(i+1)) / 3.0
}
""",
    "stencil3",
    lambda rng: (_u(rng, 12),),
    _stencil3,
)


def _laplace2d(I):
    x = _d(I)
    N, M = x.shape
    O = np.zeros((N - 1, M - 1))                   # i in 1:N-1, j in 1:M-1
    O[1:, 1:] = (x[:-2, 1:-1] + x[2:, 1:-1] + x[1:-1, :-2] + x[1:-1, 2:]
                 - 4.0 * x[1:-1, 1:-1])
    return _o32(O)


_add(
    "laplace2d",
    """
def laplace2d(float(N,M) I) -> (O) {
    O(i,j) = I(i-1,j) + I(i+1,j) + I(i,j-1) + I(i,j+1) - 4.0 * I(i,j)
}
""",
    "laplace2d",
    lambda rng: (_u(rng, 6, 7),),
    _laplace2d,
)


# --------------------------------------------------------------------------- scalars, reductions


_add(
    "axpy",
    """
def axpy(float a, float(N) X, float(N) Y) -> (Z) {
    Z(i) = a * X(i) + Y(i)
}
""",
    "axpy",
    lambda rng: (2.5, _u(rng, 17), _u(rng, 17)),
    lambda a, X, Y: _o32(f64(f32(a)) * _d(X) + _d(Y)),
)

_add(
    "daxpy_double",
    """
def daxpy(double a, double(N) X, float64(N) Y) -> (Z) {
    Z(i) = a * X(i) + Y(i)
}
""",
    "daxpy",
    lambda rng: (0.1, _u(rng, 9, dtype=f64), _u(rng, 9, dtype=f64)),
    lambda a, X, Y: (a * X + Y,),
)


def _int_sum_inputs(rng):
    # Large magnitudes: about half of the row sums overflow int32 and must wrap.
    return (rng.integers(-2**30, 2**30, size=(6, 16)).astype(np.int32),)


_add(
    "int32_sum",
    """
def rowsum(int32(M,N) A) -> (S) {
    S(i) +=! A(i,j)
}
""",
    "rowsum",
    _int_sum_inputs,
    lambda A: (np.add.reduce(A, axis=1, dtype=np.int32),),
)

_add(
    "prod_reduction",
    """
def rowprod(float(M,N) A) -> (P) {
    P(i) *=! A(i,j)
}
""",
    "rowprod",
    lambda rng: (_u(rng, 5, 8, lo=0.5, hi=1.5),),
    lambda A: _o32(np.prod(_d(A), axis=1)),
)

_add(
    "max_min_reduction",
    """
def maxmin(float(M,N) A) -> (RowMax, ColMin) {
    RowMax(i) max=! A(i,j)
    ColMin(j) min=! A(i,j)
}
""",
    "maxmin",
    lambda rng: (_u(rng, 5, 7, lo=-3.0, hi=3.0),),
    lambda A: (np.max(A, axis=1).astype(f32), np.min(A, axis=0).astype(f32)),
)


def _int_ops_inputs(rng):
    A = rng.integers(-20, 21, size=12).astype(np.int32)
    B = rng.integers(1, 6, size=12).astype(np.int32)
    B *= np.where(rng.random(12) < 0.5, -1, 1).astype(np.int32)
    A[:4] = [-7, 7, -6, 0]
    B[:4] = [2, -2, 3, -4]
    return A, B


def _tdiv(a, b):
    """C's integer division: the quotient rounded toward zero."""
    return np.trunc(np.asarray(a, f64) / b).astype(np.int32)


def _int_ops(A, B):
    return (_tdiv(A, 3), np.fmod(A, 3), _tdiv(A, B), np.fmod(A, B), np.maximum(A, B),
            (np.abs(A) * 2 + np.minimum(A, B)).astype(np.int32))


_add(
    "int_ops",
    """
def int_ops(int(N) A, int32(N) B) -> (Q, R, D, Md, Mx, Ab) {
    Q(i) = A(i) / 3
    R(i) = A(i) % 3
    D(i) = A(i) / B(i)
    Md(i) = A(i) % B(i)
    Mx(i) = max(A(i), B(i))
    Ab(i) = abs(A(i)) * 2 + min(A(i), B(i))
}
""",
    "int_ops",
    _int_ops_inputs,
    _int_ops,
)


_add(
    "mixed_int_float",
    """
def mixed(float(N) X, int32(N) K) -> (O) {
    O(i) = X(i) * K(i) + N + i    # int * float is float; sizes and indices are values
}
""",
    "mixed",
    lambda rng: (_u(rng, 8), rng.integers(-10, 11, size=8).astype(np.int32)),
    lambda X, K: _o32(_d(X) * K + len(X) + np.arange(len(X))),
)


def _mathfns(P, X):
    p, x = _d(P), _d(X)
    x3 = X * f32(3.0)                              # float32 product, as TC computes it
    return _o32(
        np.exp(x) + np.log(p) + np.sqrt(p) + 1.0 / np.sqrt(p),
        np.tanh(x) + 1.0 / (1.0 + np.exp(-x)) + _erf(x),
        np.abs(x) + np.maximum(x, p) + np.minimum(x, 0.5),
        np.power(p, x),
        _d(np.floor(x3)) + _d(np.ceil(x3)),
        np.sin(x) * np.cos(x) + np.abs(x) + np.maximum(x, 0.0) - np.minimum(x, 0.0),
    )


_add(
    "math_builtins",
    """
def mathfns(float(N) P, float(N) X) -> (O1, O2, O3, O4, O5, O6) {
    O1(i) = exp(X(i)) + log(P(i)) + sqrt(P(i)) + rsqrt(P(i))
    O2(i) = tanh(X(i)) + sigmoid(X(i)) + erf(X(i))
    O3(i) = fabs(X(i)) + fmax(X(i), P(i)) + fmin(X(i), 0.5)
    O4(i) = pow(P(i), X(i))
    O5(i) = floor(X(i) * 3.0) + ceil(X(i) * 3.0)
    O6(i) = sin(X(i)) * cos(X(i)) + abs(X(i)) + max(X(i), 0.0) - min(X(i), 0.0)
}
""",
    "mathfns",
    lambda rng: (_u(rng, 16, lo=0.5, hi=2.0), _u(rng, 16, lo=-2.0, hi=2.0)),
    _mathfns,
)


# --------------------------------------------------------------------------- several defs

_MULTI_DEF_SOURCE = """
# Three independent defs in one source text.
def scale(float(N) X, float s) -> (Y) {
    Y(i) = s * X(i)
}

def rowsum_f(float(M,N) A) -> (R) {
    R(i) +=! A(i,j)   # reduce over j
}

def addmul(float(N) X, float(N) Y) -> (S, P) {
    S(i) = X(i) + Y(i)
    P(i) = X(i) * Y(i)
}
"""

_add(
    "multi_def_scale",
    _MULTI_DEF_SOURCE,
    "scale",
    lambda rng: (_u(rng, 6), -3.0),
    lambda X, s: _o32(f64(f32(s)) * _d(X)),
)

_add(
    "multi_def_rowsum",
    _MULTI_DEF_SOURCE,
    "rowsum_f",
    lambda rng: (_u(rng, 4, 5),),
    lambda A: _o32(_d(A).sum(axis=1)),
)

_add(
    "multi_def_addmul",
    _MULTI_DEF_SOURCE,
    "addmul",
    lambda rng: (_u(rng, 7), _u(rng, 7)),
    lambda X, Y: _o32(_d(X) + _d(Y), _d(X) * _d(Y)),
)


# --------------------------------------------------------------------------- 16-bit floats
# Positive inputs only, so that no cancellation amplifies the 16-bit rounding.

_add(
    "fp16_elementwise",
    """
def fp16_fma(float16(N,M) A, float16(N,M) B) -> (C) {
    C(i,j) = A(i,j) * B(i,j) + A(i,j)
}
""",
    "fp16_fma",
    lambda rng: (_u(rng, 4, 6, lo=0.5, hi=2.0, dtype=f16), _u(rng, 4, 6, lo=0.5, hi=2.0, dtype=f16)),
    lambda A, B: ((_d(A) * _d(B) + _d(A)).astype(f32).astype(f16),),
)

_add(
    "fp16_matmul",
    """
def fp16_matmul(float16(M,K) A, float16(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}
""",
    "fp16_matmul",
    lambda rng: (_u(rng, 5, 8, lo=0.0, hi=1.0, dtype=f16), _u(rng, 8, 6, lo=0.0, hi=1.0, dtype=f16)),
    lambda A, B: ((_d(A) @ _d(B)).astype(f32).astype(f16),),
)

_add(
    "bf16_elementwise",
    """
def bf16_fma(bfloat16(N,M) A, bfloat16(N,M) B) -> (C) {
    C(i,j) = A(i,j) * B(i,j) + A(i,j)
}
""",
    "bf16_fma",
    lambda rng: (_u(rng, 4, 6, lo=0.5, hi=2.0, dtype=bf16), _u(rng, 4, 6, lo=0.5, hi=2.0, dtype=bf16)),
    lambda A, B: ((_d(A) * _d(B) + _d(A)).astype(f32).astype(bf16),),
)



# --------------------------------------------------------------------------- TC's own forms
# Rank-0 outputs written without parentheses, ``float X`` outputs, unsigned types and the
# ``<=>`` equivalence note (which changes nothing in the computation).

_add(
    "rank0_sum_all",
    """
def sum_all(float(N) I) -> (O) {
    O +=! I(r_n)
}
""",
    "sum_all",
    lambda rng: (_u(rng, 13),),
    lambda I: _o32(np.array(_d(I).sum())),
)

_add(
    "rank0_scalar_copy",
    """
def copy(float a, float(N) X) -> (b, float Top, Y) {
    b = a
    Top max=! X(r)
    Y(i) = X(i) * b - Top <=> axpy(b, X(i), Top)
}
""",
    "copy",
    lambda rng: (-1.75, _u(rng, 9)),
    lambda a, X: _o32(np.array(f32(a)), np.array(_d(X).max()), _d(X) * f64(f32(a)) - _d(X).max()),
)


def _uints(rng: np.random.Generator, n: int) -> tuple:
    big = rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False)
    big[:2] = (2**64 - 1, 2**63)
    return (big, rng.integers(1, 2**32, n, dtype=np.uint32),
            rng.integers(1, 2**16, n, dtype=np.uint16))


def _uints_oracle(A, B, C):
    Bw, Cw = B.astype(np.uint64), C.astype(np.uint32)
    return (A // Bw, A % Bw, A > Bw * Bw, np.maximum(A, Bw << np.uint64(31)),
            B // Cw + Cw, (A.astype(f64) * 0.25).astype(np.uint64), np.array(A.max()),
            np.array(A.min()))


_add(
    "uint_mixed",
    """
def uints(uint64(N) A, uint32(N) B, uint16(N) C) -> (Q, R, G, M, D, F, Hi, Lo) {
    Q(i) = A(i) / B(i)
    R(i) = A(i) % B(i)
    G(i) = A(i) > uint64(B(i)) * B(i)
    M(i) = max(A(i), uint64(B(i)) * 2147483648)
    D(i) = B(i) / C(i) + C(i)
    F(i) = uint64(double(A(i)) * 0.25)
    Hi max=! A(r)
    Lo min=! A(r)
}
""",
    "uints",
    lambda rng: _uints(rng, 10),
    _uints_oracle,
)

_add(
    "equivalent_matvec",
    """
def matvec(float(M,K) A, float(K) x) -> (y) {
    y(i) +=! A(i, k) * x(k) <=> gemv(A(i, k), x(k))
}
""",
    "matvec",
    lambda rng: (_u(rng, 6, 7), _u(rng, 7)),
    lambda A, x: _o32(_d(A) @ _d(x)),
)


def _shift_pad(I):
    O = np.zeros((I.shape[0] + 1, I.shape[1] + 2))
    O[1:, 2:] = _d(I)                              # h in 1:H+1, w in 2:W+2; row 0, cols 0-1 stay 0
    return _o32(O)


_add(
    "shift_pad",
    """
def shift_pad(float(H,W) I) -> (O) {
    O(h, w) = I(h - 1, w - 2)
}
""",
    "shift_pad",
    lambda rng: (_u(rng, 5, 6),),
    _shift_pad,
)


def _conv_grad_input(dO, Wt):
    N, K = len(dO), len(Wt)
    dI = np.zeros(N)                               # i in K-1:N (every k reads dO): size N
    for i in range(K - 1, N):
        dI[i] = sum(_d(dO)[i - k] * _d(Wt)[k] for k in range(K))
    return _o32(dI)


_add(
    "conv_grad_input",
    """
def conv_grad_input(float(N) dO, float(K) Wt) -> (dI) {
    dI(i) +=! dO(i - k) * Wt(k)
}
""",
    "conv_grad_input",
    lambda rng: (_u(rng, 9), _u(rng, 3)),
    _conv_grad_input,
)


def _negative_divmod_inputs(rng):
    A = rng.integers(-20, 21, size=10).astype(np.int32)
    B = (rng.integers(1, 6, size=10) * np.where(rng.random(10) < 0.5, -1, 1)).astype(np.int32)
    A[:6], B[:6] = [-7, 7, -7, 7, -6, -1], [2, 2, -2, -2, 4, 3]
    return A, B


def _negative_divmod(A, B):
    i = np.arange(2 * len(A) + 1)                  # (i - 5) / 2 + 2 in 0:N: i in 0:2N+1
    return (_tdiv(A, B), np.fmod(A, B), A // B, A % B,
            (_tdiv(A, -4) + np.fmod(A, -4)).astype(np.int32),
            A[_tdiv(i - 5, 2) + 2], A[np.fmod(np.arange(len(A)) - 3, 3) + 2])


_add(
    "negative_divmod",
    """
def negative_divmod(int32(N) A, int32(N) B) -> (Q, R, FQ, FR, Ng, O, P) {
    Q(i) = A(i) / B(i)                  # C: -7 / 2 == -3, -7 % 2 == -1
    R(i) = A(i) % B(i)
    FQ(i) = floordiv(A(i), B(i))        # -7 floordiv 2 == -4, floormod == 1
    FR(i) = floormod(A(i), B(i))
    Ng(i) = A(i) / -4 + A(i) % -4
    O(i) = A((i - 5) / 2 + 2)           # i = 4 reads A(2): -1 / 2 == 0
    P(i) = A((i - 3) % 3 + 2) where i in 0:N
}
""",
    "negative_divmod",
    _negative_divmod_inputs,
    _negative_divmod,
)

# --------------------------------------------------------------------------- bits

def _bitwise_inputs(rng: np.random.Generator) -> tuple:
    A = rng.integers(-128, 128, 12).astype(np.int8)
    S = rng.integers(-128, 128, 12).astype(np.int8)
    A[:8], S[:8] = [-128, -8, 127, 64, -1, 3, -8, 5], [7, 8, 9, 127, -1, 0, -128, 1]
    U = rng.integers(0, 2**16, 12).astype(np.uint16)
    V = rng.integers(0, 2**16, 12).astype(np.uint16)
    V[:6] = [0, 1, 15, 16, 17, 65535]
    L = rng.integers(-2**63, 2**63, 12, dtype=np.int64)
    W = rng.integers(0, 2**64, 12, dtype=np.uint64)
    W[0] = 2**64 - 1
    return A, S, U, V, L, W


def _bitwise(A, S, U, V, L, W):
    i = np.arange(len(A))
    wide = S.astype(np.int64)
    return (A << S, A >> S, U << V, U >> V, L << wide, L >> wide, W >> S.astype(np.uint64),
            (A & S) | (A ^ np.int8(-3)), (U ^ V) & np.uint16(4095), ~A, ~U,
            (i << 2).astype(np.int8) | ((A + A) >> np.int8(1)))


_add(
    "bitwise",
    """
def bits(int8(N) A, int8(N) S, uint16(N) U, uint16(N) V, int64(N) L, uint64(N) W)
    -> (Sl, Sr, Ul, Ur, Ll, Lr, Wr, Ab, Ub, Nt, Un, Ix) {
    Sl(i) = A(i) << S(i)                # a count outside 0:8 gives the sign fill
    Sr(i) = A(i) >> S(i)
    Ul(i) = U(i) << V(i)
    Ur(i) = U(i) >> V(i)
    Ll(i) = L(i) << S(i)
    Lr(i) = L(i) >> S(i)
    Wr(i) = W(i) >> uint64(S(i))
    Ab(i) = A(i) & S(i) | A(i) ^ -3
    Ub(i) = (U(i) ^ V(i)) & 4095
    Nt(i) = ~A(i)
    Un(i) = ~U(i)
    Ix(i) = i << 2 | A(i) + A(i) >> 1   # the int8 sum wraps before the shift
}
""",
    "bits",
    _bitwise_inputs,
    _bitwise,
)


def _reinterpret_inputs(rng: np.random.Generator) -> tuple:
    F = _u(rng, 10, lo=-3.0, hi=3.0)
    I = rng.integers(0, 2**30, 10).astype(np.int32)   # the bits of finite floats
    return (F, I, F.astype(f16), F.astype(bf16), F.astype(f64),
            rng.integers(-128, 128, 10).astype(np.int8), rng.random(10) < 0.5)


def _reinterpret(F, I, H, B, D, C, P):
    return (F.view(np.int32), (I + 1).view(f32), H.view(np.uint16), -H, B.view(np.int16),
            D.view(np.uint64), C.view(np.uint8), P.astype(np.uint8),
            (B.view(np.int16) + np.int16(1)).view(bf16))


_add(
    "reinterpret",
    """
def reinterpret(float(N) F, int32(N) I, half(N) H, bfloat16(N) B, double(N) D, int8(N) C,
                bool(N) P) -> (Fi, If, Hu, Hn, Bi, Du, Cu, Pu, Bn) {
    Fi(i) = as_int32(F(i))
    If(i) = as_float32(I(i) + 1)
    Hu(i) = as_uint16(H(i))
    Hn(i) = as_float16(as_int16(H(i)) ^ -32768)      # the sign bit flipped
    Bi(i) = as_int16(B(i))
    Du(i) = as_uint64(D(i))
    Cu(i) = as_uint8(C(i))
    Pu(i) = as_uint8(P(i))
    Bn(i) = as_bfloat16(as_int16(B(i)) + 1)          # the next bfloat16 away from 0
}
""",
    "reinterpret",
    _reinterpret_inputs,
    _reinterpret,
)

# --------------------------------------------------------------------------- TC's special functions

def _kaiser_oracle(X, T, Beta):
    W = (np.i0(Beta[0] * np.sqrt(1.0 - T.astype(f64) ** 2)) / np.i0(Beta[0])).astype(f32)
    return W, X * W


_add(
    "kaiser_window",
    """
def kaiser(float(N) X, float(N) T, float(1) Beta) -> (W, Y) {
    W(n) = cyl_bessel_i0(Beta(0) * sqrt(1.0 - T(n) * T(n))) / cyl_bessel_i0(Beta(0))
    Y(n) = X(n) * W(n)
}
""",
    "kaiser",
    lambda rng: (_u(rng, 33), np.linspace(-1, 1, 33, dtype=f32), np.array([8.6], f32)),
    _kaiser_oracle,
)


def _binomial_inputs(rng: np.random.Generator) -> tuple:
    M = rng.integers(1, 60, 24).astype(f32)
    K = np.floor(rng.uniform(0, 1, 24) * (M + 1)).astype(f32)
    U = rng.uniform(0.001, 0.999, 24).astype(f32)
    X = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, -3.2] * 3, f32)
    return M, K, U, X


def _binomial_oracle(M, K, U, X):
    import scipy.special as sp
    M, K, U = (a.astype(f64) for a in (M, K, U))
    L = sp.gammaln(M + 1) - sp.gammaln(K + 1) - sp.gammaln(M - K + 1)
    P = np.exp(L + K * np.log(0.3) + (M - K) * np.log(0.7))
    return (L.astype(f32), P.astype(f32), (2.0 + 0.5 * sp.ndtri(U)).astype(f32),
            (np.sign(X) * np.floor(np.abs(X.astype(f64)) + 0.5)).astype(f32), np.rint(X))


_add(
    "binomial_and_quantiles",
    """
def binomial(float(N) M, float(N) K, float(N) U, float(N) X) -> (L, P, Q, R, E) {
    L(i) = lgamma(M(i) + 1.0) - lgamma(K(i) + 1.0) - lgamma(M(i) - K(i) + 1.0)
    P(i) = exp(L(i) + K(i) * log(0.3) + (M(i) - K(i)) * log(0.7))
    Q(i) = fma(0.5, normcdfinv(U(i)), 2.0)
    R(i) = round(X(i))                  # half away from zero, like CUDA's roundf
    E(i) = rint(X(i))                   # half to even
}
""",
    "binomial",
    _binomial_inputs,
    _binomial_oracle,
)

PROGRAMS_BY_NAME: dict[str, Program] = {p.name: p for p in PROGRAMS}
assert len(PROGRAMS_BY_NAME) == len(PROGRAMS), "program names must be unique"

__all__ = ["Program", "PROGRAMS", "PROGRAMS_BY_NAME"]
