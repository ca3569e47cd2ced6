"""The rules of reverse mode one at a time: builtins, reductions, versions of a tensor,
accesses, errors; and what derived definitions look like."""

import re

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.frontends.tc import parse, parse_definition
from polyfuse.lowering.autodiff import GradientError, gradients
from polyfuse.lowering.autodiff.widen import widen
from tests.autodiff.fd import check_gradients, run_gradient

UNARY = {
    (-1.5, 1.5): "exp exp2 exp10 expm1 tanh sinh cosh sigmoid erf erfc sin cos atan asinh sinpi "
                 "cospi cyl_bessel_i0 cyl_bessel_i1 j0 j1 normcdf erfcx fabs abs floor ceil round "
                 "trunc rint",
    (0.5, 2.0): "log log2 log10 sqrt rsqrt cbrt rcbrt y0 y1 logb",
    (-0.8, 0.8): "log1p tan asin acos atanh erfinv",
    (1.2, 3.0): "acosh",
    (0.2, 1.8): "erfcinv",
    (0.1, 0.9): "normcdfinv",
}
NARY = ["fmax(X(i), Y(i))", "fmin(X(i), Y(i))", "max(X(i), Y(i))", "min(X(i), Y(i))",
        "pow(X(i), Y(i))", "atan2(X(i), Y(i))", "fmod(X(i), Y(i))", "remainder(X(i), Y(i))",
        "floormod(X(i), Y(i))", "copysign(X(i), Y(i) - 1.0)", "fdim(X(i), Y(i))",
        "fdivide(X(i), Y(i))", "hypot(X(i), Y(i))", "rhypot(X(i), Y(i))",
        "fma(X(i), Y(i), X(i))", "norm3d(X(i), Y(i), X(i))", "rnorm3d(X(i), Y(i), Y(i))",
        "norm4d(X(i), Y(i), X(i), Y(i))", "rnorm4d(X(i), Y(i), X(i), Y(i))",
        "X(i) % Y(i)", "X(i) / Y(i) - -X(i)", "Y(i) > 1.0 ? X(i) * Y(i) : double(i) / X(i)"]


def _check(source: str, *args, rng=None) -> int:
    rng = rng or np.random.default_rng(0)
    return check_gradients(widen(parse_definition(source)), list(args), rng=rng)


@pytest.mark.unit
@pytest.mark.parametrize("fn,domain", [(f, d) for d, names in UNARY.items() for f in names.split()],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_unary_builtin(fn, domain):
    x = np.random.default_rng(1).uniform(*domain, 16)
    assert _check(f"def f(float(N) X) -> (O) {{ O(i) = {fn}(X(i)) }}", x) == 1


@pytest.mark.unit
@pytest.mark.parametrize("expr", NARY)
def test_builtin_of_several_arguments(expr):
    rng = np.random.default_rng(2)
    x, y = rng.uniform(0.5, 2.0, 16), rng.uniform(0.3, 1.7, 16)
    assert _check(f"def f(double(N) X, double(N) Y) -> (O) {{ O(i) = {expr} }}", x, y) == 2


def _grads(source: str, args: list, weights: list) -> dict[str, np.ndarray]:
    d = widen(parse_definition(source))
    return {g.wrt: run_gradient(g, d, args, weights) for g in gradients(d)}


@pytest.mark.unit
def test_max_reduction_shares_ties_evenly():
    # as torch.amax: two tied maxima get half each, as do the two sides of fmax
    a = np.array([[1.0, 3.0, 3.0, 2.0], [5.0, 4.0, 5.0, 5.0]])
    g = _grads("def f(float(M,N) A) -> (O) { O(i) max=! A(i,j) }", [a], [np.array([2.0, 3.0])])
    np.testing.assert_array_equal(g["A"], [[0, 1, 1, 0], [1, 0, 1, 1]])
    g = _grads("def f(float(N) X, float(N) Y) -> (O) { O(i) = fmax(X(i), Y(i)) }",
               [np.array([1.0, 2.0]), np.array([1.0, 3.0])], [np.array([1.0, 1.0])])
    np.testing.assert_array_equal(g["X"], [0.5, 0.0])
    np.testing.assert_array_equal(g["Y"], [0.5, 1.0])


@pytest.mark.unit
def test_min_reduction_routes_to_the_arg_min():
    a = np.random.default_rng(4).standard_normal((3, 5))
    g = _grads("def f(float(M,N) A) -> (O) { O(j) min=! A(i,j) }", [a], [np.ones(5)])
    expected = (a == a.min(axis=0)).astype(float)
    np.testing.assert_array_equal(g["A"], expected)


@pytest.mark.unit
def test_product_reduction_is_exact_at_zero():
    a = np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 4.0], [1.5, -2.0, 0.5]])
    g = _grads("def f(float(M,N) A) -> (P) { P(i) *=! A(i,j) }", [a], [np.array([1.0, 2.0, -1.0])])
    others = np.array([[np.prod(np.delete(row, j)) for j in range(3)] for row in a])
    np.testing.assert_allclose(g["A"], others * np.array([1.0, 2.0, -1.0])[:, None])


