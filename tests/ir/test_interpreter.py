"""Semantics of the reference interpreter, each checked against plain numpy."""

import ml_dtypes
import numpy as np
import pytest

import polyfuse as pf
import polyfuse.ir.comprehension_interpreter as interp

pytestmark = pytest.mark.unit


def run(source, *args):
    mod = pf.define(source)
    return getattr(mod, next(iter(mod)).name)(*args)


def test_chunked_evaluation_equals_whole_box(monkeypatch):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((33, 17)).astype(np.float32)
    b = rng.standard_normal((17, 29)).astype(np.float32)
    src = "def mm(float(M,K) A, float(K,N) B) -> (C, D) { C(m,n) +=! A(m,k) * B(k,n)\n D(m,n) max=! A(m,k) * B(k,n) }"
    whole = run(src, a, b)
    monkeypatch.setattr(interp, "MAX_BOX", 64)  # forces splits along output and reduction axes
    chunked = run(src, a, b)
    np.testing.assert_allclose(chunked[0], whole[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(chunked[1], whole[1])
    np.testing.assert_allclose(whole[0], a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(whole[1], (a[:, :, None] * b[None]).max(1))


def test_reduction_identities_and_empty_ranges():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    src = """def r(float(N, M) X) -> (S, P, Mx, Mn, E) {
      S(i) +=! X(i, j)
      P(i) *=! X(i, j) + 1
      Mx(i) max=! X(i, j)
      Mn(i) min=! X(i, j)
      E(i) max=! X(i, j) where j in 0:0
    }"""
    s, p, mx, mn, e = run(src, x)
    np.testing.assert_array_equal(s, x.sum(1))
    np.testing.assert_array_equal(p, (x + 1).prod(1))
    np.testing.assert_array_equal(mx, x.max(1))
    np.testing.assert_array_equal(mn, x.min(1))
    np.testing.assert_array_equal(e, [-np.inf, -np.inf])  # max over nothing is the identity


def test_accumulating_statement_adds_to_earlier_values():
    x = np.arange(4, dtype=np.float32)
    out = run("def f(float(N) X) -> (O) { O(i) = X(i)\n O(i) += X(j) * 2 where j in 0:2 }", x)
    np.testing.assert_array_equal(out, x + 2 * (x[0] + x[1]))


def test_unwritten_output_elements_are_zero():
    x = np.arange(5, dtype=np.float32)
    out = run("def f(float(N) I) -> (O) { O(i) = I(i - 1) + I(i + 1) }", x)
    np.testing.assert_array_equal(out, [0, x[0] + x[2], x[1] + x[3], x[2] + x[4]])


def test_only_the_chosen_side_of_a_select_is_read():
    a = np.array([1, 2, 3], np.float32)
    b = np.array([10, 20], np.float32)
    out = run("def c(float(N) A, float(M) B) -> (O) { O(i) = i < N ? A(i) : B(i - N) where i in 0:N+M }", a, b)
    np.testing.assert_array_equal(out, np.concatenate([a, b]))


def test_integer_division_and_modulo_truncate_as_in_c():
    x = np.array([-7, -1, 0, 5, 7], np.int32)
    q, r = run("def d(int32(N) X) -> (Q, R) { Q(i) = X(i) / 2\n R(i) = X(i) % 3 }", x)
    np.testing.assert_array_equal(q, [-3, 0, 0, 2, 3])   # np.trunc(x / 2)
    np.testing.assert_array_equal(r, np.fmod(x, 3))      # [-1, -1, 0, 2, 1]
    assert q.dtype == np.int32


def test_floordiv_and_floormod_round_down():
    x = np.array([-7, -1, 0, 5, 7], np.int32)
    q, r = run("def d(int32(N) X) -> (Q, R) { Q(i) = floordiv(X(i), 2)\n R(i) = floormod(X(i), -3) }", x)
    np.testing.assert_array_equal(q, [-4, -1, 0, 2, 3])
    np.testing.assert_array_equal(r, [-1, -1, 0, -1, -2])  # the divisor's sign
    assert q.dtype == np.int32


def test_int32_sums_wrap_like_c():
    x = np.full((1, 3), 2**30, np.int32)
    s = run("def s(int32(N, M) X) -> (S) { S(i) +=! X(i, j) }", x)
    assert s.dtype == np.int32
    np.testing.assert_array_equal(s, np.add.reduce(x, axis=1, dtype=np.int32))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_16_bit_floats_compute_in_float32_and_round_on_store(dtype):
    x = (np.arange(64, dtype=np.float32) / 7).astype(dtype)
    y = run(f"def f({np.dtype(dtype).name}(N) X) -> (Y, S) {{ Y(i) = X(i) * X(i) + 1\n S() +=! X(i) }}", x)
    x32 = x.astype(np.float32)
    assert y[0].dtype == dtype
    np.testing.assert_array_equal(y[0], (x32 * x32 + 1).astype(dtype))
    np.testing.assert_allclose(y[1].astype(np.float32), x32.sum(), rtol=1e-2)


def test_builtins_match_numpy():
    x = np.linspace(0.1, 2.0, 11).astype(np.float32)
    import math
    outs = run("""def f(float(N) X) -> (A, B, C, D, E) {
      A(i) = erf(X(i))
      B(i) = sigmoid(X(i))
      C(i) = rsqrt(X(i))
      D(i) = pow(X(i), 2.5)
      E(i) = fmax(tanh(X(i)), 0.5)
    }""", x)
    np.testing.assert_allclose(outs[0], [math.erf(v) for v in x], rtol=1e-6)
    np.testing.assert_allclose(outs[1], 1 / (1 + np.exp(-x)), rtol=1e-6)
    np.testing.assert_allclose(outs[2], 1 / np.sqrt(x), rtol=1e-6)
    np.testing.assert_allclose(outs[3], x ** 2.5, rtol=1e-6)
    np.testing.assert_allclose(outs[4], np.maximum(np.tanh(x), 0.5), rtol=1e-6)


def test_where_range_that_writes_outside_the_output_is_refused():
    mod = pf.define("def f(float(N) X) -> (O) { O(i) = X(i)\n O(i) = 1.0 where i in 0:N+1 }")
    with pytest.raises(pf.BoundsError, match="writes 'O' out of bounds"):
        mod.f(np.zeros(3, np.float32))


def test_read_out_of_bounds_names_tensor_dimension_and_point():
    mod = pf.define("def g(float(V, D) E, int32(B) Idx) -> (O) { O(b, d) = E(Idx(b), d) }")
    with pytest.raises(pf.BoundsError, match=r"E\(Idx\(b\), d\).*index -1 in dimension 0.*b=1"):
        mod.g(np.zeros((3, 2), np.float32), np.array([0, -1], np.int32))
