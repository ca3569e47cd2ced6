"""The scheduler: legal schedules, legal parallel loops, options that change the code,
and loop IR that computes what the reference interpreter computes."""

from dataclasses import replace

import islpy as isl
import numpy as np
import pytest

from polyfuse.frontends.tc import parse_definition
from polyfuse.ir.comprehension_interpreter import interpret
from polyfuse.ir.loops import For, LoopKind, walk_stmts
from polyfuse.ir.loops_interpreter import interpret_kernel
from polyfuse.runtime.arguments import bind_arguments
from polyfuse.scheduler.model import build_model
from polyfuse.scheduler.options import Fusion, MappingOptions
from polyfuse.scheduler.pipeline import schedule_definition
from polyfuse.scheduler.schedule import (compute_schedule, member_carries_dependence,
                                         parallel_marks_are_legal, row_schedule)
from tests.tc_programs import PROGRAMS

pytestmark = pytest.mark.unit

OPTIONS = {
    "default": MappingOptions(),
    "tiled-odd": MappingOptions(tile_sizes=(3, 5, 2), unroll=8),
    "min-fusion": MappingOptions(fusion=Fusion.MIN),
    "preserve-tiled": MappingOptions(fusion=Fusion.PRESERVE, tile_sizes=(4, 4), tile_order=(1, 0)),
    "intra-tile-min": MappingOptions(tile_sizes=(2, 3), intra_tile_fusion=Fusion.MIN),
    "serial": MappingOptions(parallel=0),
    "rows": MappingOptions(fusion=Fusion.ROWS),
    "rows-tiled": MappingOptions(fusion=Fusion.ROWS, tile_sizes=(2, 0), vector_width=4),
    "micro-kernel": MappingOptions(tile_sizes=(8, 8, 8), register_tile=(4, 4, 0), point_order=(2, 0, 1),
                                   unroll_jam=2, reorder_reductions=True),
}

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
SOFTMAX = """def softmax(float(N, D) I) -> (O, mx, sm) {
  mx(n) max=! I(n, d)
  sm(n) +=! exp(I(n, d) - mx(n))
  O(n, d) = exp(I(n, d) - mx(n)) / sm(n)
}"""


@pytest.mark.parametrize("opt", OPTIONS, ids=list(OPTIONS))
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_loop_ir_equals_reference(program, opt):
    d = parse_definition(program.source) if program.source.count("def ") == 1 else \
        next(x for x in __import__("polyfuse.frontends.tc", fromlist=["parse"]).parse(program.source).definitions
             if x.name == program.entry)
    bound = bind_arguments(d, program.make_inputs(np.random.default_rng(0)))
    want = interpret(d, bound.values, bound.sizes)
    kernel = schedule_definition(d, bound.sizes, OPTIONS[opt])
    got = interpret_kernel(kernel, bound.values)
    for name, ref in want.items():
        np.testing.assert_allclose(got[name].astype(np.float64), ref.astype(np.float64),
                                   rtol=2e-3, atol=1e-3, err_msg=f"{program.name}:{name}")


@pytest.mark.parametrize("opt", OPTIONS, ids=list(OPTIONS))
@pytest.mark.parametrize("source", [MATMUL, SOFTMAX], ids=["matmul", "softmax"])
def test_schedule_respects_dependences_and_parallel_loops_are_coincident(source, opt):
    model = build_model(parse_definition(source))
    options = OPTIONS[opt]
    schedule = compute_schedule(model, options)
    smap = schedule.get_map()
    must_hold = model.relaxed if options.reorder_reductions else model.exact
    assert must_hold.is_subset(smap.lex_lt_union_map(smap))
    assert parallel_marks_are_legal(model, schedule)


def _outer_band(schedule: isl.Schedule) -> isl.ScheduleNode:
    node = schedule.get_root()
    while node.get_type() != isl.schedule_node_type.band:
        node = node.child(0)
    return node


def test_reduction_loop_carries_a_dependence_and_output_loops_do_not():
    model = build_model(parse_definition(MATMUL))
    band = _outer_band(compute_schedule(model, MappingOptions(parallel=0)))
    carried = [member_carries_dependence(model, band, j) for j in range(band.band_n_member())]
    assert carried == [False, False, True]


def test_producer_consumer_fusion_keeps_order():
    # max fusion puts the three softmax statements in one outer loop, in order
    kernel = schedule_definition(parse_definition(SOFTMAX), {"N": 512, "D": 256}, MappingOptions())
    outer = [s for s in kernel.body if isinstance(s, For)]
    assert len(outer) == 1 and outer[0].kind is LoopKind.PARALLEL
    written = [s.buffer for s in walk_stmts(outer[0].body) if hasattr(s, "buffer")]
    assert written.index("mx") < written.index("sm") < written.index("O")
    split = schedule_definition(parse_definition(SOFTMAX), {"N": 4, "D": 6},
                                MappingOptions(fusion=Fusion.MIN))
    assert len([s for s in split.body if isinstance(s, For)]) >= 3


