"""Float arithmetic on CPU targets: a multiply and the add it feeds may fuse into one FMA
(one rounding), and nothing else is relaxed."""

import numpy as np
import pytest

import polyfuse as pf

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


@pytest.mark.parametrize("target, fma, unfused", [("x86:skylake-avx512", "vfmadd", "vmulps"),
                                                 ("aarch64", "fmla", "fmul")])
def test_multiply_adds_fuse(target, fma, unfused):
    a = np.ones((64, 64), np.float32)
    asm = pf.define(MM, target=target).mm.specialize(a, a).stages["asm"]
    assert fma in asm and unfused not in asm


def test_fused_multiply_add_rounds_once():
    """x*x - p with p the rounded x*x is the rounding error of the product: exactly what
    an FMA keeps (0 when the multiply is rounded first)."""
    k = pf.define("def f(float(N) X, float(N) P) -> (Y) { Y(i) = X(i) * X(i) - P(i) }", target="host").f
    x = (1 + np.arange(1, 65, dtype=np.float32) * np.float32(2.0 ** -13)).astype(np.float32)
    p = x * x
    exact = x.astype(np.float64) ** 2 - p.astype(np.float64)
    y = k(x, p)
    assert np.any(exact != 0)
    np.testing.assert_array_equal(y, exact.astype(np.float32))


def test_no_reassociation():
    """(a + b) - b is not simplified to a: 1e8 + 1 rounds to 1e8 in float32."""
    k = pf.define("def f(float(N) A, float(N) B) -> (Y) { Y(i) = (A(i) + B(i)) - B(i) }", target="host").f
    a = np.ones(32, np.float32)
    b = np.full(32, 1e8, np.float32)
    np.testing.assert_array_equal(k(a, b), np.zeros(32, np.float32))
    c = pf.define("def g(float(N) A) -> (Y) { Y(i) = A(i) != A(i) ? 1.0 : 0.0 }", target="host").g
    np.testing.assert_array_equal(c(np.array([np.nan, 1.0] * 8, np.float32)), np.array([1.0, 0.0] * 8, np.float32))
