"""TC range inference: inferred index ranges and output sizes, and the refusals."""

import pytest

import polyfuse as pf
from polyfuse.frontends.tc import parse_definition
from polyfuse.ir.comprehension import format_expr


def ranges(source: str, statement: int = 0) -> dict[str, str]:
    st = parse_definition(source).statements[statement]
    return {r.index: f"{format_expr(r.lo)}:{format_expr(r.hi)}" for r in st.ranges}


def shapes(source: str) -> dict[str, tuple[str, ...]]:
    d = parse_definition(source)
    return {t.name: tuple(format_expr(s) for s in t.shape) for t in d.outputs}


CASES = [
    # (source, expected ranges of statement 0, expected output shapes)
    ("def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
     {"m": "0:M", "n": "0:N", "k": "0:K"}, {"C": ("M", "N")}),
    ("def f(float(N,C,H,W) I, float(M,C,KH,KW) W1) -> (O) {"
     " O(n,m,h,w) +=! I(n,c,2*h+kh,2*w+kw) * W1(m,c,kh,kw) }",
     {"n": "0:N", "m": "0:M", "h": "0:floordiv(H - KH, 2) + 1", "w": "0:floordiv(W - KW, 2) + 1",
      "c": "0:C", "kh": "0:KH", "kw": "0:KW"},
     {"O": ("N", "M", "floordiv(H - KH, 2) + 1", "floordiv(W - KW, 2) + 1")}),
    ("def f(float(N) I) -> (O) { O(i) = I(i-1) + I(i) + I(i+1) }",
     {"i": "1:N - 1"}, {"O": ("N - 1",)}),
    ("def f(float(H) I) -> (O) { O(h) max=! I(3*h + kh) where kh in 0:4 }",
     {"h": "0:floordiv(H - 4, 3) + 1", "kh": "0:4"}, {"O": ("floordiv(H - 4, 3) + 1",)}),
    ("def f(float(N) I) -> (O) { O(i) = I(i / 2) }",
     {"i": "0:2 * N"}, {"O": ("2 * N",)}),
    # '/' truncates as in C: i in 2:2N+3 keeps (i - 3) / 2 in 0:N (i = 2 gives -1 / 2 == 0)
    ("def f(float(N) I) -> (O) { O(i) = I((i - 3) / 2) }",
     {"i": "2:2 * N + 3"}, {"O": ("2 * N + 3",)}),
    # a reduction index is not floored at 0: k = -1 reads I(-1 / 2) == I(0)
    ("def f(float(N) I) -> (O) { O(i) +=! I(k / 2) where i in 0:1 }",
     {"i": "0:1", "k": "-1:2 * N"}, {"O": ("1",)}),
    ("def f(float(N) I) -> (O) { O(i) = I(i / 2 - 1) }",
     {"i": "2:2 * N + 2"}, {"O": ("2 * N + 2",)}),
    ("def f(float(N) I) -> (O) { O(i) = I(N - 1 - i) }",
     {"i": "0:N"}, {"O": ("N",)}),
    ("def f(float(N) I) -> (O) { O(i) = I(-i + 3) }",
     {"i": "max(0, 4 - N):4"}, None),  # 0 <= 3 - i <= N - 1, and i >= 0,
    ("def f(float(N) A, float(M) B) -> (O) { O(i) = A(i) + B(i) }",
     {"i": "0:min(M, N)"}, {"O": ("min(M, N)",)}),
    ("def f(float(N) A, float(M) B) -> (O) { O(i) = i < N ? A(i) : B(i - N) where i in 0:N+M }",
     {"i": "0:M + N"}, {"O": ("M + N",)}),
    ("def f(float(N) A) -> (O) { O(i) +=! A(i + r) where r in 0:3 }",
     {"i": "0:N - 2", "r": "0:3"}, {"O": ("N - 2",)}),
    ("def f(float(N) A, float(K) B) -> (O) { O(i) = A(i) where exists B(i + 1) }",
     {"i": "0:min(N, K - 1)"}, None),
    ("def f(float(N) A) -> (O) { O(i) = A(j) where j = i + 1 }",
     {"i": "0:N - 1"}, None),
    ("def f(float(V,D) E, int32(B) Idx) -> (O) { O(b,d) = E(Idx(b), d) }",
     {"b": "0:B", "d": "0:D"}, {"O": ("B", "D")}),
    ("def f(float(N,N) A) -> (O) { O(i) = A(i, i) }", {"i": "0:N"}, {"O": ("N",)}),
]


