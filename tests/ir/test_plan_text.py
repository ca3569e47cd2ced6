"""The plan IR's text form: plans plan_graph makes print and parse back to the same text
(parse_plan), so plan tests are text in, text out; malformed text is an error naming its line."""

import numpy as np
import pytest

from polyfuse.errors import FrontendError, GraphSyntaxError, IRVerificationError, TCSyntaxError, WeightError
from polyfuse.frontends.graph_text import parse_graph
from polyfuse.frontends.plan_text import parse_plan
from polyfuse.ir.plan import Role, plan_memory
from polyfuse.lowering.plan import plan_graph

pytestmark = pytest.mark.unit

FUSED = """graph mlp(%x: float32[4, 3]) -> (%out: float32[4, 2], %c: float32[2]) opset 17 {
  %w = constant float32[3, 2] [0.5, -1.0, 2.0, 0.25, -0.75, 1.5]
  %b = constant float32[2] [0.1, -0.2]
  %y = MatMul(%x, %w)  # mm @g0
  %z = Add(%y, %b)  # add @g0
  %out = Relu(%z)  # relu @g0
  %c = Neg(%b)  # neg
}"""

VIEWS = """graph views(%x: float32[4, 6]) -> (%y: float32[12], %x_out: float32[4, 6]) opset 17 {
  %shape = constant int64[1] [12]
  %s = TimeSlice(%x, shape=[2, 6], offset=12)  # last_rows
  %r = Relu(%s)  # relu
  %y = Reshape(%r, %shape)  # flat
  %x_out = Identity(%x)  # copy
}"""

SPECIALIZED = """graph spec(%x: float32[2, 6], %shape: int64[2]) -> (%y: float32[3, 4]) opset 17 {
  %r = Reshape(%x, %shape)  # reshape
  %y = Relu(%r)  # relu
}"""

IF_ON_SUM = """graph g(%x: float32[3, 4]) -> (%r: float32[3, 4], %m: float32[]) opset 17 {
  %zero = constant float32[] [0.0]
  %one = constant float32[] [1.0]
  %three = constant float32[] [3.0]
  %s = ReduceSum(%x, keepdims=0)  # sum
  %c = Greater(%s, %zero)  # positive
  %y, %m = If(%c, %x, %one, %three, else_branch=graph else() captures(%x, %one, %three) -> (%e: float32[3, 4], %em: float32[]) {
      %e = Sub(%x, %three)  # sub
      %em = ReduceMin(%x, keepdims=0)  # min
    }, then_branch=graph then() captures(%x, %one, %three) -> (%t: float32[3, 4], %tm: float32[]) {
      %t0 = Mul(%x, %x)  # square
      %t = Add(%t0, %one)  # add
      %tm = ReduceMax(%x, keepdims=0)  # max
    })  # if
  %r = Relu(%y)  # relu
}"""

IF_IN_A_LOOP = """graph g(%x: float32[2, 3], %n: int64[80]) -> (%y: float32[2, 3]) opset 17 {
  %zero = constant float32[] [0.0]
  %half = constant float32[] [0.5]
  %M = ReduceSum(%n, keepdims=0)  # trips
  %y = Loop(%M, _, %x, %zero, %half, body=graph body(%i: int64[], %c_in: bool[], %x_in: float32[2, 3]) captures(%zero, %half) -> (%c_out: bool[], %x_out: float32[2, 3]) {
      %c_out = Identity(%c_in)  # keep
      %s = ReduceSum(%x_in, keepdims=0)  # sum
      %pos = Greater(%s, %zero)  # positive
      %x_out = If(%pos, %x_in, %half, %i, else_branch=graph else() captures(%x_in, %half, %i) -> (%e: float32[2, 3]) {
          %fi = Cast(%i, to="float32")  # cast
          %e = Add(%x_in, %fi)  # add
        }, then_branch=graph then() captures(%x_in, %half, %i) -> (%t: float32[2, 3]) {
          %t = Mul(%x_in, %half)  # halve
        })  # if
    })  # loop
}"""

WHILE = """graph g(%x: float32[8], %limit: float32[]) -> (%y: float32[8]) opset 17 {
  %two = constant float32[] [2.0]
  %s0 = ReduceSum(%x, keepdims=0)  # sum
  %go = LessOrEqual(%s0, %limit)  # below
  %y = Loop(_, %go, %x, %two, %limit, body=graph body(%i: int64[], %c_in: bool[], %x_in: float32[8]) captures(%two, %limit) -> (%c_out: bool[], %x_out: float32[8]) {
      %x_out = Mul(%x_in, %two)  # double
      %s = ReduceSum(%x_out, keepdims=0)  # sum
      %c_out = LessOrEqual(%s, %limit)  # below
    })  # loop
}"""

