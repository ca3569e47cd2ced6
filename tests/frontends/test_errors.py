"""One bad program or bad call per error class, with exact error locations.

Front-end errors (TCSyntaxError, TCSemanticError, RangeInferenceError) carry 1-based
``.line``/``.col``; ``str(e)`` holds ``line:col``, the offending source line and a caret
line with ``^`` under the column. Each case below names the expected line, column and
the text that starts there; ``test_case_positions_are_right`` checks that bookkeeping
against the source itself, so the location asserts are exact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pytest

import polyfuse
from polyfuse import (
    ArgumentError,
    BoundsError,
    DTypeError,
    PolyfuseError,
    RangeInferenceError,
    ShapeError,
    TargetError,
    TCSemanticError,
    TCSyntaxError,
)

pytestmark = pytest.mark.unit


def src(*lines: str) -> str:
    """A source text made of exactly these lines (line 1 is the first argument)."""
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Case:
    id: str
    exc: type | tuple[type, ...]
    source: str
    line: int
    col: int
    token: str                      # the text that starts at line:col
    words: tuple[str, ...] = ()     # whole words the message (besides the echo) must name


CASES = [
    # ---- syntax: the unexpected token
    Case("syntax_unexpected_operator", TCSyntaxError, src(
        "def f(float(N) A) -> (B) {",
        "    B(i) = A(i) * * 2.0",
        "}"), 2, 19, "* 2.0"),
    Case("syntax_bad_assignment_operator", TCSyntaxError, src(
        "def f(float(N) A) -> (B) {",
        "    B(i) -= A(i)",
        "}"), 2, 10, "-"),
    Case("syntax_missing_paren_in_signature", TCSyntaxError, src(
        "def f(float(N) A -> (B) {",
        "    B(i) = A(i)",
        "}"), 1, 18, "->"),
    # ---- unknown type name: the type token (a parser or a checker may catch it)
    Case("unknown_type_name", (TCSyntaxError, TCSemanticError), src(
        "def f(flaot(N) A) -> (B) {",
        "    B(i) = A(i)",
        "}"), 1, 7, "flaot"),
    # ---- semantic errors
    Case("unknown_function", TCSemanticError, src(
        "def f(float(N) A) -> (B) {",
        "    B(i) = foo(A(i))",
        "}"), 2, 12, "foo"),
    Case("builtin_wrong_arity", TCSemanticError, src(
        "def f(float(N) A) -> (B) {",
        "    B(i) = fmax(A(i))",
        "}"), 2, 12, "fmax"),
    Case("access_rank_mismatch", TCSemanticError, src(
        "def f(float(N,M) A) -> (B) {",
        "    B(i) = A(i)",
        "}"), 2, 12, "A(i)"),
    Case("write_to_input", TCSemanticError, src(
        "def f(float(N) A) -> (B) {",
        "    B(i) = A(i)",
        "    A(i) = B(i)",
        "}"), 3, 5, "A(i) ="),
    Case("undeclared_temporary", TCSemanticError, src(
        "def f(float(N) A) -> (B) {",
        "    T(i) = A(i) * 2.0",
        "    B(i) = T(i)",
        "}"), 2, 5, "T(i) ="),
    Case("output_never_written", TCSemanticError, src(
        "def f(float(N) A) -> (B, C) {",
        "    B(i) = A(i)",
        "}"), 1, 26, "C)"),
    Case("output_read_before_written", TCSemanticError, src(
        "def f(float(N) A) -> (B, C) {",
        "    B(i) = A(i) + C(i)",
        "    C(i) = A(i)",
        "}"), 2, 19, "C(i)"),
    Case("assign_with_rhs_only_index", TCSemanticError, src(
        "def f(float(N,M) A) -> (B) {",
        "    B(i) = A(i, j) + A(i, j)",
        "}"), 2, 17, "j) +"),
    Case("float_index_expression", TCSemanticError, src(
        "def f(float(N) A) -> (B) {",
        "    B(i) = A(i + 0.5)",
        "}"), 2, 14, "i + 0.5"),
    Case("float_tensor_as_index", TCSemanticError, src(
        "def f(float(N) A, float(N) F) -> (B) {",
        "    B(i) = A(i) * A(F(i))",
        "}"), 2, 21, "F(i)"),
    Case("bitwise_operator_on_floats", TCSemanticError, src(
        "def f(float(N) A) -> (B) {",
        "    B(i) = A(i) & 1",
        "}"), 2, 12, "A(i) &", ("float32",)),
    Case("bitwise_not_of_a_float", TCSemanticError, src(
        "def f(double(N) A) -> (B) {",
        "    B(i) = 1 + ~A(i)",
        "}"), 2, 16, "~A(i)", ("float64", "as_int64")),
    Case("reinterpret_across_widths", TCSemanticError, src(
        "def f(float(N) A) -> (B) {",
        "    B(i) = as_int16(A(i))",
        "}"), 2, 12, "as_int16", ("float32",)),
    Case("repeated_lhs_index", TCSemanticError, src(
        "def f(float(N) A) -> (O) {",
        "    O(i, i) = A(i)",
        "}"), 2, 10, "i) ="),
    Case("read_lhs_at_other_indices", TCSemanticError, src(
        "def f(float(N) A) -> (O) {",
        "    O(i) = A(i)",
        "    O(i) = O(i) + O(i + 1)",
        "}"), 3, 19, "O(i + 1)"),
    # ---- range inference: first occurrence of the index; the message names it and
    #      suggests a `where` clause
    Case("ambiguous_index", RangeInferenceError, src(
        "def f(float(N) A) -> (O) {",
        "    O(i) +=! A(i + j)",
        "}"), 2, 20, "j)", ("j", "where")),
    Case("unconstrained_index", RangeInferenceError, src(
        "def f(float(N) A) -> (O) {",
        "    O(i, j) = A(i)",
        "}"), 2, 10, "j) =", ("j", "where")),
]


def test_error_hierarchy() -> None:
    for cls in (TCSyntaxError, TCSemanticError, RangeInferenceError, ArgumentError,
                ShapeError, DTypeError, BoundsError, TargetError):
        assert issubclass(cls, PolyfuseError), cls
    assert issubclass(RangeInferenceError, TCSemanticError)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case_positions_are_right(case: Case) -> None:
    """Self-check of this file's bookkeeping: the token really starts at line:col."""
    text = case.source.splitlines()[case.line - 1]
    assert text[case.col - 1:].startswith(case.token), (text, case.col, case.token)


