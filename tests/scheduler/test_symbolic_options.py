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
