"""The search space and strategies, on synthetic costs (nothing is compiled here)."""

import math
from dataclasses import replace

import numpy as np
import pytest

from polyfuse.autotune.search import CostModel, GeneticSearch, RandomSearch, Selection
from polyfuse.autotune.space import SearchSpace
from polyfuse.autotune.task import Task
from polyfuse.errors import ArgumentError
from polyfuse.frontends.tc import parse
from polyfuse.scheduler.options import Fusion, MappingOptions
from tests.tc_programs import PROGRAMS


MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
CONV = "def conv(float(N,C,H,W) I, float(M,C,KH,KW) Wt) -> (O) { O(n,m,h,w) +=! I(n,c,h+kh,w+kw) * Wt(m,c,kh,kw) }"
SOFTMAX = """def softmax(float(N,D) X) -> (mx, e, s, Y) {
    mx(n) max=! X(n,d)
    e(n,d) = exp(X(n,d) - mx(n))
    s(n) +=! e(n,d)
    Y(n,d) = e(n,d) / s(n)
}"""
ADD = "def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }"

F32 = "float32"
MATMUL = Task(MM, "mm", ((256, 256), (256, 256)), (F32, F32))
TASKS = {
    "matmul": MATMUL,
    "matmul300": Task(MM, "mm", ((300, 256), (256, 256)), (F32, F32)),
    "conv": Task(CONV, "conv", ((1, 64, 58, 58), (64, 64, 3, 3)), (F32, F32)),
    "softmax": Task(SOFTMAX, "softmax", ((128, 1000),), (F32,)),
}
SPACES = {name: SearchSpace.for_task(t) for name, t in TASKS.items()}
MM_SPACE = SPACES["matmul"]

# A fake runner: cost 1 (ms) at a hidden point, more the further tile sizes, vector
# width, point order, parallelism and unroll_jam are from it; fixed sizes with maximal
# fusion "time out".
BEST_TILES = (32, 128, 64)


def fake_cost(o: MappingOptions) -> float:
    if o.fix_sizes and o.fusion is Fusion.MAX:
        return math.inf
    cost = 1.0
    for t, best, e in zip(o.tile_sizes or (0, 0, 0), BEST_TILES, MM_SPACE.nest.extents):
        cost += 0.4 * abs(math.log2(min(t or e, e)) - math.log2(best))
    cost += 1.0 * (o.vector_width != 16) + 1.5 * (o.parallel == 0) + 0.5 * (o.point_order != (2, 0, 1))
    cost += 0.3 * abs(math.log2(o.unroll_jam) - 2)
    return 1e-3 * cost


OPTIMUM = 1e-3


def tune(search, budget: int, cost=fake_cost, batch: int = 16, target: float = 0.0):
    """Ask and tell until ``budget`` points are measured or one costs ``target``."""
    asked = []
    while len(search.history) < budget and not (search.best and search.best[1] <= target):
        points = search.ask(min(batch, budget - len(search.history)))
        if not points:
            break
        asked += points
        search.tell(points, [cost(o) for o in points])
    return asked


# --- the space ------------------------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("name", SPACES)
def test_default_is_the_heuristic_and_valid(name):
    space = SPACES[name]
    assert space.is_valid(space.default())
    assert space.default() == space.heuristic


@pytest.mark.unit
def test_band_members_and_candidates():
    conv = SPACES["conv"]
    assert conv.nest.members == ("n", "m", "h", "w", "c", "kh", "kw")
    assert conv.nest.extents == (1, 64, 56, 56, 64, 3, 3)
    assert conv.candidates["tile_sizes.2"] == (0, 1, 2, 4, 7, 8, 14, 16, 28, 32, 56)
    assert conv.candidates["tile_sizes.0"] == (0, 1)
    assert conv.candidates["fix_sizes"] == (False,)  # N = 1: isl would drop n from the band
    assert conv.candidates["vector_width"] == (1, 4, 8, 16)
    assert len(MM_SPACE.candidates["point_order"]) == 6  # every permutation, identity as ()
    assert 10 < len(conv.candidates["point_order"]) < 100  # a few of the 5040
    assert MM_SPACE.candidates["register_tile.1"][:8] == (0, 1, 2, 4, 6, 7, 8, 12)
    assert MM_SPACE.size > 10 ** 6


@pytest.mark.unit
@pytest.mark.parametrize("name", SPACES)
def test_samples_mutations_and_children_are_valid(name):
    space = SPACES[name]
    rng = np.random.default_rng(0)
    points = [space.sample(rng) for _ in range(150)]
    points += [space.mutate(p, rng, 0.3) for p in points[:50]]
    points += [space.crossover(points[i:i + 3], rng) for i in range(0, 60, 3)]
    for p in points:
        assert space.violations(p) == [], p
        assert space.repair(p) == p == space.canonical(p)
    assert len(set(points)) > 0.9 * len(points)


