"""uint16, uint32 and uint64 on every target, exactly against numpy: uint64 values at and
above 2**63 divide, compare, convert and take max/min as unsigned numbers."""

import numpy as np
import pytest

import polyfuse as pf
from tests.arm_tools import needs_arm_tools
from tests.cuda.emulator import CXX
from tests.cuda.test_emulated import emulated  # noqa: F401  (a fixture)

U64 = """
def u64(uint64(N) A, uint64(N) B, uint64 s) -> (Q, R, L, M, N2, F, G, W, S, X, Y, Z) {
    Q(i) = A(i) / B(i)
    R(i) = A(i) % B(i)
    L(i) = A(i) < B(i)
    M(i) = max(A(i), B(i))
    N2(i) = min(A(i), s)
    F(i) = double(A(i))
    G(i) = uint64(F(i) * 0.5)
    W(i) = A(i) * B(i) + s
    S +=! A(r)
    X max=! A(r)
    Y min=! A(r)
    Z(i) = uint32(A(i))
}
"""

NARROW = """
def narrow(uint32(N) A, uint16(N) B) -> (S, D, P, C, H) {
    S(i) = A(i) + B(i)
    D(i) = A(i) / B(i)
    P(i) = A(i) % B(i) > 7 ? A(i) : uint32(B(i))
    C(i) = double(A(i))
    H(i) = uint16(A(i))
}
"""

BIG = np.array([2**64 - 1, 2**63 + 7, 5, 2**63, 0, 12345678901234567890, 2**63 - 1], np.uint64)
SMALL = np.array([3, 2**63 + 1, 2**63, 7, 9, 10**10, 2**64 - 2], np.uint64)
S = 2**64 - 3


def u64_oracle(A, B, s):
    s = np.uint64(s)
    with np.errstate(over="ignore"):
        W = A * B + s
    F = A.astype(np.float64)
    return (A // B, A % B, A < B, np.maximum(A, B), np.minimum(A, s), F,
            (F * 0.5).astype(np.uint64), W, np.array(A.sum(dtype=np.uint64)),
            np.array(A.max()), np.array(A.min()), A.astype(np.uint32))


def narrow_inputs():
    A = np.array([2**32 - 1, 2**31 + 5, 70000, 9, 0, 123456], np.uint32)
    B = np.array([2**16 - 1, 1, 3, 2**15 + 3, 7, 1000], np.uint16)
    return A, B


def narrow_oracle(A, B):
    Bw = B.astype(np.uint32)
    return (A + Bw, A // Bw, np.where(A % Bw > 7, A, Bw), A.astype(np.float64), A.astype(np.uint16))


def check(target):
    mod = pf.define(U64 + NARROW, target=target)
    for got, want in zip(mod.u64(BIG, SMALL, S), u64_oracle(BIG, SMALL, S), strict=True):
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want)
    A, B = narrow_inputs()
    for got, want in zip(mod.narrow(A, B), narrow_oracle(A, B), strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("target", ["reference", "host"])
def test_unsigned_on_the_cpu(target):
    check(target)


@needs_arm_tools
def test_unsigned_on_aarch64():
    check("aarch64")


@pytest.mark.skipif(CXX is None, reason="the emulator needs a C++20 compiler")
def test_unsigned_in_cuda_c_on_the_emulator(emulated):  # noqa: F811
    check("cuda")
    assert emulated.launches


@pytest.mark.unit
def test_unsigned_literals_wrap_like_c_conversions():
    d = pf.define("def f(uint64(N) A) -> (B) { B(i) = A(i) + uint64(-1) }")
    A = np.array([1, 2, 2**63], np.uint64)
    np.testing.assert_array_equal(d.f(A), A - np.uint64(1))


@pytest.mark.unit
def test_unsigned_types_print_and_parse_back():
    from polyfuse.frontends.tc import parse
    m = parse(U64 + NARROW)
    assert parse(str(m)) == m
    assert "uint64(N) A" in str(m) and "uint16(N) B" in str(m)


@pytest.mark.unit
def test_uint64_kernel_arguments_are_checked():
    mod = pf.define(U64, target="host")
    with pytest.raises(pf.DTypeError, match="uint64"):
        mod.u64(BIG.astype(np.int64), SMALL, S)
