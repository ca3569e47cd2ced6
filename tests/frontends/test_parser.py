"""Lexing, parsing and typing of TC text, checked on printed IR."""

import pytest

import polyfuse as pf
from polyfuse.frontends.tc import parse, parse_definition
from polyfuse.frontends.tc.lexer import Kind, tokenize
from polyfuse.ir.types import DType

pytestmark = pytest.mark.unit


def body(source: str, k: int = 0) -> str:
    return str(parse_definition(source).statements[k]).split("\n")[0]


def test_tokens_with_locations_and_reduction_operators():
    toks = tokenize("C(m) max=! A(m, k) # comment\n  +=! 1.5e-3 2.f")
    assert [t.text for t in toks if t.kind is not Kind.EOF] == \
        ["C", "(", "m", ")", "max=!", "A", "(", "m", ",", "k", ")", "+=!", "1.5e-3", "2."]
    assert (toks[11].loc.line, toks[11].loc.col) == (2, 3)


@pytest.mark.parametrize("rhs,printed", [
    ("A(i) + A(i) * 2.0", "A(i) + A(i) * 2.0"),
    ("(A(i) + A(i)) * 2.0", "(A(i) + A(i)) * 2.0"),
    ("A(i) - (A(i) - A(i))", "A(i) - (A(i) - A(i))"),
    ("A(i) - A(i) - A(i)", "A(i) - A(i) - A(i)"),
    ("A(i) < 0.0 || A(i) > 1.0 && A(i) != 0.5 ? 1.0 : 2.0",
     "A(i) < 0.0 || A(i) > 1.0 && A(i) != 0.5 ? 1.0 : 2.0"),
    ("-A(i) * -2.0", "-A(i) * -2.0"),
    ("!(A(i) > 0.0) ? -1.0 : 1.0", "!(A(i) > 0.0) ? -1.0 : 1.0"),
    ("i < 2 ? 1.0 : i < 4 ? 2.0 : 3.0", "i < 2 ? 1.0 : i < 4 ? 2.0 : 3.0"),
])
def test_precedence_survives_printing(rhs, printed):
    assert body(f"def f(float(N) A) -> (O) {{ O(i) = {rhs} where i in 0:N }}") == f"O(i) = {printed}"


@pytest.mark.parametrize("params,rhs,out_type,printed", [
    ("float16(N) A", "A(i) * 2", DType.FLOAT16, "A(i) * float16(2.0)"),
    ("int32(N) A", "A(i) * 2.5", DType.FLOAT32, "float32(A(i)) * 2.5"),
    ("int8(N) A, int32(N) B", "A(i) + B(i)", DType.INT32, "int32(A(i)) + B(i)"),
    ("float(N) A, double(N) B", "A(i) + B(i)", DType.FLOAT64, "float64(A(i)) + B(i)"),
    ("float16(N) A, bfloat16(N) B", "A(i) + B(i)", DType.FLOAT32, "float32(A(i)) + float32(B(i))"),
    ("float(N) A", "i + N", DType.INT32, "i + N"),
    ("float(N) A", "float(i) / float(N)", DType.FLOAT32, "float32(i) / float32(N)"),
    ("int64(N) A", "A(i) + i", DType.INT64, "A(i) + int64(i)"),
])
def test_types_and_implicit_casts(params, rhs, out_type, printed):
    d = parse_definition(f"def f({params}) -> (O) {{ O(i) = {rhs} where i in 0:N }}")
    assert d.outputs[0].dtype is out_type
    assert body(f"def f({params}) -> (O) {{ O(i) = {rhs} where i in 0:N }}") == f"O(i) = {printed}"


def test_bool_sums_count_in_int32():
    d = parse_definition("def f(float(N) A) -> (C) { C() +=! A(i) > 0.0 }")
    assert d.outputs[0].dtype is DType.INT32 and d.outputs[0].shape == ()


def test_declared_output_type_casts_on_store():
    d = parse_definition("def f(float(N) A) -> (float16(N) O) { O(i) = A(i) }")
    assert d.outputs[0].dtype is DType.FLOAT16
    assert body("def f(float(N) A) -> (float16(N) O) { O(i) = A(i) }") == "O(i) = float16(A(i))"


def test_several_definitions_lets_and_comments():
    module = parse("""
    # two kernels in one source
    def a(float(N) X) -> (Y) { Y(i) = t * t where t = X(i) + 1.0 }   # let binding
    def b(float(N) X) -> (Y) { Y(i) = X(i) }
    """)
    assert [d.name for d in module.definitions] == ["a", "b"]
    assert body(str(module["a"])) == "Y(i) = (X(i) + 1.0) * (X(i) + 1.0)"


@pytest.mark.parametrize("source,line,col,words", [
    ("def f(float(N) A) -> (O) { O(i) = A(i) +  }", 1, 43, "expected an expression"),
    ("def f(float(N) A) -> (O) { O(i+1) = A(i) }", 1, 31, "plain index names"),
    ("def f(float(N) A) -> (O) { O(i) == A(i) }", 1, 33, "expected an assignment"),
    ("def f(float(N) A) -> (O) {\n  O(i) = A(i) where i 0:N }", 2, 23, "expected 'in' or '='"),
    ("def f(float(N) A) -> (O) { O(i) = A(i) ", 1, 40, "expected '}'"),
    ("def f(float(N) A) -> () { }", 1, 23, "at least one output"),
    ("def f(float(N) A) -> (O) { O(i) = A(i) @ 2 }", 1, 40, "unexpected character"),
    ("fed f(float(N) A) -> (O) { }", 1, 1, "expected 'def'"),
])
def test_syntax_errors_point_at_the_token(source, line, col, words):
    with pytest.raises(pf.TCSyntaxError) as info:
        parse(source)
    err = info.value
    assert (err.line, err.col) == (line, col), str(err)
    assert words in err.message
    caret_line = str(err).splitlines()[2]
    assert caret_line.index("^") - 4 == col - 1


def test_two_definitions_with_one_name_are_refused():
    with pytest.raises(pf.TCSemanticError, match="defined twice"):
        parse("def f(float(N) A) -> (O) { O(i) = A(i) }\ndef f(float(N) A) -> (O) { O(i) = A(i) }")


def test_verifier_rejects_hand_built_bad_ir():
    from dataclasses import replace

    from polyfuse.errors import IRVerificationError
    from polyfuse.ir.comprehension import Literal
    from polyfuse.ir.verify import verify_definition
    d = parse_definition("def f(float(N) A) -> (O) { O(i) = A(i) }")
    bad = replace(d, statements=(replace(d.statements[0], rhs=Literal(1, DType.INT32)),))
    with pytest.raises(IRVerificationError, match="value is int32 but 'O' is float32"):
        verify_definition(bad)