@pytest.mark.unit
@pytest.mark.parametrize("body", [
    # a partial overwrite keeps the old version's gradient outside the written range
    "O(i) = X(i) * X(i)\n O(i) = exp(X(i)) + O(i) where i in 1:3",
    # a reduction without ! accumulates into the old version
    "O(i) = X(i)\n O(i) += Y(i,j) * X(i)",
    "O(i) = X(i)\n O(i) *= Y(i,j)",
    "O(i) = X(i) * 0.5\n O(i) max= Y(i,j)",
    "O(i) = X(i)\n O(i) min= Y(i,j) where j in 1:N",
    # temporaries read by later statements, overwritten, read again
    "T(i) = sin(X(i))\n O(i) +=! T(i) * Y(i,j)\n T(i) = T(i) * O(i)\n O(i) = O(i) + T(i)",
])
def test_versions_of_a_tensor(body):
    rng = np.random.default_rng(5)
    src = f"def f(float(M) X, float(M,N) Y) -> (O, T) {{\n T(i) = X(i)\n {body}\n}}"
    if "T(i) = sin" in body:
        src = f"def f(float(M) X, float(M,N) Y) -> (O, T) {{\n {body}\n}}"
    assert _check(src, rng.uniform(-1, 1, 5), rng.uniform(-1, 1, (5, 4)), rng=rng) == 2


@pytest.mark.unit
def test_accesses_with_strides_shifts_diagonals_and_indirection():
    rng = np.random.default_rng(6)
    src = """
def f(float(N) X, float(M,M) D, int32(K) Idx, float(N,M) T) -> (O, P, Q, R) {
    O(i) +=! X(3*i + k) * X(i + 2) where k in 0:2
    P(i) = D(i, i) * D(i, M - 1 - i)
    Q(b) = X(Idx(b)) * X(Idx(b) / 2)
    R(j) +=! T(i, j) * X(floordiv(i * j, 3))
}"""
    args = [rng.uniform(-1, 1, 12), rng.uniform(-1, 1, (4, 4)),
            rng.integers(0, 12, 6).astype(np.int32), rng.uniform(-1, 1, (12, 4))]
    assert _check(src, *args, rng=rng) == 3


@pytest.mark.unit
def test_sum_of_a_value_independent_of_the_reduced_index():
    # O(i) = sum_j (X(i) + Y(j)): dX is N times dO
    rng = np.random.default_rng(8)
    assert _check("def f(float(M) X, float(N) Y) -> (O) { O(i) +=! X(i) + Y(j) }",
                  rng.uniform(size=3), rng.uniform(size=7), rng=rng) == 2


@pytest.mark.unit
def test_matmul_and_conv_gradients_are_one_statement_each():
    for src in ("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
                "def conv(float(N,C,H,W) I, float(M,C,KH,KW) Wt) -> (O) {"
                " O(n,m,h,w) +=! I(n,c,2*h+kh,2*w+kw) * Wt(m,c,kh,kw) }"):
        gs = gradients(parse_definition(src))
        assert len(gs) == 2
        assert all(len(g.definition.statements) == 1 and len(g.definition.outputs) == 1 for g in gs)
        text = pf.grad(src)
        assert len(parse(text).definitions) == 2