def _message_body(message: str, source_line: str) -> str:
    """The message without the echoed source line and the caret line."""
    echo = source_line.strip()
    return "\n".join(ln for ln in message.splitlines()
                     if echo not in ln and not re.fullmatch(r"\s*\^~*\s*", ln))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_frontend_error_location(case: Case) -> None:
    with pytest.raises(case.exc) as info:
        polyfuse.define(case.source, target="reference")
    e = info.value
    assert isinstance(e, PolyfuseError)
    assert (e.line, e.col) == (case.line, case.col), str(e)

    message = str(e)
    source_line = case.source.splitlines()[case.line - 1]
    assert f"{case.line}:{case.col}" in message
    # The offending line is echoed, and a caret line points at the column in it.
    lines = message.splitlines()
    echo = [k for k, ln in enumerate(lines) if source_line.strip() in ln]
    assert echo, f"source line {source_line!r} not in message:\n{message}"
    k = echo[0]
    assert k + 1 < len(lines) and "^" in lines[k + 1], message
    caret = lines[k + 1].index("^")
    assert lines[k][caret:].startswith(case.token), (
        f"caret not under {case.token!r}:\n{message}")

    body = _message_body(message, source_line)
    for word in case.words:
        assert re.search(rf"\b{re.escape(word)}\b", body), f"{word!r} not named in:\n{message}"


# --------------------------------------------------------------------------- call-time errors

MATMUL = src(
    "def matmul(float(M,K) A, float(K,N) B) -> (C) {",
    "    C(m,n) +=! A(m,k) * B(k,n)",
    "}")
AXPY = src(
    "def axpy(float a, float(N) X, float(N) Y) -> (Z) {",
    "    Z(i) = a * X(i) + Y(i)",
    "}")