def test_fusion_options_change_the_loops():
    d = parse_definition(SOFTMAX)
    fused = schedule_definition(d, {"N": 4, "D": 6}, MappingOptions())
    split = schedule_definition(d, {"N": 4, "D": 6}, MappingOptions(fusion=Fusion.MIN))
    assert str(fused) != str(split)
    tiled = MappingOptions(tile_sizes=(2,))
    inner_split = replace(tiled, intra_tile_fusion=Fusion.MIN)
    assert str(schedule_definition(d, {"N": 4, "D": 6}, tiled)) != \
        str(schedule_definition(d, {"N": 4, "D": 6}, inner_split))


@pytest.mark.parametrize("a,b", [
    (MappingOptions(), MappingOptions(tile_sizes=(4, 4, 4))),
    (MappingOptions(tile_sizes=(8, 8, 8)), MappingOptions(tile_sizes=(8, 8, 8), register_tile=(4, 4, 0))),
    (MappingOptions(tile_sizes=(8, 8, 8), reorder_reductions=True),
     MappingOptions(tile_sizes=(8, 8, 8), reorder_reductions=True, point_order=(2, 0, 1))),
    (MappingOptions(tile_sizes=(8, 8, 8), register_tile=(4, 4, 0), point_order=(2, 0, 1)),
     MappingOptions(tile_sizes=(8, 8, 8), register_tile=(4, 4, 0), point_order=(2, 0, 1), unroll_jam=4)),
    (MappingOptions(tile_sizes=(4, 8, 4)), MappingOptions(tile_sizes=(4, 8, 4), tile_order=(1, 0, 2))),
    (MappingOptions(), MappingOptions(parallel=0)),
    (MappingOptions(), MappingOptions(vector_width=8)),
    (MappingOptions(), MappingOptions(unroll=4)),
])
def test_each_option_changes_the_loops(a, b):
    d = parse_definition(MATMUL)
    sizes = {"M": 64, "K": 64, "N": 64}
    assert str(schedule_definition(d, sizes, a)) != str(schedule_definition(d, sizes, b))


def test_a_schedule_out_of_isl_operations_fuses_less(monkeypatch):
    """Past its operation budget, a fusing schedule falls back to less fusion (here down
    to a nest per statement, which has no budget), and stays right."""
    d = parse_definition(SOFTMAX)
    sizes = {"N": 5, "D": 7}
    fused = schedule_definition(d, sizes, MappingOptions())
    monkeypatch.setattr("polyfuse.scheduler.schedule.SCHEDULE_OPERATIONS", 1)
    fallen = schedule_definition(d, sizes, MappingOptions())
    assert str(fallen) == str(schedule_definition(d, sizes, MappingOptions(fusion=Fusion.MIN)))
    assert str(fallen) != str(fused)
    x = np.random.default_rng(1).standard_normal((5, 7)).astype(np.float32)
    want = interpret(d, {"I": x}, sizes)
    got = interpret_kernel(fallen, {"I": x})
    np.testing.assert_allclose(got["O"], want["O"], rtol=1e-5)
    # the budget is lifted afterwards: the context computes anything again
    model = build_model(d)
    compute_schedule(model, MappingOptions(fusion=Fusion.MIN))
    assert model.ctx.get_max_operations() == 0


LAYERNORM = """def layernorm(float(B, N, D) X) -> (Y, mean, var) {
  mean(b, n) +=! X(b, n, d) / float(D)
  var(b, n) +=! (X(b, n, d) - mean(b, n)) * (X(b, n, d) - mean(b, n)) / float(D)
  Y(b, n, d) = (X(b, n, d) - mean(b, n)) * rsqrt(var(b, n) + 1e-5)
}"""