SCAN = """graph scan(%x: float32[3]) -> (%y: float32[3], %ys: float32[300, 3]) opset 17 {
  %M = constant int64[] [300]
  %go = constant bool[] [true]
  %y, %ys = Loop(%M, %go, %x, body=graph body(%i: int64[], %c_in: bool[], %y_in: float32[3]) -> (%c_out: bool[], %y_out: float32[3], %sq: float32[3]) {
      %c_out = Identity(%c_in)  # keep
      %y_out = Sigmoid(%y_in)  # step
      %sq = Mul(%y_out, %y_out)  # square
    })  # loop
}"""

# graph, input shapes, the values a plan is specialized to, a line the plan prints
REAL = {
    "a fusion group's temporary, constants, a constant output":
        (FUSED, {"x": (4, 3)}, None, ' temp (%"g0[mm add relu]#v2": float32[4, 2] @arena+0) = fused(%x, %w, %b)'),
    "a slice at an offset, a reshape, an input returned": (VIEWS, {"x": (4, 6)}, None, "= view %x +12  // last_rows"),
    "specialized to an input's value": (SPECIALIZED, {"x": (2, 6), "shape": (2,)},
                                        {"shape": np.array([3, 4], np.int64)}, "specialized to the values of %shape"),
    "a branch": (IF_ON_SUM, {"x": (3, 4)}, None, "= if %c {  // if"),
    "a branch in a loop with a trip count": (IF_IN_A_LOOP, {"x": (2, 3), "n": (80,)}, None, "= if %loop/pos {"),
    "a while loop": (WHILE, {"x": (8,), "limit": ()}, None, "loop (%y: float32[8] = %x) cond %go counter "),
    "a loop with a scan": (SCAN, {"x": (3,)}, None, "scan (%loop/sq -> %ys: float32[300, 3])"),
}


@pytest.mark.parametrize("case", REAL)
def test_plans_print_and_parse_back(case):
    graph, shapes, values, line = REAL[case]
    plan = plan_graph(parse_graph(graph), shapes, values)
    text = str(plan)
    assert line in text
    back = parse_plan(text, plan.constants)
    assert str(back) == text
    back.verify()
    assert (back.name, back.inputs, back.outputs, back.specialized) == \
        (plan.name, plan.inputs, plan.outputs, plan.specialized)
    assert dict(back.types) == {v: plan.types[v] for v in back.types}   # those the text prints
    assert back.roles == {v: plan.roles[v] for v in back.roles}
    assert back.memory == plan.memory
    assert plan_memory(back.steps, back.types, set(back.outputs)) == back.memory
    assert [(k.label, k.definition, k.inputs, k.outputs, k.temporaries) for k in back.kernels] == \
        [(k.label, k.definition, k.inputs, k.outputs, k.temporaries) for k in plan.kernels]
    assert all(k.source == str(k.definition) for k in back.kernels)   # the TC as printed
    assert back.constants.keys() == plan.constants.keys()
    for name, array in plan.constants.items():
        assert back.constants[name].dtype == array.dtype
        np.testing.assert_array_equal(back.constants[name], array)


def test_constants_not_given_are_zeros():
    plan = plan_graph(parse_graph(FUSED), {"x": (4, 3)})
    back = parse_plan(str(plan))
    back.verify()
    assert str(back) == str(plan)
    assert back.roles["c"] is Role.CONSTANT and list(back.constants) == ["w", "b", "c"]
    assert back.constants["w"].dtype == np.float32 and back.constants["w"].shape == (3, 2)
    assert not any(a.any() for a in back.constants.values())
    w = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(parse_plan(str(plan), {"w": w}).constants["w"], w)
    with pytest.raises(WeightError, match="constant 'w' is float32\\[3, 2\\]; the array given for it is "
                                          "float64\\[3, 2\\]") as err:
        parse_plan(str(plan), {"w": w.astype(np.float64)})
    assert err.value.line == 3
    with pytest.raises(WeightError, match="arrays given for \\['v'\\], which the text declares no 'const'"):
        parse_plan(str(plan), {"v": w})


CHAIN_GRAPH = """graph chain(%x: float32[16]) -> (%y: float32[16]) opset 17 {
  %a = Relu(%x)  # a
  %b = Neg(%a)  # b
  %c = Relu(%b)  # c
  %y = Neg(%c)  # y
}"""

RELU = """def k(float32(16) X0) -> (float32(16) Y) {
  Y(i0) = max(X0(i0), 0.0)
      where i0 in 0:16
}"""
NEG = """def k(float32(16) X0) -> (float32(16) Y) {
  Y(i0) = -X0(i0)
      where i0 in 0:16
}"""

