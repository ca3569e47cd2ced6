"""Size expressions evaluated at concrete sizes: ``evaluate_int`` computes them directly
with TC's integer semantics (C's truncating ``/`` and ``%``, floor ``floordiv`` and
``floormod``, 0 for a division by 0), agreeing with sympy where sympy is exact and
fast enough for the heuristics to ask thousands of times."""

from __future__ import annotations

import random

import pytest

from polyfuse.ir.comprehension import Binary, BinaryOp, Call, Literal, SizeVar, Unary, UnaryOp
from polyfuse.ir.symbolic import evaluate_int, size_symbol, to_sympy
from polyfuse.ir.types import DType

pytestmark = pytest.mark.unit

I64 = DType.INT64
N, M, K = (SizeVar(n, I64) for n in "NMK")


def lit(v: int) -> Literal:
    return Literal(v, I64)


def b(op: BinaryOp, x, y) -> Binary:
    return Binary(op, x, y, I64)


@pytest.mark.parametrize("e, sizes, value", [
    (b(BinaryOp.DIV, lit(-7), lit(2)), {}, -3),                    # C truncates toward zero
    (b(BinaryOp.MOD, lit(-7), lit(2)), {}, -1),                    # with the dividend's sign
    (b(BinaryOp.MOD, M, lit(-4)), {"M": 10}, 2),
    (Call("floordiv", (lit(-7), lit(2)), I64), {}, -4),
    (Call("floormod", (lit(-7), lit(2)), I64), {}, 1),
    (b(BinaryOp.DIV, N, b(BinaryOp.SUB, M, M)), {"N": 5, "M": 3}, 0),   # a divisor 0 gives 0
    (Call("floordiv", (N, b(BinaryOp.SUB, M, lit(3))), I64), {"N": 5, "M": 3}, 0),
    # sympy's simplification got these wrong: K / K * (9 / 9) % N is 1, so the whole -1
    (b(BinaryOp.SUB, Call("min", (Call("floordiv", (lit(5), Call("max", (M, K), I64)), I64), lit(4)), I64),
       b(BinaryOp.MOD, b(BinaryOp.MUL, b(BinaryOp.DIV, K, K), b(BinaryOp.DIV, lit(9), lit(9))), N)),
     {"N": 9, "M": 20, "K": 5}, -1),
    (b(BinaryOp.MOD, b(BinaryOp.MUL, b(BinaryOp.MOD, b(BinaryOp.MOD, M, lit(-4)), b(BinaryOp.MUL, N, N)), lit(5)), K),
     {"N": 16, "M": 10, "K": 15}, 10),
    (Unary(UnaryOp.NEG, b(BinaryOp.ADD, N, lit(2)), I64), {"N": 3}, -5),
])
def test_size_expressions_take_tc_integer_semantics(e, sizes, value):
    assert evaluate_int(e, sizes) == value


def test_a_size_the_expression_needs_and_is_not_given_is_refused():
    with pytest.raises(ValueError, match="not fixed by sizes"):
        evaluate_int(b(BinaryOp.ADD, N, M), {"N": 2})


def test_expressions_without_truncating_division_agree_with_sympy():
    rng = random.Random(0)

    def gen(depth: int):
        if depth == 0 or rng.random() < 0.3:
            return lit(rng.randint(-7, 9)) if rng.random() < 0.5 else rng.choice((N, M, K))
        k = rng.random()
        if k < 0.5:
            return b(rng.choice((BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL)), gen(depth - 1), gen(depth - 1))
        if k < 0.7:   # floor division by a positive divisor
            return Call(rng.choice(("floordiv", "floormod")), (gen(depth - 1), lit(rng.randint(1, 5))), I64)
        if k < 0.9:
            return Call(rng.choice(("min", "max")), (gen(depth - 1), gen(depth - 1)), I64)
        return Unary(UnaryOp.NEG, gen(depth - 1), I64)

    for _ in range(500):
        e = gen(4)
        sizes = {"N": rng.randint(1, 20), "M": rng.randint(1, 20), "K": rng.randint(1, 20)}
        expected = to_sympy(e).subs({size_symbol(k): v for k, v in sizes.items()})
        assert evaluate_int(e, sizes) == int(expected), (e, sizes)
