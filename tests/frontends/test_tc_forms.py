"""TC forms taken from TC's own programs: rank-0 outputs written without parentheses,
``float X`` outputs, and the ``<=>`` equivalence note; each parsed, printed back, run on
every target against numpy, and rejected with a located error when malformed."""

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.frontends.tc import parse
from polyfuse.ir.comprehension import Equivalent, Read
from tests.arm_tools import needs_arm_tools
from tests.cuda.emulator import CXX
from tests.cuda.test_emulated import emulated  # noqa: F401  (a fixture)

RANK0 = """
def sum_all(float(N) I) -> (O) { O +=! I(r_n) }
def copy(float a) -> (b) { b = a }
def stats(float(N) I, float w) -> (float Lo, Hi, Mean, C) {
    Lo min=! I(r_n)
    Hi max=! I(r_n)
    Mean +=! I(r_n) / float(N)
    C(i) = (I(i) - Mean) * w + Hi - Lo <=> centre(I(i), Mean)
}
def mm(float(M,K) A, float(K,N) B) -> (C) {
    C(i, j) +=! A(i, k) * B(k, j) <=> matmul(A(i, k), B(k, j))
}
"""


def oracle(I, w, A, B):
    I64 = I.astype(np.float64)
    mean = I64.sum() / len(I)
    C = (I64 - mean) * w + I64.max() - I64.min()
    return {"sum_all": (np.float32(I64.sum()),), "copy": (np.float32(w),),
            "stats": (I.min(), I.max(), np.float32(mean), C.astype(np.float32)),
            "mm": ((A.astype(np.float64) @ B).astype(np.float32),)}


def check(target):
    rng = np.random.default_rng(3)
    I = rng.uniform(-1, 1, 11).astype(np.float32)
    A, B = rng.uniform(-1, 1, (4, 6)).astype(np.float32), rng.uniform(-1, 1, (6, 5)).astype(np.float32)
    w = -2.5
    mod = pf.define(RANK0, target=target)
    got = {"sum_all": mod.sum_all(I), "copy": mod.copy(w), "stats": mod.stats(I, w), "mm": mod.mm(A, B)}
    for name, want in oracle(I, w, A, B).items():
        outs = got[name] if isinstance(got[name], tuple) else (got[name],)
        assert len(outs) == len(want), name
        for g, e in zip(outs, want):
            g = np.asarray(g)
            assert g.shape == np.shape(e) and g.dtype == np.float32, (name, g.shape, g.dtype)
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("target", ["reference", "host"])
def test_rank0_forms_and_equivalences_on_the_cpu(target):
    check(target)


@needs_arm_tools
def test_rank0_forms_on_aarch64():
    check("aarch64")


@pytest.mark.skipif(CXX is None, reason="the emulator needs a C++20 compiler")
def test_rank0_forms_in_cuda_c_on_the_emulator(emulated):  # noqa: F811
    check("cuda")
    assert emulated.launches


@pytest.mark.unit
def test_rank0_forms_mean_the_parenthesized_ones():
    bare = parse(RANK0)
    written = parse(RANK0.replace("O +=!", "O() +=!").replace("b = a", "b() = a")
                    .replace("float Lo", "float() Lo").replace("Lo min=!", "Lo() min=!")
                    .replace("Hi max=!", "Hi() max=!").replace("Mean +=!", "Mean() +=!")
                    .replace("Hi - Lo", "Hi() - Lo()").replace("- Mean)", "- Mean())")
                    .replace("centre(I(i), Mean)", "centre(I(i), Mean())"))
    assert bare == written
    assert [t.shape for t in bare["stats"].outputs][:3] == [(), (), ()]


@pytest.mark.unit
def test_equivalence_is_kept_printed_and_parsed_back():
    m = parse(RANK0)
    st = m["mm"].statements[0]
    assert st.equivalent is not None and st.equivalent.name == "matmul"
    assert [a.tensor for a in st.equivalent.args if isinstance(a, Read)] == ["A", "B"]
    text = str(m)
    assert "C(i, j) +=! A(i, k) * B(k, j) <=> matmul(A(i, k), B(k, j))\n" in text
    assert "<=> centre(I(i), Mean())" in text
    assert parse(text) == m
    # the note changes nothing else: the statement without it is the same computation
    plain = parse(RANK0.replace(" <=> matmul(A(i, k), B(k, j))", ""))
    assert plain["mm"].statements[0] == type(st)(**{**{f: getattr(st, f) for f in
                                                      ("tensor", "indices", "op", "init", "rhs",
                                                       "ranges", "loc")}, "equivalent": None})
    assert Equivalent("matmul", st.equivalent.args) == st.equivalent


@pytest.mark.unit
def test_equivalence_goes_before_the_where_clause():
    d = parse("def f(float(N) X) -> (Y) { Y(i) = X(i) <=> copy(X(i)) where i in 0:N }")["f"]
    assert d.statements[0].equivalent == Equivalent("copy", (d.statements[0].rhs,))


def _located(exc, source, line, col, message):
    with pytest.raises(exc) as info:
        parse(source)
    e = info.value
    assert (e.line, e.col) == (line, col), str(e)
    assert message in str(e)
    lines = str(e).splitlines()
    shown = source.splitlines()[line - 1]
    k = next(i for i, ln in enumerate(lines) if ln.endswith(shown) and ln.strip() == shown.strip())
    indent = len(lines[k]) - len(shown)
    assert lines[k + 1].strip("^~ ") == "" and lines[k + 1].index("^") == indent + col - 1
    assert f":{line}:{col}:" in str(e)


@pytest.mark.unit
@pytest.mark.parametrize("source, exc, line, col, message", [
    ("def f(float(N) X) -> (Y) {\n  Y(i) = X(i) <=> (X(i))\n}", pf.TCSyntaxError, 2, 19,
     "expected the name of the equivalent computation"),
    ("def f(float(N) X) -> (Y) {\n  Y(i) = X(i) <=> g X(i)\n}", pf.TCSyntaxError, 2, 21,
     "expected '(' after 'g'"),
    ("def f(float(N) X) -> (Y) {\n  Y(i) = X(i) <=> g(X(j))\n}", pf.TCSemanticError, 2, 23,
     "index 'j' of the '<=>' annotation"),
    ("def f(float(N) X) -> (Y) {\n  Y(i) = X(i) <=> g(X)\n}", pf.TCSemanticError, 2, 21,
     "tensor 'X' is used without indices"),
    ("def f(float(N) X) -> (Y) {\n  Y X(i)\n}", pf.TCSyntaxError, 2, 5,
     "expected '(' or an assignment after 'Y'"),
    ("def f(float(N) X) -> (Y) {\n  Y = X(i)\n}", pf.TCSemanticError, 2, 9,
     "appears on the right of '=' but not on the left"),
    ("def f(float(N) X) -> (float(N) Y) {\n  Y +=! X(i)\n}", pf.TCSemanticError, 2, 3,
     "has 1 dimensions but is written with 0 indices"),
    ("def f(float(N) X) -> (Y, Z) {\n  Z = Y\n  Y +=! X(i)\n}", pf.TCSemanticError, 2, 7,
     "'Y' is read before any statement writes it"),
    ("def f(uint128(N) X) -> (Y) {\n  Y(i) = X(i)\n}", pf.TCSemanticError, 1, 7, "unknown type 'uint128'"),
])
def test_malformed_forms_are_located(source, exc, line, col, message):
    _located(exc, source, line, col, message)
