"""TC's in-place form: ``kernel(..., out=arrays)`` writes into the caller's arrays, and a
reduction without ``!`` accumulates into their contents, on every target, against numpy;
and every refusal of a bad ``out=`` before native code runs."""

import numpy as np
import pytest

import polyfuse as pf
from tests.arm_tools import AARCH64
from tests.cuda.emulator import CXX
from tests.cuda.test_emulated import emulated  # noqa: F401 (a fixture)

SOURCE = """
def mm_acc(float(M,K) A, float(K,N) B) -> (C) { C(m,n) += A(m,k) * B(k,n) }
def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }
def row_max_acc(float(N,M) X) -> (R) { R(i) max= X(i,j) }
def count_acc(int32(N,M) X) -> (S) { S(i) += X(i,j) }
def part(float(N) I) -> (O) { O(i) = I(i) where i in 2:N }
def part_sum(float(N,M) X) -> (O) { O(i) +=! X(i,j) where i in 1:N }
def two(float(N) X) -> (S, P) {
  S(i) += X(i) * 2.0
  P(i) = S(i) + 1.0
}
"""

TARGETS = ["reference", "x86", AARCH64]
rng = np.random.default_rng(7)
A = rng.standard_normal((5, 7)).astype(np.float32)
B = rng.standard_normal((7, 3)).astype(np.float32)
C0 = rng.standard_normal((5, 3)).astype(np.float32)
MM = A.astype(np.float64) @ B


def module(target):
    return pf.define(SOURCE, target=target)


def check_all(mod, wrap=lambda a: a):
    """Every in-place form on ``mod``; ``wrap`` turns an output array into what is given."""
    C = C0.copy()
    given = wrap(C)
    assert mod.mm_acc(A, B, out=given) is given
    np.testing.assert_allclose(C, C0 + MM, rtol=1e-5, atol=1e-5)
    mod.mm_acc(A, B, out=given)                    # a second call accumulates again
    np.testing.assert_allclose(C, C0 + 2 * MM, rtol=1e-5, atol=1e-5)

    C = np.full((5, 3), 1e6, np.float32)           # '+=!' starts from zero whatever is given
    mod.mm(A, B, out=wrap(C))
    np.testing.assert_allclose(C, MM, rtol=1e-5, atol=1e-5)

    X = rng.standard_normal((4, 6)).astype(np.float32)
    R0 = np.array([10, -10, 0, 0.5], np.float32)
    R = R0.copy()
    mod.row_max_acc(X, out=wrap(R))
    np.testing.assert_array_equal(R, np.maximum(R0, X.max(axis=1)))

    Xi = rng.integers(-5, 5, (3, 8)).astype(np.int32)
    S0 = np.array([100, -7, 2**31 - 3], np.int32)
    S = S0.copy()
    mod.count_acc(Xi, out=wrap(S))
    want = (S0.astype(np.int64) + Xi.sum(axis=1)).astype(np.int64)
    np.testing.assert_array_equal(S, ((want + 2**31) % 2**32 - 2**31).astype(np.int32))  # wraps like C

    I = np.arange(6, dtype=np.float32)
    O = np.full(6, -1, np.float32)                 # elements no statement writes keep theirs
    mod.part(I, out=wrap(O))
    np.testing.assert_array_equal(O, [-1, -1, 2, 3, 4, 5])

    Xs = rng.standard_normal((4, 3)).astype(np.float32)
    O = np.full(4, 9, np.float32)                  # a partial '+=!' zeroes only what it writes
    mod.part_sum(Xs, out=wrap(O))
    np.testing.assert_allclose(O, [9, *Xs[1:].astype(np.float64).sum(axis=1)], rtol=1e-6)

    x = np.array([1, 2, 3], np.float32)
    S, P = np.array([10, 20, 30], np.float32), np.zeros(3, np.float32)
    gs, gp = wrap(S), wrap(P)
    got = mod.two(x, out=(gs, gp))
    assert got[0] is gs and got[1] is gp
    np.testing.assert_array_equal(S, [12, 24, 36])
    np.testing.assert_array_equal(P, [13, 25, 37])


@pytest.mark.parametrize("target", TARGETS)
def test_outputs_given_with_out_are_updated_in_place(target):
    check_all(module(target))


@pytest.mark.parametrize("target", TARGETS)
def test_without_out_ordinary_definitions_start_from_zeros(target):
    mod = module(target)
    np.testing.assert_array_equal(mod.part(np.arange(5, dtype=np.float32)), [0, 0, 2, 3, 4])
    np.testing.assert_allclose(mod.mm(A, B), MM, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mod.mm(A, B), MM, rtol=1e-5, atol=1e-5)   # the fast path


@pytest.mark.parametrize("target", TARGETS)
def test_a_reduction_without_bang_needs_out(target):
    mod = module(target)
    with pytest.raises(pf.ArgumentError, match=r"output 'C' starts from the caller's contents.*out="):
        mod.mm_acc(A, B)
    C = C0.copy()
    mod.mm_acc(A, B, out=C)         # with out= it runs, and a call without it is still refused
    np.testing.assert_allclose(C, C0 + MM, rtol=1e-5, atol=1e-5)
    with pytest.raises(pf.ArgumentError, match=r"output 'C' starts from the caller's contents"):
        mod.mm_acc(A, B)
    with pytest.raises(pf.ArgumentError, match=r"'S'.*out=\(S, P\)"):
        mod.two(np.ones(3, np.float32))