EMBEDDING = src(
    "def embedding(float(V,D) E, int32(B) Idx) -> (O) {",
    "    O(b,d) = E(Idx(b), d)",
    "}")


def _f32(*shape: int) -> np.ndarray:
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape) / 7.0


@pytest.fixture(scope="module")
def matmul():
    return polyfuse.define(MATMUL, target="reference").matmul


@pytest.fixture(scope="module")
def axpy():
    return polyfuse.define(AXPY, target="reference").axpy


@pytest.fixture(scope="module")
def embedding():
    return polyfuse.define(EMBEDDING, target="reference").embedding


def test_valid_calls_work(matmul, axpy, embedding) -> None:
    """The kernels the error tests misuse do work when called properly."""
    np.testing.assert_allclose(matmul(_f32(4, 5), _f32(5, 3)), _f32(4, 5) @ _f32(5, 3), rtol=1e-5)
    np.testing.assert_allclose(axpy(2.0, _f32(5), _f32(5)), 2 * _f32(5) + _f32(5), rtol=1e-6)
    E, idx = _f32(6, 3), np.array([5, 0, 2], dtype=np.int32)
    np.testing.assert_array_equal(embedding(E, idx), E[idx])


@pytest.mark.parametrize("call", [
    pytest.param(lambda mm, ax: mm(_f32(4, 5)), id="too_few_positional"),
    pytest.param(lambda mm, ax: mm(_f32(4, 5), _f32(5, 3), _f32(4, 3)), id="too_many_positional"),
    pytest.param(lambda mm, ax: ax(a=1.0, X=_f32(5), Y=_f32(5), W=_f32(5)), id="unknown_keyword"),
    pytest.param(lambda mm, ax: ax(a=1.0, X=_f32(5)), id="missing_keyword"),
    pytest.param(lambda mm, ax: ax(1.0, _f32(5), _f32(5), X=_f32(5)), id="keyword_repeats_positional"),
    pytest.param(lambda mm, ax: ax(1.0, None, _f32(5)), id="none_for_tensor"),
    pytest.param(lambda mm, ax: ax(1.0, "abc", _f32(5)), id="string_for_tensor"),
])
def test_argument_error(matmul, axpy, call) -> None:
    with pytest.raises(ArgumentError):
        call(matmul, axpy)


def test_shape_error_wrong_rank(matmul) -> None:
    with pytest.raises(ShapeError):
        matmul(_f32(4, 5, 1), _f32(5, 3))
    with pytest.raises(ShapeError):
        matmul(_f32(4, 5), _f32(5))


@pytest.mark.parametrize("kernel, args, size, values", [
    pytest.param("matmul", (_f32(4, 5), _f32(6, 3)), "K", ("5", "6"), id="matmul_K"),
    pytest.param("axpy", (1.0, _f32(5), _f32(6)), "N", ("5", "6"), id="axpy_N"),
])
def test_shape_error_size_mismatch(matmul, axpy, kernel, args, size, values) -> None:
    fn = {"matmul": matmul, "axpy": axpy}[kernel]
    with pytest.raises(ShapeError) as info:
        fn(*args)
    message = str(info.value)
    assert re.search(rf"\b{size}\b", message), message
    for v in values:
        assert re.search(rf"\b{v}\b", message), message


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.float16])
def test_dtype_error_float_param(matmul, dtype) -> None:
    with pytest.raises(DTypeError):
        matmul(_f32(4, 5).astype(dtype), _f32(5, 3))


def test_dtype_error_int_param(embedding) -> None:
    with pytest.raises(DTypeError):
        embedding(_f32(6, 3), np.array([1.0, 2.0], dtype=np.float32))


@pytest.mark.parametrize("bad", [6, -1, 100])
def test_bounds_error_embedding_index(embedding, bad) -> None:
    E = _f32(6, 3)
    with pytest.raises(BoundsError):
        embedding(E, np.array([0, bad, 2], dtype=np.int32))


@pytest.mark.parametrize("target", ["tpu", "rocm", "sparc"])
def test_target_error(target) -> None:
    with pytest.raises(TargetError):
        polyfuse.define(AXPY, target=target)