@pytest.mark.parametrize("source, rows", [(SOFTMAX, 1), (LAYERNORM, 2)], ids=["softmax", "layernorm"])
def test_a_row_pipeline_runs_every_statement_of_a_row_in_one_nest(source, rows):
    """Fusion.ROWS: one loop nest over the rows (every left-hand side's leading indices,
    parallel), each statement's own loops inside it, in program order."""
    d = parse_definition(source)
    model = build_model(d)
    schedule = row_schedule(model, model.exact)
    assert schedule is not None
    outer = _outer_band(schedule)
    assert outer.band_n_member() == rows and all(outer.band_member_get_coincident(j) for j in range(rows))
    assert outer.child(0).get_type() == isl.schedule_node_type.sequence
    sizes = dict(zip(d.sizes, (3, 5, 7)))
    kernel = schedule_definition(d, sizes, MappingOptions(fusion=Fusion.ROWS))
    assert len(kernel.body) == 1 and isinstance(kernel.body[0], For)
    nest = kernel.body[0]
    for _ in range(rows - 1):
        (nest,) = nest.body
    assert sum(isinstance(s, For) for s in nest.body) == len(d.statements)
    rng = np.random.default_rng(1)
    args = {"I" if "I(" in source else "X": rng.uniform(-2, 2, [sizes[n] for n in d.sizes]).astype(np.float32)}
    bound = bind_arguments(d, tuple(args.values()))
    want = interpret(d, bound.values, bound.sizes)
    got = interpret_kernel(kernel, bound.values)
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("source", [
    # rows of different extents: the row maxima of A and its column minima
    "def maxmin(float(M,N) A) -> (R, C) { R(i) max=! A(i,j)\n C(j) min=! A(i,j) }",
    # a row that reads another row's total
    "def f(float(N,D) X) -> (S, T) { S(n) +=! X(n,d)\n T(n,d) = X(n,d) / S(N - 1 - n) }",
    # one statement: nothing to fuse
    "def rowsum(float(N,D) X) -> (S) { S(n) +=! X(n,d) }",
], ids=["different-rows", "across-rows", "one-statement"])
def test_no_row_pipeline_where_rows_are_not_apart(source):
    d = parse_definition(source)
    model = build_model(d)
    assert row_schedule(model, model.exact) is None
    sizes = dict.fromkeys(d.sizes, 6)
    kernel = schedule_definition(d, sizes, MappingOptions(fusion=Fusion.ROWS))  # falls back to PRESERVE
    args = tuple(np.random.default_rng(2).uniform(1, 2, [6, 6]).astype(np.float32) for _ in d.inputs)
    bound = bind_arguments(d, args)
    want = interpret(d, bound.values, bound.sizes)
    got = interpret_kernel(kernel, bound.values)
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-5, err_msg=name)


GROUPED = """def grouped(float(1, H, H, GC) X, float(G, 16, 3, 3, 16) W, float(GC) B) -> (Y, T) {
  T(n, o0, o1, g, j) +=! (o0 + k0 >= 1 && o0 + k0 <= H && o1 + k1 >= 1 && o1 + k1 <= H) ? X(n, o0 + k0 - 1, o1 + k1 - 1, g * 16 + c) * W(g, c, k0, k1, j) : 0.0
      where n in 0:1, o0 in 0:H, o1 in 0:H, g in 0:G, j in 0:16, c in 0:16, k0 in 0:3, k1 in 0:3
  Y(n, o0, o1, m) = T(n, o0, o1, m / 16, m % 16) + B(m) where n in 0:1, o0 in 0:H, o1 in 0:H, m in 0:GC
}"""


@pytest.mark.unit
def test_tiles_made_for_the_heaviest_statement_leave_the_others_nests_in_their_order():
    """A grouped convolution's sum is tiled by the options; the copy of its result (a nest
    of its own, of other members) keeps its own order, the output's contiguous index
    innermost, instead of taking the sum's tiles position by position."""
    from polyfuse.ir.machine import MACHINES
    from polyfuse.scheduler.heuristics import default_options
    d = parse_definition(GROUPED)
    options = default_options(d, {"H": 14, "G": 4, "GC": 64}, MACHINES["skylake-avx512"])
    assert options.tile_sizes and options.fusion is Fusion.MIN
    sizes = {"H": 4, "G": 2, "GC": 32}   # (small enough for the loop interpreter)
    kernel = schedule_definition(d, sizes, options)
    # the loop directly around Y's stores (a jam may repeat the store for several rows)
    (copy,) = {f for f in walk_stmts(kernel.body) if isinstance(f, For)
               and any(getattr(s, "buffer", None) == "Y" for s in f.body)}
    store = next(s for s in copy.body if getattr(s, "buffer", None) == "Y")
    assert store.indices[-1].name == copy.var
    rng = np.random.default_rng(0)
    args = {"X": rng.standard_normal((1, 4, 4, 32)).astype(np.float32),
            "W": rng.standard_normal((2, 16, 3, 3, 16)).astype(np.float32),
            "B": rng.standard_normal(32).astype(np.float32)}
    np.testing.assert_allclose(interpret_kernel(kernel, args)["Y"], interpret(d, args, sizes)["Y"],
                               rtol=1e-4, atol=1e-4)