def test_an_unaligned_output_on_the_host_is_updated_through_an_aligned_copy():
    mod = module("x86")
    storage = np.zeros(5 * 3 + 16, np.float32)
    C = storage[1:16].reshape(5, 3)                # 4 bytes past an aligned start at best
    if C.ctypes.data % 64 == 0:
        C = storage[2:17].reshape(5, 3)
    C[...] = C0
    mod.mm_acc(A, B, out=C)
    np.testing.assert_allclose(C, C0 + MM, rtol=1e-5, atol=1e-5)
    assert storage[0] == 0


@pytest.mark.parametrize("target", ["reference", "x86"])
def test_bad_out_arrays_are_refused_before_anything_runs(target):
    mod = module(target)
    mod.mm_acc(A, B, out=C0.copy())   # a call like it before: the fast path checks out= the same
    C = C0.copy()
    with pytest.raises(pf.ShapeError, match=r"output 'C' must have shape \(5, 3\), got \(3, 5\)"):
        mod.mm_acc(A, B, out=np.zeros((3, 5), np.float32))
    with pytest.raises(pf.DTypeError, match=r"output 'C' must be float32, got float64"):
        mod.mm_acc(A, B, out=np.zeros((5, 3)))
    with pytest.raises(pf.ArgumentError, match=r"output 'C' is not C-contiguous"):
        mod.mm_acc(A, B, out=np.zeros((5, 6), np.float32)[:, ::2])
    with pytest.raises(pf.ArgumentError, match=r"output 'C' is not C-contiguous"):
        mod.mm_acc(A, B, out=np.asfortranarray(np.zeros((5, 3), np.float32)))
    read_only = C.copy()
    read_only.setflags(write=False)
    with pytest.raises(pf.ArgumentError, match=r"output 'C' is read-only"):
        mod.mm_acc(A, B, out=read_only)
    with pytest.raises(pf.ArgumentError, match=r"output 'C' must be a numpy array, got list"):
        mod.mm_acc(A, B, out=C.tolist())
    with pytest.raises(pf.ArgumentError, match=r"got 2 arrays for 1 output \(C\)"):
        mod.mm_acc(A, B, out=(C, C.copy()))
    x = np.ones(3, np.float32)
    with pytest.raises(pf.ArgumentError, match=r"got 1 array for 2 outputs \(S, P\)"):
        mod.two(x, out=(np.zeros(3, np.float32),))
    with pytest.raises(pf.ArgumentError, match=r"out= takes a tuple of 2 arrays"):
        mod.two(x, out=np.zeros(3, np.float32))
    with pytest.raises(pf.ArgumentError, match=r"output 'S' shares memory with input 'X'"):
        mod.two(x, out=(x, np.zeros(3, np.float32)))
    S = np.zeros(3, np.float32)
    with pytest.raises(pf.ArgumentError, match=r"output 'P' shares memory with output 'S'"):
        mod.two(x, out=(S, S))
    np.testing.assert_array_equal(C, C0)           # nothing ran on any refusal
    np.testing.assert_array_equal(S, 0)


@pytest.mark.unit
def test_a_parameter_named_out_keeps_its_keyword():
    mod = pf.define("def f(float(N) out) -> (Y) { Y(i) = out(i) * 2.0 }")
    np.testing.assert_array_equal(mod.f(out=np.arange(3, dtype=np.float32)), [0, 2, 4])


def test_specialized_kernels_take_out_too():
    spec = module("x86").mm_acc.specialize(A, B, out=C0)
    C = C0.copy()
    assert spec(A, B, out=C) is C
    np.testing.assert_allclose(C, C0 + MM, rtol=1e-5, atol=1e-5)
    with pytest.raises(pf.ArgumentError, match="out="):
        spec(A, B)


class _CudaArray:
    """An array 'in GPU memory' for the emulator (whose device memory is host memory)."""

    def __init__(self, host: np.ndarray, read_only: bool = False) -> None:
        self.host = host
        self.read_only = read_only

    @property
    def __cuda_array_interface__(self):
        h = self.host
        return {"shape": h.shape, "typestr": h.dtype.str, "data": (h.ctypes.data, self.read_only),
                "version": 3, "strides": None}


needs_emulator = pytest.mark.skipif(CXX is None, reason="the emulator needs a C++20 compiler")


@needs_emulator
def test_cuda_copies_given_host_outputs_up_and_back(emulated):
    check_all(module("cuda"))


@needs_emulator
def test_cuda_updates_given_gpu_arrays_in_place(emulated):
    check_all(module("cuda"), _CudaArray)


@needs_emulator
def test_cuda_refuses_bad_gpu_out_arrays(emulated):
    mod = module("cuda")
    with pytest.raises(pf.ArgumentError, match=r"output 'C' is read-only"):
        mod.mm_acc(A, B, out=_CudaArray(C0.copy(), read_only=True))
    with pytest.raises(pf.ShapeError, match=r"output 'C' must have shape \(5, 3\)"):
        mod.mm_acc(A, B, out=_CudaArray(np.zeros((15,), np.float32)))
    a = _CudaArray(A)
    with pytest.raises(pf.ArgumentError, match=r"output 'C' shares memory with input 'A'"):
        mod.mm_acc(a, B, out=_CudaArray(A.reshape(-1)[:15].reshape(5, 3)))
    with pytest.raises(pf.ArgumentError, match=r"must be a numpy array, got _CudaArray"):
        module("x86").mm_acc(A, B, out=_CudaArray(C0.copy()))