CHAIN = f"""plan @chain(%x: float32[16]) -> (%y: float32[16] out) {{
  arena 128 bytes (naive 256)
  (%a: float32[16] @arena+0) = k(%x)  // a
  (%b: float32[16] @arena+64) = k(%a)  // b
  (%c: float32[16] @arena+0) = k(%b)  // c
  (%y: float32[16]) = k(%c)  // y
}}

// a
{RELU}

// b
{NEG}

// c
{RELU}

// y
{NEG}"""


def test_the_memory_planner_reuses_a_dead_buffer():
    """c takes a's bytes (a is dead once b is computed); a placement by hand that does
    not reuse them is a valid plan, but not the planner's."""
    assert str(plan_graph(parse_graph(CHAIN_GRAPH), {"x": (16,)})) == CHAIN
    plan = parse_plan(CHAIN)
    plan.verify()
    assert plan_memory(plan.steps, plan.types, set(plan.outputs)) == plan.memory
    spread = parse_plan(CHAIN.replace("%c: float32[16] @arena+0", "%c: float32[16] @arena+128")
                        .replace("arena 128 bytes", "arena 192 bytes"))
    spread.verify()
    assert spread.memory.offsets == {"a": 0, "b": 64, "c": 128}
    assert plan_memory(spread.steps, spread.types, set(spread.outputs)).offsets == {"a": 0, "b": 64, "c": 0}


def test_the_verifier_refuses_plans_written_by_hand():
    # c in b's bytes while c's step reads b
    overlapping = parse_plan(CHAIN.replace("%c: float32[16] @arena+0", "%c: float32[16] @arena+64"))
    with pytest.raises(IRVerificationError, match="plan 'chain': 'b' and 'c' are live at the same time "
                                                  "and overlap in the arena"):
        overlapping.verify()
    outside = parse_plan(CHAIN.replace("arena 128 bytes", "arena 64 bytes"))
    with pytest.raises(IRVerificationError, match="'b' at arena offset 64 \\(64 bytes\\) is misaligned "
                                                  "or outside the arena of 64 bytes"):
        outside.verify()
    # the kernel of step a writes 16 floats; the buffer holds 15
    short = parse_plan(CHAIN.replace("(%a: float32[16] @arena+0)", "(%a: float32[15] @arena+0)"))
    with pytest.raises(IRVerificationError, match="step 0 \\(a\\): k defines 'Y' as float32\\[16\\]; "
                                                  "buffer 'a' is float32\\[15\\]"):
        short.verify()
    early = parse_plan(CHAIN.replace("k(%x)  // a", "k(%c)  // a"))
    with pytest.raises(IRVerificationError, match="step 0 \\(a\\) reads 'c' before any step defines it"):
        early.verify()


