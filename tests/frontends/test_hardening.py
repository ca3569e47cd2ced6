"""Hostile TC input gets polyfuse errors: expressions nested past the limit, sizes that
divide by zero, integer division by zero in data, scalar arguments out of range."""

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.frontends.graph_text import parse_graph
from polyfuse.frontends.loop_ir import parse_kernel
from polyfuse.frontends.tc import parse
from polyfuse.ir.comprehension import format_definition
from polyfuse.ir.limits import MAX_EXPR_DEPTH, MAX_EXPR_NODES, MAX_NEST_DEPTH
from polyfuse.ir.loops_interpreter import interpret_kernel
from polyfuse.runtime.arguments import bind_arguments
from polyfuse.scheduler.options import MappingOptions
from polyfuse.scheduler.pipeline import schedule_definition
from tests.arm_tools import AARCH64

A = np.array([-3, -2, -1, 0, 1, 2, 3, 4], np.float32)


def _ternary_oracle(a: np.ndarray, levels: int) -> np.ndarray:
    out = a.copy()
    for k in reversed(range(levels)):
        out = np.where(a < k, np.float32(k), out)
    return out


# Each shape at syntax depth d (every operator, call, branch and parenthesis one level):
# its text on the right of ``B(i) =`` and numpy's answer.
SHAPES = {
    "sum": (lambda d: " + ".join(["A(i)"] * (d - 1)), lambda d: A * (d - 1)),
    "parens": (lambda d: "(" * (d - 2) + "A(i)" + ")" * (d - 2), lambda d: A),
    "unary": (lambda d: "-" * (d - 2) + "A(i)", lambda d: A * (-1) ** (d - 2)),
    "calls": (lambda d: "fabs(" * (d - 2) + "A(i)" + ")" * (d - 2), lambda d: np.abs(A)),
    "ternary": (lambda d: "".join(f"A(i) < {k} ? {k} : " for k in range(d - 3)) + "A(i)",
                lambda d: _ternary_oracle(A, d - 3)),
    "index": (lambda d: "A(i" + " * 1" * (d % 2) + " + 1 - 1" * ((d - 2) // 2) + ")", lambda d: A),
}


def program(shape: str, depth: int) -> str:
    return f"def f(float(N) A) -> (B) {{\n  B(i) = {SHAPES[shape][0](depth)}\n}}"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("target", ["reference", "host", AARCH64])
def test_the_deepest_expressions_allowed_run_on_every_target(shape, target):
    got = pf.define(program(shape, MAX_EXPR_DEPTH), target=target).f(A)
    np.testing.assert_array_equal(got, SHAPES[shape][1](MAX_EXPR_DEPTH))


def _called_from_deep(frames: int, run):
    """``run()`` with ``frames`` Python frames already on the stack (a caller deep in a
    framework, a notebook, a test runner)."""
    return run() if frames == 0 else _called_from_deep(frames - 1, run)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_deepest_expressions_allowed_compile_under_a_deep_caller(shape):
    source = program(shape, MAX_EXPR_DEPTH)
    got = _called_from_deep(400, lambda: pf.define(source, target="host").f(A))
    np.testing.assert_array_equal(got, SHAPES[shape][1](MAX_EXPR_DEPTH))


@pytest.mark.parametrize("shape", SHAPES)
def test_the_deepest_expressions_allowed_print_parse_back_and_interpret(shape):
    source = program(shape, MAX_EXPR_DEPTH)
    module = parse(source)
    assert parse(str(module)) == module
    d = module["f"]
    assert format_definition(d) in str(module)
    bound = bind_arguments(d, (A,))
    kernel = schedule_definition(d, bound.sizes, MappingOptions())
    assert parse_kernel(str(kernel)) == kernel
    np.testing.assert_array_equal(interpret_kernel(kernel, bound.values)["B"],
                                  SHAPES[shape][1](MAX_EXPR_DEPTH))
    stages = pf.define(source, target="host").f.specialize(A).stages
    assert str(parse_kernel(stages["loops"])) == stages["loops"]
    assert "B(i) =" in stages["comprehension"] and "B(i) =" in stages["specialized"]


@pytest.mark.parametrize("shape", SHAPES)
def test_the_deepest_expressions_allowed_compile_for_cuda(shape):
    spec = pf.define(program(shape, MAX_EXPR_DEPTH), target="cuda").f.specialize(A)
    assert "__global__" in spec.stages["cuda"] and ".entry" in spec.stages["ptx"]


DEEPER = [(shape, depth) for shape in SHAPES for depth in (MAX_EXPR_DEPTH + 1, MAX_EXPR_DEPTH + 2, 1000)]
DEEPER += [(shape, 100_000) for shape in ("parens", "unary")]  # the others lex slowly


@pytest.mark.unit
@pytest.mark.parametrize("shape, depth", DEEPER)
def test_deeper_expressions_are_refused_at_the_token_that_passes_the_limit(shape, depth):
    source = program(shape, depth)
    with pytest.raises(pf.TCSyntaxError, match=f"nested more than {MAX_EXPR_DEPTH} levels") as err:
        parse(source)
    e = err.value
    assert e.line == 2 and len("  B(i) = ") < e.col <= len(source.splitlines()[1])
    assert "hint: split it" in str(e) and "^" in str(e)



@pytest.mark.unit
def test_bindings_substituted_past_the_depth_limit_are_refused_where_they_are_used():
    chain = SHAPES["sum"][0](MAX_EXPR_DEPTH - 50)
    source = f"def f(float(N) A) -> (B) {{\n  B(i) = x + x where x = {chain}\n}}"
    assert parse(source)["f"].statements[0].rhs  # MAX_EXPR_DEPTH - 49 deep: allowed
    deep = source.replace("x + x where", "x + x + x + x + x + x + x + x + x + x + x + x where")
    deep = deep.replace("B(i) = ", "B(i) = " + "x + " * 50)
    with pytest.raises(pf.TCSemanticError, match=f"expression of 'B' is {MAX_EXPR_DEPTH + 11} levels deep, more than "
                       f"{MAX_EXPR_DEPTH}") as err:
        parse(deep)
    assert (err.value.line, err.value.col) == (2, 10) and "temporary output" in str(err.value)


@pytest.mark.unit
def test_bindings_that_double_the_tree_are_refused_by_its_size_at_once():
    lets = ", ".join(f"x{k + 1} = x{k} + x{k}" for k in range(60))
    source = f"def f(float(N) A) -> (B) {{\n  B(i) = x60 where x0 = A(i), {lets}\n}}"
    with pytest.raises(pf.TCSemanticError, match=f"is {3 * 2 ** 60 - 1} nodes, more than {MAX_EXPR_NODES}"):
        parse(source)
    small = source.replace("B(i) = x60", "B(i) = x10")
    np.testing.assert_array_equal(pf.define(small).f(A), A * 2 ** 10)


def loop_kernel(blocks: int, expr: str = "A(0)") -> str:
    opens = "".join(f"{'  ' * (k + 1)}for c{k} in 0:1 {{\n" for k in range(blocks))
    closes = "".join(f"{'  ' * k}}}\n" for k in reversed(range(blocks + 1)))
    return (f"kernel f(in float32(4) A, out float32(4) B) {{\n{opens}"
            f"{'  ' * (blocks + 1)}B(0) = {expr.replace('A(i)', 'A(0)')}\n{closes}").rstrip("\n")


@pytest.mark.unit
def test_loop_ir_text_nested_to_the_limits_parses_back_and_runs():
    text = loop_kernel(MAX_NEST_DEPTH, SHAPES["sum"][0](MAX_EXPR_DEPTH))
    kernel = parse_kernel(text)
    assert str(kernel) == text
    got = interpret_kernel(kernel, {"A": A})["B"]
    assert got[0] == A[0] * (MAX_EXPR_DEPTH - 1)


@pytest.mark.unit
@pytest.mark.parametrize("blocks", [MAX_NEST_DEPTH + 1, 1000])
def test_loop_ir_text_nested_deeper_is_refused(blocks):
    with pytest.raises(pf.TCSyntaxError, match=f"nested more than {MAX_NEST_DEPTH} deep") as err:
        parse_kernel(loop_kernel(blocks))
    assert err.value.line == MAX_NEST_DEPTH + 2 and "{" in str(err.value).splitlines()[1]


@pytest.mark.unit
@pytest.mark.parametrize("shape", ["sum", "parens", "calls"])
@pytest.mark.parametrize("depth", [MAX_EXPR_DEPTH + 1, 10_000])
def test_loop_ir_expressions_nested_deeper_are_refused(shape, depth):
    with pytest.raises(pf.TCSyntaxError, match=f"nested more than {MAX_EXPR_DEPTH} levels"):
        parse_kernel(loop_kernel(1, SHAPES[shape][0](depth)))


def graph_with_attribute(lists: int) -> str:
    return ("graph g(%x: float32[2]) -> (%y: float32[2]) {\n"
            f"  %y = Op(%x, a={'[' * lists}1{']' * lists})  # n\n}}")


@pytest.mark.unit
def test_graph_text_attributes_nested_to_the_limit_parse_back():
    g = parse_graph(graph_with_attribute(MAX_NEST_DEPTH))
    value = g.nodes[0].attrs[0][1]
    for _ in range(MAX_NEST_DEPTH):
        assert isinstance(value, tuple) and len(value) == 1
        value = value[0]
    assert value == 1 and str(g) == graph_with_attribute(MAX_NEST_DEPTH)


@pytest.mark.unit
@pytest.mark.parametrize("lists", [MAX_NEST_DEPTH + 1, 10_000])
def test_graph_text_attributes_nested_deeper_are_refused(lists):
    with pytest.raises(pf.GraphSyntaxError, match=f"nested more than {MAX_NEST_DEPTH} deep") as err:
        parse_graph(graph_with_attribute(lists))
    assert (err.value.line, err.value.col) == (2, len("  %y = Op(%x, a=") + MAX_NEST_DEPTH + 1)


E = np.ones(0, np.float32)  # binds M to 0
DIVIDING_RANGES = {
    "mod": ("def f(float(N) A, float(M) C) -> (B) { B(i) = A(i) where i in 0:N % M }",
            lambda n, m: n % m),
    "floormod": ("def f(float(N) A, float(M) C) -> (B) { B(i) = A(i) where i in 0:floormod(N, M) }",
                 lambda n, m: n % m),
    "nested": ("def f(float(N) A, float(M) C, float(K) D) -> (B) {\n"
               "  B(i) = A(i) where i in 0:N - N % (K % M)\n}", lambda n, m: n - n % (3 % m)),
}


@pytest.mark.unit
@pytest.mark.parametrize("case", DIVIDING_RANGES)
@pytest.mark.parametrize("target", ["reference", "host", AARCH64])
def test_a_range_that_divides_by_a_zero_size_is_a_shape_error(case, target):
    source, size = DIVIDING_RANGES[case]
    f = pf.define(source, target=target).f
    extra = (np.ones(3, np.float32),) if "float(K)" in source else ()
    for m in (2, 4) if target == "reference" else ():  # isl takes no N % M bound (ScheduleError)
        got = f(A, np.ones(m, np.float32), *extra)
        np.testing.assert_array_equal(got, A[:size(len(A), m)])
    if extra:  # K % M == 0 without a zero size: refused before the scheduler sees it
        with pytest.raises(pf.ShapeError, match=r"divides by K % M = 0 for these arguments \(sizes "):
            f(A, np.ones(3, np.float32), *extra)
    with pytest.raises(pf.ShapeError, match=r"divides by M = 0 for these arguments \(M = 0 from "
                       r"dimension 0 of 'C' \(shape \(0,\)\)\); a size a shape or range divides "
                       "by must be nonzero"):
        f(A, E, *extra)


@pytest.mark.parametrize("target", ["reference", "host", AARCH64])
def test_a_size_divided_by_a_literal_zero_is_zero_as_every_integer_division_by_zero(target):
    got = pf.define("def f(float(N) A) -> (B) {\n"
                    "  B(i) = A(i) where i in 0:N % 0 + N / 0 + floordiv(N, 0) + floormod(N, 0)\n}",
                    target=target).f(A)
    assert got.shape == (0,)


DIVIDE = """def f(T(N) A, T(N) C) -> (Q, R, FQ, FR) {
  Q(i) = A(i) / C(i)
  R(i) = A(i) % C(i)
  FQ(i) = floordiv(A(i), C(i))
  FR(i) = floormod(A(i), C(i))
}"""


def _divisions_oracle(a: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, ...]:
    """x / 0 == x % 0 == 0 (as TVM and Halide define it); otherwise C's truncation and
    the floored forms, computed exactly and stored with the wrap of the type."""
    def each(fn):  # noqa: ANN001
        exact = [0 if y == 0 else fn(int(x), int(y)) for x, y in zip(a, c)]
        return np.array(exact, np.int64).astype(a.dtype)
    trunc = lambda x, y: abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)  # noqa: E731
    return (each(trunc), each(lambda x, y: x - y * trunc(x, y)), each(lambda x, y: x // y),
            each(lambda x, y: x % y))


DIVIDENDS = {"int32": ([7, -7, 0, 2**31 - 1, -2**31, -2**31, 5, -9], [0, 0, 0, 0, 0, -1, 2, 4]),
             "int64": ([7, -7, 0, 2**62, -2**62, 1, 5, -9], [0, 0, 0, 0, 0, -1, -2, 4]),
             "int8": ([7, -7, 0, 127, -128, -128, 5, -9], [0, 0, 0, 0, 0, -1, 2, 4]),
             "uint8": ([7, 255, 0, 128, 1, 200, 5, 9], [0, 0, 0, 0, 3, 7, 2, 4])}


@pytest.mark.parametrize("dtype", DIVIDENDS)
@pytest.mark.parametrize("target", ["reference", "host", AARCH64, "loops"])
def test_integer_division_of_data_by_zero_gives_zero_on_every_target(dtype, target):
    source = DIVIDE.replace("T(N)", f"{dtype}(N)")
    a, c = (np.array(v, dtype) for v in DIVIDENDS[dtype])
    want = _divisions_oracle(a, c)
    if target == "loops":
        d = parse(source)["f"]
        bound = bind_arguments(d, (a, c))
        out = interpret_kernel(schedule_definition(d, bound.sizes, MappingOptions()), bound.values)
        got = tuple(out[n] for n in ("Q", "R", "FQ", "FR"))
    else:
        got = pf.define(source, target=target).f(a, c)
    for name, g, w in zip(("/", "%", "floordiv", "floormod"), got, want):
        np.testing.assert_array_equal(g, w, err_msg=name)


def test_an_error_in_a_very_long_line_shows_the_part_around_the_caret():
    source = "def f(float(N) A) -> (B) { B(i) = " + " + ".join(["A(i)"] * 100_000) + " }"
    with pytest.raises(pf.TCSyntaxError) as err:
        pf.define(source)
    text, line, caret = str(err.value).splitlines()[:3]
    assert len(str(err.value)) < 1000 and line.startswith("    ...") and line.endswith("...")
    col = err.value.col
    # the caret stands under the same character as in the full line
    assert line[caret.index("^")] == source[col - 1]


@pytest.mark.unit
@pytest.mark.parametrize("target", ["reference", "host"])
def test_an_output_larger_than_memory_is_refused_before_it_is_allocated(target):
    shift = pf.define("def f(float(H, W) I) -> (O) { O(h, w) = I(h - 4611686018427387904, w) }",
                      target=target)
    with pytest.raises(pf.SizeLimitError, match=r"f: output 'O' would have shape "
                       r"\(4611686018427387906, 3\).*POLYFUSE_MAX_TENSOR_BYTES"):
        shift.f(np.ones((2, 3), np.float32))
    with pytest.raises(pf.ShapeError, match="inputs are too small"):
        pf.define("def g(float(N) I) -> (O) { O(i) = I(i + 2) }", target=target).g(
            np.ones(1, np.float32))


def test_an_integer_literal_no_integer_type_holds_is_refused_at_its_column():
    source = "def f(int64(N) A) -> (B) { B(i) = A(i) * 9223372036854775808 }"
    with pytest.raises(pf.TCSemanticError, match="too large for int64") as err:
        pf.define(source)
    assert err.value.col == source.index("9223") + 1
    big = pf.define("def f(int64(N) A) -> (B) { B(i) = A(i) + 9223372036854775807 }",
                    target="host").f(np.array([-1, 0], np.int64))
    np.testing.assert_array_equal(big, [2**63 - 2, 2**63 - 1])


@pytest.mark.parametrize("target", ["reference", "host"])
def test_an_integer_literal_the_other_operand_cannot_hold_makes_the_operation_int64(target):
    m = pf.define("def f(int32(N) A, int8(N) C) -> (Q, R) {\n  Q(i) = A(i) / 2147483648\n"
                  "  R(i) = C(i) + 200\n}", target=target)
    a, c = np.array([2**31 - 1, -2**31, 5], np.int32), np.array([100, -100, 7], np.int8)
    q, r = m.f(a, c)
    assert q.dtype == r.dtype == np.int64    # as C types 2147483648 a long
    np.testing.assert_array_equal(q, np.trunc(a.astype(np.int64) / 2**31).astype(np.int64))
    np.testing.assert_array_equal(r, c.astype(np.int64) + 200)