@pytest.mark.unit
@pytest.mark.parametrize("source,expected,outputs", CASES)
def test_inferred_ranges(source, expected, outputs):
    assert ranges(source) == expected
    if outputs is not None:
        assert shapes(source) == outputs


@pytest.mark.unit
def test_later_statement_is_bounded_by_the_tensor_it_writes():
    src = """def f(float(N) A) -> (O) {
      O(i) = A(i)
      O(i) = O(i) * 2 where i in 0:N
      O(i) += A(i + 1)
    }"""
    d = parse_definition(src)
    assert format_expr(d.statements[2].range_of("i").hi) == "N - 1"


@pytest.mark.unit
def test_lhs_constrained_by_declared_output_shape():
    src = "def f(float(N) A) -> (float(N) O) { O(i) +=! A(i + j) where j in 0:2 }"
    st = parse_definition(src).statements[0]
    assert format_expr(st.range_of("i").hi) == "N - 1"


@pytest.mark.unit
@pytest.mark.parametrize("source,index,col", [
    ("def f(float(N) A) -> (O) { O(i) +=! A(i + j) }", "j", 43),
    ("def f(float(N) A) -> (O) { O(i, j) = A(i) }", "j", 33),
    ("def f(float(N) A) -> (O) { O(i) = A(2 * i * i) }", "i", 30),
])
def test_unresolved_index_is_refused_with_a_where_hint(source, index, col):
    with pytest.raises(pf.RangeInferenceError) as info:
        pf.define(source)
    err = info.value
    assert f"index '{index}'" in err.message
    assert err.hint is not None and "where" in err.hint
    assert (err.line, err.col) == (1, col)


@pytest.mark.unit
def test_inferred_range_runs_in_bounds_and_shrinks_output():
    import numpy as np
    mod = pf.define("def f(float(H) I) -> (O) { O(h) max=! I(3*h + kh) where kh in 0:4 }")
    x = np.arange(14, dtype=np.float32)
    out = mod.f(x)
    assert out.shape == ((14 - 4) // 3 + 1,)
    np.testing.assert_array_equal(out, [x[3 * h:3 * h + 4].max() for h in range(out.shape[0])])


@pytest.mark.parametrize("target", ["reference", "x86"])
def test_truncating_division_range_runs_in_bounds(target):
    import numpy as np
    mod = pf.define("def f(float(N) I) -> (O) { O(i) = I((i - 3) / 2) }", target=target)
    x = np.arange(1, 5, dtype=np.float32)
    out = mod.f(x)
    i = np.arange(2, 2 * 4 + 3)
    want = np.zeros(2 * 4 + 3, np.float32)
    want[i] = x[np.trunc((i - 3) / 2).astype(int)]   # i = 2 reads I(0): -1 / 2 == 0
    np.testing.assert_array_equal(out, want)


@pytest.mark.unit
def test_strided_window_wider_than_input_gives_an_empty_output():
    import numpy as np
    # floordiv(H - 3, 2) + 1 is 0 for H = 2; C's '/' would give 1 and read out of bounds
    mod = pf.define("def f(float(H) I) -> (O) { O(h) +=! I(2*h + kh) where kh in 0:3 }")
    assert mod.f(np.ones(2, np.float32)).shape == (0,)
    np.testing.assert_array_equal(mod.f(np.arange(5, dtype=np.float32)), [3.0, 9.0])
