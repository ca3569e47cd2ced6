"""Options of a kernel compiled for symbolic sizes hold for every value of them: a
symbolic batch may be 1, so the threads never share out its rows alone."""

import pytest

from polyfuse.frontends.tc import parse
from polyfuse.ir.machine import DEFAULT_MACHINE
from polyfuse.scheduler.heuristics import default_options

pytestmark = pytest.mark.unit

PROJECTION = "def proj(float(B,S,K) X, float(K,N) W) -> (Y) { Y(b,s,n) +=! X(b,s,k) * W(k,n) }"
SIZES = {"B": 16, "S": 64, "K": 3072, "N": 768}


@pytest.mark.parametrize("symbolic, first", [(frozenset(), "b"), (frozenset({"B", "S"}), "n"),
                                             (frozenset({"S"}), "b")])
def test_the_threads_share_rows_of_a_known_batch_and_columns_of_a_symbolic_one(symbolic, first):
    """(BERT's projections compiled ahead for a symbolic batch ran a batch of one on one
    thread: 1.8x the time of a kernel specialized to it)"""
    d = parse(PROJECTION).definitions[0]
    options = default_options(d, SIZES, DEFAULT_MACHINE, symbolic)
    members = ["b", "s", "n", "k"]   # (the nest's members: the output's indices, then the reduction's)
    assert members[options.tile_order[0]] == first


SOFTMAX = """def sm(float(B, R, C) X) -> (Y, M, S) {
  M(b, r) max=! X(b, r, c)
  Y(b, r, c) = exp(X(b, r, c) - M(b, r))
  S(b, r) +=! Y(b, r, c)
  Y(b, r, c) = Y(b, r, c) / S(b, r)
}"""


@pytest.mark.parametrize("symbolic, rows", [(frozenset(), False), (frozenset({"B", "R", "C"}), True),
                                            (frozenset({"C"}), True)])
def test_a_row_pipeline_over_symbolic_sizes_is_scheduled_row_by_row(symbolic, rows):
    """(isl fused softmax's four statements into one nest per row for known sizes but
    left the quotients to a second pass over symbolic ones: 1.5x at 1 x 256)"""
    from polyfuse.scheduler.options import Fusion
    d = parse(SOFTMAX).definitions[0]
    options = default_options(d, {"B": 2, "R": 64, "C": 77}, DEFAULT_MACHINE, symbolic)
    assert (options.fusion is Fusion.ROWS) == rows


@pytest.mark.parametrize("symbolic, heads", [(frozenset(), 3), (frozenset({"B", "S"}), 1)])
def test_heads_whose_panels_differ_are_tiled_one_by_one_over_symbolic_rows(symbolic, heads):
    """Attention's P.V reads a panel of V per head: with a symbolic number of rows, a
    tile of three heads had the pass pack each head's panel again for every tile of
    rows (1.4x the specialized kernel at 1 x 256)."""
    d = parse("def pv(float(B,H,S,S) A, float(B,H,S,D) V) -> (Y) { Y(b,h,s,d) +=! A(b,h,s,t) * V(b,h,t,d) }").definitions[0]
    options = default_options(d, {"B": 2, "H": 12, "S": 33, "D": 64}, DEFAULT_MACHINE, symbolic)
    assert options.tile_sizes[1] == heads   # (members: b, h, s, d, then t)