@pytest.mark.unit
def test_grad_text_parses_and_runs():
    text = pf.grad("def f(float(N) X, float(N) Y) -> (O) { O(i) = X(i) * Y(i) }", wrt="X")
    assert text.startswith("def f_grad_X(")
    x, y, g = (np.arange(1, 4, dtype=np.float32) * k for k in (1, 2, 3))
    got = pf.define(text).f_grad_X(y, g)
    np.testing.assert_allclose(got, g * y)


@pytest.mark.unit
def test_grad_picks_a_definition_by_name():
    src = "def a(float(N) X) -> (O) { O(i) = X(i) }\ndef b(float(N) X) -> (O) { O(i) = exp(X(i)) }"
    assert "def b_grad_X" in pf.grad(src, name="b") and "a_grad" not in pf.grad(src, name="b")
    with pytest.raises(pf.ArgumentError, match="no definition 'c'"):
        pf.grad(src, name="c")


@pytest.mark.unit
@pytest.mark.parametrize("src,message,where", [
    ("def f(float(N) X) -> (O) {\n  O(i) = lgamma(X(i))\n}", "lgamma() its derivative", (2, 10)),
    ("def f(float(N) X) -> (O) {\n  O(i) = nextafter(X(i), 0.0)\n}", "nextafter()", (2, 10)),
    ("def f(float(N) X) -> (O) {\n  O(i) += X(i)\n}", "accumulates into the caller's", (2, 3)),
    ("def f(float(N,M) X) -> (O) {\n  O(i) +=! X(i,j)\n  O(i) max= O(i) * X(i,j)\n}", "also reads it", (3, 3)),
])
def test_what_cannot_be_differentiated_names_the_statement(src, message, where):
    with pytest.raises(GradientError, match=re.escape(message)) as err:
        pf.grad(src)
    assert (err.value.line, err.value.col) == where
    assert "^" in str(err.value)


@pytest.mark.unit
def test_inputs_that_get_no_gradient():
    src = "def f(float(N) X, int32(N) K, float s) -> (O) { O(i) = s * X(i) * K(i) }"
    assert [g.wrt for g in gradients(parse_definition(src))] == ["X"]
    with pytest.raises(pf.ArgumentError, match="not a float tensor"):
        pf.grad(src, wrt="K")
    with pytest.raises(pf.ArgumentError, match="a scalar parameter"):
        pf.grad(src, wrt="s")
    with pytest.raises(pf.ArgumentError, match="not an input"):
        pf.grad(src, wrt="O")


def test_host_target_runs_derived_matmul_and_conv():
    rng = np.random.default_rng(9)
    for src, args in [
        ("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
         [rng.standard_normal((9, 6)), rng.standard_normal((6, 5))]),
        ("def conv(float(N,C,H,W) I, float(M,C,KH,KW) Wt) -> (O) {"
         " O(n,m,h,w) +=! I(n,c,2*h+kh,2*w+kw) * Wt(m,c,kh,kw) }",
         [rng.standard_normal((2, 3, 9, 8)), rng.standard_normal((4, 3, 3, 3))]),
    ]:
        d = parse_definition(src)
        args = [a.astype(np.float32) for a in args]
        out = getattr(pf.define(src), d.name)(*args)
        weights = [rng.standard_normal(out.shape).astype(np.float32)]
        for g in gradients(d):
            host = run_gradient(g, d, args, weights, target="host")
            reference = run_gradient(g, d, args, weights)
            np.testing.assert_allclose(host, reference, rtol=1e-4, atol=1e-4)


@pytest.mark.unit
def test_rank0_tensor_gets_a_gradient():
    rng = np.random.default_rng(10)
    assert _check("def f(float() s, float(N) X) -> (O, T) { O(i) = s * X(i)\n T +=! O(i) * s }",
                  np.array(1.5), rng.uniform(size=6), rng=rng) == 2
