"""Integer `/` and `%` truncate as in C on every target, floordiv/floormod floor, against
numpy oracles (np.trunc, np.fmod; Python's exact ints for 64-bit values)."""

import numpy as np
import pytest

import polyfuse as pf
from tests.arm_tools import needs_arm_tools
from tests.cuda.emulator import CXX
from tests.cuda.test_emulated import emulated  # noqa: F401  (the fixture)

SOURCE = """
def dm(int64(N) A, int64(N) B, float64(N) X, float64(N) Y) -> (Q, R, FQ, FR, XQ, XR, XM) {
    Q(i) = A(i) / B(i)
    R(i) = A(i) % B(i)
    FQ(i) = floordiv(A(i), B(i))
    FR(i) = floormod(A(i), B(i))
    XQ(i) = floordiv(X(i), Y(i))
    XR(i) = floormod(X(i), Y(i))
    XM(i) = X(i) % Y(i)
}
"""

A = np.array([-7, 7, -7, 7, -6, 0, -1, 5, -2**62 - 3, 2**62 + 1, -2**63, 9], np.int64)
B = np.array([2, 2, -2, -2, 4, -3, 3, -1, 7, -5, -1, 0], np.int64)
X = np.array([-7.5, 7.5, -7.5, 7.5, -6.0, 0.25, -1.0, 5.0, -0.5, 3.0, 2.0, -9.0])
Y = np.array([2.0, 2.0, -2.0, -2.0, 4.0, -3.0, 3.0, -1.0, 7.0, -5.0, 0.5, 4.0])


def _wrap(v: int) -> int:
    return (v + 2**63) % 2**64 - 2**63


def _c_div(a: int, b: int) -> int:
    return 0 if b == 0 else _wrap(abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1))


def oracle():
    pairs = list(zip(A.tolist(), B.tolist()))
    q = np.array([_c_div(a, b) for a, b in pairs], np.int64)
    r = np.array([0 if b in (0, -1) else a - b * _c_div(a, b) for a, b in pairs], np.int64)
    fq = np.array([0 if b == 0 else _wrap(a // b) for a, b in pairs], np.int64)
    fr = np.array([0 if b in (0, -1) else a % b for a, b in pairs], np.int64)
    ok = (-2**52 < A) & (A < 2**52) & (B != 0)     # np.trunc / np.fmod agree where exact
    assert np.array_equal(q[ok], np.trunc(A[ok] / B[ok])) and np.array_equal(r[ok], np.fmod(A[ok], B[ok]))
    return q, r, fq, fr, np.floor(X / Y), np.mod(X, Y), np.mod(X, Y)


def _check(target: str) -> None:
    got = pf.define(SOURCE, target=target).dm(A, B, X, Y)
    for name, g, w in zip(["Q", "R", "FQ", "FR", "XQ", "XR", "XM"], got, oracle()):
        np.testing.assert_array_equal(g, w, err_msg=f"{name} on {target}")


@pytest.mark.unit
def test_c_semantics_spelled_out():
    q, r, fq, fr, *_ = oracle()
    assert (q[0], r[0], fq[0], fr[0]) == (-3, -1, -4, 1)       # -7 / 2, -7 % 2
    assert (q[3], r[3], fq[3], fr[3]) == (-3, 1, -4, -1)       # 7 / -2, 7 % -2
    assert q[10] == -2**63 and r[10] == 0 and q[11] == 0        # INT64_MIN / -1 wraps; / 0 is 0


@pytest.mark.parametrize("target", [
    "reference", "x86", pytest.param("aarch64", marks=needs_arm_tools),   # under qemu-user
    pytest.param("cuda", marks=pytest.mark.skipif(CXX is None, reason="the emulator needs C++20")),
])
def test_every_target(target, emulated):  # noqa: F811  (cuda runs on the emulator)
    _check(target)
    assert bool(emulated.launches) == (target == "cuda")