@pytest.mark.unit
def test_canonical_forms_write_one_kernel_one_way():
    base = MappingOptions(tile_sizes=(32, 64, 0), register_tile=(4, 16, 0), unroll_jam=4, vector_width=16)
    c = MM_SPACE.canonical
    assert c(base) == base
    assert c(replace(base, point_order=(0, 1, 2), tile_order=(0, 1, 2))) == base
    assert c(replace(base, register_tile=(4, 64, 0))) == replace(base, register_tile=(4, 0, 0))
    assert c(replace(base, intra_tile_fusion=Fusion.MIN)) == base  # one statement
    untiled = MappingOptions(tile_sizes=(0, 0, 0), register_tile=(4, 16, 0), tile_order=(2, 1, 0))
    assert c(untiled) == MappingOptions(tile_sizes=(0, 0, 0))
    # an identity order keeps the members in statement order, like tile sizes do
    assert c(MappingOptions(point_order=(0, 1, 2))) == MappingOptions(tile_sizes=(0, 0, 0))


@pytest.mark.unit
def test_violations_name_the_rule():
    space = MM_SPACE
    tiles = dict(tile_sizes=(64, 64, 64), point_order=(2, 0, 1))
    ok = MappingOptions(**tiles, register_tile=(8, 32, 0), unroll_jam=4, vector_width=16, unroll=2)
    assert space.violations(ok) == []
    assert "entries" in space.violations(replace(ok, tile_sizes=(64, 64)))[0]
    assert "does not divide both" in space.violations(replace(ok, register_tile=(6, 32, 0), unroll_jam=1))[0]
    assert "unroll_jam" in space.violations(replace(ok, register_tile=(0, 32, 0)))[0]
    assert "unroll_jam" in space.violations(replace(ok, unroll_jam=3))[0]
    assert "vector width" in space.violations(replace(ok, register_tile=(8, 4, 0), unroll=1))[0]
    assert "exceeds" in space.violations(replace(ok, unroll=4))[0]
    conv = SPACES["conv"]
    assert "fix_sizes" in conv.violations(replace(conv.repair(conv.default()), fix_sizes=True))[0]


@pytest.mark.unit
def test_repair_adapts_the_options_of_other_shapes():
    space = SPACES["matmul300"]
    heuristic = space.default()  # 6 register rows of 4 vectors in a 60-row tile
    assert space.violations(heuristic) == [] and heuristic.tile_sizes[0] == 60
    elsewhere = replace(heuristic, register_tile=(8, 32, 0), unroll_jam=8)  # 8 rows do not divide 60
    assert space.violations(elsewhere)
    fixed = space.repair(elsewhere)
    assert space.violations(fixed) == []
    assert fixed.register_tile == (6, 32, 0) and fixed.unroll_jam == 6  # rows dividing 60 and 300
    conv = SPACES["conv"]
    assert conv.violations(conv.repair(MM_SPACE.default())) == []  # another band entirely


@pytest.mark.unit
def test_features_describe_the_loops():
    space = MM_SPACE
    names = space.feature_names()
    rng = np.random.default_rng(0)
    x = np.array([space.features(space.sample(rng)) for _ in range(50)])
    assert x.shape == (50, len(names)) and np.isfinite(x).all()
    f = dict(zip(names, space.features(space.default())))
    # cache tiles of 60 rows (whole 6-row blocks)
    assert f["m.log_tile"] == math.log2(60) and f["n.log_trip"] == 6 and f["n.innermost"] == 1
    assert f["m.jammed"] == 1
    # a 6 x 64 register block over all 256 steps of k (a reduction that short stays whole)
    assert f["log_vector_width"] == 4 and f["log_register_block"] == math.log2(6 * 64 * 256)
    assert f["n.contiguous"] > f["m.contiguous"]


def _tensor_programs():
    for p in PROGRAMS:
        args = p.make_inputs(np.random.default_rng(0))
        if all(isinstance(a, np.ndarray) for a in args):
            yield pytest.param(Task.of(parse(p.source)[p.entry], list(args)), id=p.name)


@pytest.mark.unit
@pytest.mark.parametrize("task", list(_tensor_programs()))
def test_every_catalogue_kernel_gets_a_space(task):
    space = SearchSpace.for_task(task)
    search = GeneticSearch(space, population=8, seed=0)
    asked = tune(search, 24, cost=lambda o: 1e-3 * (1 + o.unroll + sum(o.tile_sizes)), batch=8)
    assert asked[0] == space.default() and len(asked) == 24
    assert all(space.is_valid(o) for o in asked)
    assert len({space.canonical(o) for o in asked}) == 24
    assert np.isfinite(np.array([space.features(o) for o in asked])).all()


# --- ask and tell -------------------------------------------------------------------------

