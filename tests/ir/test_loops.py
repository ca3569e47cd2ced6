"""Loop IR: text round trip, verifier, and passes checked with the loop interpreter."""

from dataclasses import replace

import numpy as np
import pytest

from polyfuse.errors import IRVerificationError
from polyfuse.frontends.loop_ir import parse_kernel
from polyfuse.frontends.tc import parse, parse_definition
from polyfuse.ir.comprehension import IndexVar, Literal
from polyfuse.ir.gpu import BlockLoops, LoopRange, SingleThread, ThreadFor, walk_gpu
from polyfuse.ir.loops import (For, If, Store, constant_trips, fold_stmts, perfect_nest, stmt_bodies, stmt_nodes,
                               walk_stmts)
from polyfuse.ir.loops_interpreter import interpret_kernel
from polyfuse.ir.loops_verify import verify_kernel
from polyfuse.ir.types import DType
from polyfuse.scheduler.loop_passes.unroll_and_jam import unroll_and_jam
from polyfuse.runtime.arguments import bind_arguments
from polyfuse.scheduler.options import MappingOptions
from polyfuse.scheduler.pipeline import schedule_definition
from tests.tc_programs import PROGRAMS

pytestmark = pytest.mark.unit

OPTIONS = [MappingOptions(),
           MappingOptions(tile_sizes=(3, 5, 2), register_tile=(2, 2), unroll_jam=2, vector_width=8,
                          reorder_reductions=True)]


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_parse_of_print_is_identity(program):
    d = parse(program.source)[program.entry]
    sizes = bind_arguments(d, program.make_inputs(np.random.default_rng(0))).sizes
    for options in OPTIONS:
        kernel = schedule_definition(d, sizes, options)
        text = str(kernel)
        again = parse_kernel(text)
        assert again == kernel, text
        assert str(again) == text


MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def test_verifier_rejects_broken_kernels():
    k = schedule_definition(parse_definition(MM), {"M": 8, "K": 4, "N": 8}, MappingOptions())
    verify_kernel(k)
    loop = k.body[0]
    with pytest.raises(IRVerificationError, match="outside a loop"):
        verify_kernel(replace(k, body=(loop.body[0],)))  # the inner loop without the outer one
    with pytest.raises(IRVerificationError, match="not a writable buffer"):
        verify_kernel(parse_kernel(str(k).replace("  C(c0, c1) = acc1", "  A(c0, c1) = acc1")))


def test_unroll_and_jam_keeps_results():
    d = parse_definition(MM)
    sizes = {"M": 8, "K": 6, "N": 12}
    rng = np.random.default_rng(0)
    args = {"A": rng.standard_normal((8, 6)).astype(np.float32),
            "B": rng.standard_normal((6, 12)).astype(np.float32)}
    opts = MappingOptions(tile_sizes=(4, 6, 0), register_tile=(4, 6, 0), point_order=(2, 0, 1),
                          reorder_reductions=True)
    plain = schedule_definition(d, sizes, opts)
    jammed = unroll_and_jam(plain, 4)
    assert str(jammed) != str(plain)
    innermost = [s for s in walk_stmts(jammed.body)
                 if isinstance(s, For) and not any(isinstance(c, For) for c in s.body)]
    assert any(len(s.body) == 4 for s in innermost)
    np.testing.assert_allclose(interpret_kernel(jammed, args)["C"], args["A"] @ args["B"], rtol=1e-5)


GUARDED = """kernel g(in float32(8, 3) A, out float32(8) O) {
  for c0 in 0:8 {
    if c0 < 5 {
      for c1 in 0:3 {
        O(c0) = O(c0) + A(c0, c1)
      }
    } else {
      O(c0) = 0.0
    }
  }
}"""


def _describe(s) -> str:
    return s.var if hasattr(s, "var") else type(s).__name__


def test_walk_stmts_goes_into_every_body_and_only_where_asked():
    body = parse_kernel(GUARDED).body
    assert [_describe(s) for s in walk_stmts(body)] == ["c0", "If", "c1", "Store", "Store"]
    outer = [_describe(s) for s in walk_stmts(body, into=lambda s: not isinstance(s, If))]
    assert outer == ["c0", "If"]
    assert [len(b) for b in stmt_bodies(body[0].body[0])] == [1, 1]


def test_walk_stmts_goes_into_the_gpu_irs_bodies():
    i64 = DType.INT64
    store = Store("O", (IndexVar("t"),), Literal(1.0, DType.FLOAT32))
    region = ThreadFor("t", Literal(0, i64), Literal(8, i64), 0, (store,))
    launch = (BlockLoops((LoopRange("b", 0, 1, 4),), (region, SingleThread((store,)))),)
    assert [_describe(s) for s in walk_gpu(launch)] == ["BlockLoops", "t", "Store", "SingleThread", "Store"]
    assert list(stmt_nodes(region)) == [Literal(0, i64), Literal(8, i64)]
    assert [_describe(s) for s in walk_stmts(launch, into=lambda s: not isinstance(s, ThreadFor))] == \
        ["BlockLoops", "t", "SingleThread", "Store"]


def test_fold_stmts_sees_what_each_statement_holds_first():
    def instances(s, inner) -> int:
        if isinstance(s, For):
            return (constant_trips(s) or 0) * sum(inner[0])
        if isinstance(s, If):
            return max(sum(inner[0]), sum(inner[1]))
        return 1
    assert fold_stmts(parse_kernel(GUARDED).body, instances) == [8 * 3]


def test_perfect_nest_follows_single_loops_down():
    k = parse_kernel(GUARDED)
    assert [lp.var for lp in perfect_nest(k.body[0])] == ["c0"]
    mm = schedule_definition(parse_definition(MM), {"M": 8, "K": 4, "N": 8}, MappingOptions())
    c0, c1, c2 = (s for s in walk_stmts(mm.body) if isinstance(s, For))
    assert perfect_nest(c0) == [c0, c1]
    assert perfect_nest(c1) == [c1]   # the accumulator's load and store sit beside c2
    assert perfect_nest(c2) == [c2]
