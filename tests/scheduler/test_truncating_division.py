"""Index arithmetic with C's truncating `/` and `%` in the polyhedral model and schedules."""

import islpy as isl
import numpy as np
import pytest

from polyfuse.frontends.tc import parse_definition
from polyfuse.ir.comprehension import Binary, BinaryOp, Call, IndexVar, Literal
from polyfuse.ir.loops_interpreter import interpret_kernel
from polyfuse.ir.types import DType
from polyfuse.runtime.arguments import bind_arguments
from polyfuse.scheduler.model import build_model, isl_expr
from polyfuse.scheduler.options import Fusion, MappingOptions
from polyfuse.scheduler.pipeline import schedule_definition
from polyfuse.scheduler.schedule import compute_schedule

pytestmark = pytest.mark.unit

I32 = DType.INT32
VALUES = range(-13, 14)


def _points(expr, oracle) -> tuple[isl.Map, isl.Map]:
    ctx = isl.Context()
    text = isl_expr(expr, {"i": "i"})
    modelled = isl.Map.read_from_str(ctx, f"{{ S[i] -> [{text}] : -13 <= i <= 13 }}")
    exact = isl.Map.read_from_str(ctx, "{ " + "; ".join(f"S[{v}] -> [{oracle(v)}]" for v in VALUES) + " }")
    return modelled, exact


@pytest.mark.parametrize("d", [1, 2, 3, 7])
def test_isl_models_truncating_division_and_remainder_exactly(d):
    i, lit = IndexVar("i"), Literal(d, I32)
    div, mod = Binary(BinaryOp.DIV, i, lit, I32), Binary(BinaryOp.MOD, i, lit, I32)
    for expr, oracle in [(div, lambda v: int(np.trunc(v / d))), (mod, lambda v: int(np.fmod(v, d)))]:
        modelled, exact = _points(expr, oracle)
        assert modelled.is_equal(exact), (str(expr), str(modelled))
    for fn, oracle in [("floordiv", lambda v: v // d), ("floormod", lambda v: v % d)]:
        modelled, exact = _points(Call(fn, (i, lit), I32), oracle)
        assert modelled.is_equal(exact), fn


# a producer and a consumer whose index divides a value that goes negative: the
# dependences (and so fusion and tiling) must follow truncation, not flooring
PIPELINE = """
def f(int32(N) A) -> (T, O, P) {
    T(i) = A(i) * 3 - 1
    O(i) = T((i - 5) / 2 + 2) + T((i - 3) % 3 + 2)
    P(i) +=! T((i - k) / 3 + 2) where i in 0:N, k in 0:7
}
"""


def _oracle(A):
    T = A * 3 - 1
    i = np.arange(2 * len(A) + 1)
    tdiv = lambda a, b: np.trunc(a / b).astype(np.int64)
    O = T[tdiv(i - 5, 2) + 2] + T[np.fmod(i - 3, 3) + 2]
    P = np.array([sum(T[tdiv(j - k, 3) + 2] for k in range(7)) for j in range(len(A))])
    return {"T": T, "O": O, "P": P}


@pytest.mark.parametrize("options", [
    MappingOptions(), MappingOptions(tile_sizes=(3, 2)), MappingOptions(fusion=Fusion.MAX, tile_sizes=(4,)),
    MappingOptions(fusion=Fusion.MIN), MappingOptions(tile_sizes=(2, 3), reorder_reductions=True),
], ids=["default", "tiled", "max-fusion-tiled", "min-fusion", "tiled-reordered"])
def test_negative_division_indices_schedule_correctly(options):
    d = parse_definition(PIPELINE)
    A = np.arange(-4, 6, dtype=np.int32) * np.array([1, -1] * 5, np.int32)
    bound = bind_arguments(d, (A,))
    got = interpret_kernel(schedule_definition(d, bound.sizes, options), bound.values)
    for name, want in _oracle(A.astype(np.int64)).items():
        np.testing.assert_array_equal(got[name], want, err_msg=name)


def test_dependences_follow_truncation():
    # O(4) reads T(-1 / 2 + 2) == T(2) (flooring would say T(1)); the model must say so
    model = build_model(parse_definition("def f(int32(N) A) -> (T, O) {\n"
                                         " T(i) = A(i)\n O(i) = T((i - 5) / 2 + 2)\n}"))
    flow = model.exact.intersect_domain(isl.UnionSet.read_from_str(model.ctx, "[s_N] -> { S0[2] }"))
    reached = isl.UnionSet.read_from_str(model.ctx, "[s_N] -> { S1[i] : 4 <= i <= 6 and s_N >= 3 }")
    assert reached.is_subset(flow.range())
    assert flow.range().intersect(isl.UnionSet.read_from_str(model.ctx, "[s_N] -> { S1[3] }")).is_empty()
    assert compute_schedule(model, MappingOptions()) is not None