# what is replaced in CHAIN, by what, the error, its message, the line it names
MALFORMED = {
    "unknown type": ("float32[16] @arena+64", "float33[16] @arena+64", GraphSyntaxError,
                     "unknown element type 'float33'", 4),
    "no label": ("k(%a)  // b", "k(%a)", GraphSyntaxError, "expected '//' and the step's label, found '\\('", 5),
    "stray character": ("k(%x)  // a", "k($x)  // a", GraphSyntaxError, "expected a %value, found '\\$'", 3),
    "symbolic dimension": ("%b: float32[16]", "%b: float32[n]", GraphSyntaxError,
                           "buffer 'b' is float32\\[n\\]: a plan's dimensions are integers", 4),
    "undeclared buffer": ("k(%b)  // c", "k(%q)  // c", GraphSyntaxError, "'q' has no type", 5),
    "declared twice unlike": ("(%y: float32[16])", "(%y: float32[15])", GraphSyntaxError,
                              "'y' is declared float32\\[15\\] here and float32\\[16\\] on line 1", 6),
    "negative offset": ("@arena+64", "@arena+-64", GraphSyntaxError,
                        "expected a byte offset into the arena, found '-64'", 4),
    "temporary with no offset": ("%b: float32[16] @arena+64", "%b: float32[16]", GraphSyntaxError,
                                 "'b' is in the arena, but is declared with no '@arena\\+N' offset", 4),
    "output with an offset": ("%y: float32[16]", "%y: float32[16] @arena+128", GraphSyntaxError,
                              "'y' is declared at '@arena\\+128', but is not in the arena", 1),
    "wrong role": ("%y: float32[16] out", "%y: float32[16] inout", GraphSyntaxError,
                   "output 'y' is marked inout; in this plan it is out", 1),
    "kernel name": ("k(%x)  // a", "f(%x)  // a", GraphSyntaxError,
                    "kernel step 'a' calls 'f'; the definition after '// a' \\(line 9\\) is 'k'", 3),
    "kernel label": ("// y\ndef", "// z\ndef", GraphSyntaxError, "kernel step 'y' needs the definition after '// y'; "
                     "the next one after the plan is '// z' \\(line 27\\)", 6),
    "no definition": (f"\n\n// y\n{NEG}", "", GraphSyntaxError, "kernel step 'y' has no definition", 6),
    "a definition too many": (f"// y\n{NEG}", f"// y\n{NEG}\n\n// w\n{NEG}", GraphSyntaxError,
                              "'// w' defines a kernel no kernel step is left to call", 33),
    "bad TC": ("// y\ndef k(", "// y\ndef k((", TCSyntaxError, "expected a type name, found '\\('", 28),
    "text after the plan": ("}\n\n// a", "} trailing\n\n// a", GraphSyntaxError,
                            "expected nothing after the plan's '}' on its line", 7),
    "text before a label": ("}\n\n// a", "}\nstray\n// a", GraphSyntaxError,
                            "expected a kernel's definition after a '// label' line", 8),
    "cut short": (CHAIN[CHAIN.index("  (%b"):], "", GraphSyntaxError, "expected '}', found end of input", 4),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_text_is_an_error_naming_its_line(case):
    replaced, replacement, error, message, line = MALFORMED[case]
    assert CHAIN.count(replaced) == 1 or case == "output with an offset"   # the header's and the step's
    with pytest.raises(error, match=message) as err:
        parse_plan(CHAIN.replace(replaced, replacement))
    assert type(err.value) is error and err.value.line == line


def test_text_cut_or_missing_a_character_is_an_error_with_a_line():
    """Every prefix of the steps, and the steps less any one character: a plan (which
    verifies or not, and parses back from its text), or a polyfuse error naming a line,
    never another exception."""
    end = CHAIN.index("\n}\n") + 3
    texts = [CHAIN[:k] for k in range(end)] + [CHAIN[:k] + CHAIN[k + 1:] for k in range(end)]
    failed = 0
    for text in texts:
        try:
            plan = parse_plan(text)
        except FrontendError as err:
            assert err.line is not None, (text, err)
            failed += 1
            continue
        try:   # a name or label a character shorter, a space less: a plan that prints as it parses
            plan.verify()
        except IRVerificationError:
            pass
        assert str(parse_plan(str(plan))) == str(plan)
    assert failed > len(texts) * 0.8


def test_errors_show_the_line_and_a_caret():
    with pytest.raises(FrontendError) as err:
        parse_plan(CHAIN.replace("k(%b)  // c", "k(%q)  // c"), filename="chain.plan")
    assert str(err.value).splitlines() == [
        "chain.plan:5:34: error: 'q' has no type: no declaration ('%name: type') in the text gives one",
        "      (%c: float32[16] @arena+0) = k(%q)  // c",
        "                                     ^~"]


def test_a_loop_carries_what_its_body_gives():
    text = str(plan_graph(parse_graph(SCAN), {"x": (3,)}))
    with pytest.raises(GraphSyntaxError, match="'carry' names 2 values; the loop carries 1") as err:
        parse_plan(text.replace("carry (%loop/y_out)", "carry (%loop/y_out, %loop/y_out)"))
    assert err.value.line == text[:text.index("next %loop/c_out carry")].count("\n") + 1


EARLY_EXIT = """graph g(%x: float32[3], %limit: float32[]) -> (%y: float32[3], %ys: float32[n, 3]) opset 17 {
  %M = constant int64[] [8]
  %y, %ys = Loop(%M, _, %x, %limit, body=graph body(%i: int64[], %c_in: bool[], %y_in: float32[3]) captures(%limit) -> (%c_out: bool[], %y_out: float32[3], %sq: float32[3]) {
      %y_out = Add(%y_in, %y_in)  # double
      %s = ReduceSum(%y_out, keepdims=0)  # sum
      %c_out = Less(%s, %limit)  # below
      %sq = Mul(%y_out, %y_out)  # square
    })  # loop
}"""


def test_a_plan_with_a_tail_is_refused():
    """The scans of a loop that may stop early are cut at run time: the plan's tail, whose
    nodes its text does not hold."""
    text = str(plan_graph(parse_graph(EARLY_EXIT), {"x": (3,), "limit": ()}))
    tail = "  then at run time: the outputs of Loop loop cut to their counts, and 0 nodes after it"
    assert tail in text.split("\n")
    with pytest.raises(GraphSyntaxError, match="a plan's tail \\(what it leaves to run time\\) cannot be read "
                                               "back: its text does not hold the nodes it runs") as err:
        parse_plan(text)
    assert err.value.line == text.split("\n").index(tail) + 1