STRATEGIES = {
    "genetic": lambda space, seed: GeneticSearch(space, population=16, seed=seed),
    "proportional": lambda space, seed: GeneticSearch(space, population=16, selection=Selection.PROPORTIONAL,
                                                      seed=seed),
    "genetic+model": lambda space, seed: GeneticSearch(space, population=16, cost_model=CostModel(), seed=seed),
    "random": lambda space, seed: RandomSearch(space, seed=seed),
}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_default_first_then_valid_distinct_points(strategy):
    for space in (MM_SPACE, SPACES["conv"]):
        search = STRATEGIES[strategy](space, 0)
        asked = tune(search, 120, cost=lambda o: 1e-3 + 1e-4 * sum(o.tile_sizes), batch=7)
        assert asked[0] == space.default()
        assert len(asked) == 120
        assert all(space.is_valid(o) for o in asked)
        assert len({space.canonical(o) for o in asked}) == len(asked)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_same_seed_same_asks(strategy):
    runs = [tune(STRATEGIES[strategy](MM_SPACE, seed), 96) for seed in (3, 3, 4)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_small_space_is_used_up_without_repeats():
    space = SearchSpace.for_task(Task(ADD, "add", ((4,), (4,)), (F32, F32)))
    assert space.enumerable
    search = GeneticSearch(space, population=8, seed=0)
    asked = tune(search, 10_000, cost=lambda o: 1e-3 * (1 + o.unroll))
    assert len(asked) == space.size + 1  # every valid point, and the default (outside the rules)
    assert len({space.canonical(o) for o in asked}) == len(asked)
    assert search.ask(5) == []


@pytest.mark.unit
def test_failed_candidates_never_become_elites():
    search = GeneticSearch(MM_SPACE, population=12, elites=4, seed=1)

    def flaky(o: MappingOptions) -> float:  # the default and a third of the rest fail
        return math.inf if o == MM_SPACE.default() or hash(o) % 3 == 0 else fake_cost(o)

    for _ in range(8):
        points = search.ask(12)
        search.tell(points, [flaky(o) for o in points])
        assert search.elites and all(math.isfinite(c) for _, c in search.elites)
        assert len(search.elites) <= 4
    assert math.isfinite(search.best[1])
    assert any(math.isinf(c) for _, c in search.history)


@pytest.mark.unit
def test_told_points_are_not_asked_and_bad_tells_are_refused():
    search = GeneticSearch(MM_SPACE, population=8, seed=0)
    warm = [MM_SPACE.sample(np.random.default_rng(9)) for _ in range(4)]
    search.tell(warm, [2e-3, 1e-3, math.nan, 3e-3])
    assert search.best == (warm[1], 1e-3)
    asked = tune(search, 60)
    assert not {MM_SPACE.canonical(o) for o in asked} & {MM_SPACE.canonical(o) for o in warm}
    with pytest.raises(ArgumentError, match="2 options and 1 costs"):
        search.tell(warm[:2], [1.0])
    with pytest.raises(ArgumentError, match=">= 0"):
        search.tell(warm[:1], [-1.0])
    with pytest.raises(ArgumentError, match="another kernel"):
        search.tell([MappingOptions(tile_sizes=(8, 8))], [1.0])
    with pytest.raises(ArgumentError):
        GeneticSearch(MM_SPACE, population=4, elites=4)


# --- finding the optimum ------------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["genetic", "genetic+model"])
def test_genetic_search_finds_the_optimum(strategy):
    for seed in range(3):
        search = STRATEGIES[strategy](MM_SPACE, seed)
        tune(search, 400, target=OPTIMUM * 1.0001)
        assert search.best[1] == pytest.approx(OPTIMUM)


@pytest.mark.unit
def test_random_search_comes_within_a_small_factor():
    search = RandomSearch(MM_SPACE, seed=0)
    tune(search, 400)
    assert search.best[1] < 3 * OPTIMUM


def test_genetic_beats_random_on_average():
    def mean_best(make) -> float:
        bests = []
        for seed in range(4):
            search = make(MM_SPACE, seed)
            tune(search, 150)
            bests.append(search.best[1])
        return float(np.mean(bests))

    assert mean_best(STRATEGIES["genetic"]) < 0.7 * mean_best(STRATEGIES["random"])


# --- the cost model -----------------------------------------------------------------------

def _rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


@pytest.mark.unit
def test_cost_model_learns_a_cost_linear_in_the_features():
    rng = np.random.default_rng(0)
    space = SPACES["conv"]
    x = np.array([space.features(space.sample(rng)) for _ in range(300)])
    weights = rng.normal(size=x.shape[1])
    costs = np.exp(0.1 * (x - x.mean(axis=0)) @ weights) * 1e-3
    costs[:10] = np.inf  # failures are fitted as slow and do not break the fit
    model = CostModel()
    model.fit(x[:200], costs[:200])
    assert model.trained
    assert _rank_correlation(model.predict(x[200:]), costs[200:]) > 0.95


@pytest.mark.unit
def test_cost_model_waits_for_enough_measurements():
    model = CostModel(min_samples=8)
    model.fit(np.ones((5, 3)), np.ones(5))
    assert not model.trained
    with pytest.raises(ArgumentError, match="not been fitted"):
        model.predict(np.ones((1, 3)))
