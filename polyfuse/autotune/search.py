"""Search strategies over a :class:`SearchSpace`, driven by ask and tell.

``ask(n)`` proposes up to ``n`` points never asked or told before (fewer only when the
space has no others left); ``tell(options, costs)`` reports what they cost (seconds;
``inf`` or NaN for a candidate that failed to build, run or check). Strategies never
touch hardware; they are deterministic for a seed and ask the heuristic's options
first, so a tuning run never ends worse than the untuned compiler.

* :class:`RandomSearch`: uniform samples of the space.
* :class:`GeneticSearch`: Tensor Comprehensions' genetic tuner. A generation is bred
  from the last one and the elites (the best points measured so far, never a failed
  one): three parents chosen by tournament or in proportion to their fitness (1 /
  cost) make a child taking each gene from one of them, which is then mutated.
* :class:`CostModel`: ridge regression of log cost on the space's features. Given one,
  the genetic search breeds a larger pool of children and measures those the model
  ranks best (plus a few others, so a wrong model still gets corrected).
"""

from __future__ import annotations

import abc
import enum
import math
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from polyfuse.autotune.space import SearchSpace
from polyfuse.errors import ArgumentError
from polyfuse.scheduler.options import MappingOptions

SAMPLE_TRIES = 64      # random draws before a search concludes the space is (nearly) used up
TINY = 1e-12           # costs below a picosecond (a timer's 0) count as this
INITIAL_RATE = 0.4     # mutation rate of the first generation's copies of the default

Scored = list[tuple[MappingOptions, float]]   # points and their costs


class Selection(enum.Enum):
    """How the genetic search picks parents."""

    TOURNAMENT = "tournament"      # the best of a few random members of the population
    PROPORTIONAL = "proportional"  # with probability proportional to 1 / cost (TC's rule)


class Search(abc.ABC):
    """The ask/tell bookkeeping the strategies share; subclasses propose points."""

    def __init__(self, space: SearchSpace, seed: int) -> None:
        self.space = space
        self.rng = np.random.default_rng(seed)
        self.history: Scored = []
        self._seen: set[MappingOptions] = set()   # canonical forms asked or told
        self._listing: Iterator[MappingOptions] | None = None

    def ask(self, n: int) -> list[MappingOptions]:
        """Up to ``n`` new points to measure; the first one ever is the default."""
        out: list[MappingOptions] = []
        if n > 0 and not self._seen:
            out.append(self.space.default())
            self._claim(out[0])
        while len(out) < n:
            o = self._propose()
            if o is None:
                break
            out.append(o)
        return out

    def tell(self, options: Sequence[MappingOptions], costs: Iterable[float]) -> None:
        """Report measured costs; a point told without being asked is never asked."""
        costs = [float(c) for c in costs]
        if len(options) != len(costs):
            raise ArgumentError(f"tell got {len(options)} options and {len(costs)} costs")
        for o, c in zip(options, costs):
            if c < 0:
                raise ArgumentError(f"costs must be >= 0 (inf for a failed candidate), got {c}")
            wrong = [v for v in self.space.violations(o) if "entries" in v]
            if wrong:
                raise ArgumentError(f"options for another kernel: {wrong[0]}")
        told = [(o, math.inf if math.isnan(c) else c) for o, c in zip(options, costs)]
        for o, _ in told:
            self._claim(o)
        self.history += told
        self._observe(told)

    @property
    def best(self) -> tuple[MappingOptions, float] | None:
        """The cheapest point measured without failing."""
        finite = [h for h in self.history if math.isfinite(h[1])]
        return min(finite, key=lambda h: h[1]) if finite else None

    @abc.abstractmethod
    def _propose(self) -> MappingOptions | None:
        """A new point, claimed; None when the space has no more."""

    def _observe(self, told: Scored) -> None:
        """Learn from measured points (after they are in the history)."""

    def _claim(self, o: MappingOptions) -> bool:
        """Mark ``o`` as asked; False if it (or an equivalent point) already was."""
        key = self.space.canonical(o)
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    def _fresh(self, o: MappingOptions) -> bool:
        return self.space.canonical(o) not in self._seen

    def _sample_new(self) -> MappingOptions | None:
        """A random unasked point; in a small space, the next unasked one in the listing."""
        for _ in range(SAMPLE_TRIES):
            o = self.space.sample(self.rng)
            if self._claim(o):
                return o
        if not self.space.enumerable:
            return None
        if self._listing is None:
            self._listing = self.space.points()
        for o in self._listing:
            if self._claim(o):
                return o
        return None


class RandomSearch(Search):
    """Uniform samples of the space, after the default."""

    def __init__(self, space: SearchSpace, *, seed: int = 0) -> None:
        super().__init__(space, seed)

    def _propose(self) -> MappingOptions | None:
        return self._sample_new()


class GeneticSearch(Search):
    """Tensor Comprehensions' genetic search, seeded from the default heuristic.

    Generations have ``population`` members: the first is the default, copies of it
    mutated at a high rate and random samples; each later one keeps the ``elites`` best
    points measured so far (not measured again) and breeds the rest. Breeding waits for
    nothing: asking before telling breeds from what has been told.

    ``tournament``: entrants per tournament (with ``Selection.TOURNAMENT``). With a
    ``cost_model``, each generation breeds ``pool`` times the children it needs and
    keeps those predicted fastest, except a share ``explore`` drawn from the others.
    """

    def __init__(self, space: SearchSpace, *, population: int = 32, mutation_rate: float = 0.1,
                 elites: int = 4, selection: Selection = Selection.TOURNAMENT, tournament: int = 3,
                 cost_model: CostModel | None = None, pool: int = 8, explore: float = 0.1,
                 seed: int = 0) -> None:
        if population < 2 or not 0 <= elites < population or not 0 <= mutation_rate <= 1 \
                or tournament < 1 or pool < 1 or not 0 <= explore <= 1:
            raise ArgumentError("GeneticSearch needs population >= 2, 0 <= elites < population, "
                                "mutation_rate and explore in [0, 1], tournament and pool >= 1")
        super().__init__(space, seed)
        self.population, self.mutation_rate, self.elite_count = population, mutation_rate, elites
        self.selection, self.tournament = selection, tournament
        self.cost_model, self.pool, self.explore = cost_model, pool, explore
        self.generations = 0
        self._queue: list[MappingOptions] = []
        self._generation: Scored = []  # told since the last breeding
        self._features: list[np.ndarray] = []
        self._costs: list[float] = []

    def _propose(self) -> MappingOptions | None:
        for bred in (False, True):  # the current generation, else a new one
            while self._queue:
                o = self._queue.pop(0)
                if self._claim(o):
                    return o
            if not bred:
                self._queue = self._breed()
        return self._sample_new()

    def _observe(self, told: Scored) -> None:
        self._generation += told
        if self.cost_model is not None:
            self._features += [self.space.features(o) for o, _ in told]
            self._costs += [c for _, c in told]
            self.cost_model.fit(np.array(self._features), np.array(self._costs))

    def _breed(self) -> list[MappingOptions]:
        """The next generation's new members (unasked, distinct)."""
        parents = self._parents()
        self.generations += 1
        count = self.population - (len(parents[0]) if parents else 1)
        model = self.cost_model if self.cost_model is not None and self.cost_model.trained else None
        wanted = count * (self.pool if model is not None else 1)
        children: dict[MappingOptions, MappingOptions] = {}
        for _ in range(10 * wanted):
            if len(children) >= wanted:
                break
            child = self._child(parents)
            key = self.space.canonical(child)
            if key not in children and self._fresh(child):
                children[key] = child
        found = list(children.values())
        self._generation = []
        if model is None or len(found) <= count:
            return found[:count]
        ranked = np.argsort(model.predict(np.array([self.space.features(o) for o in found])), kind="stable")
        others = int(round(count * self.explore))
        keep = [found[i] for i in ranked[:count - others]]
        rest = [found[i] for i in ranked[count - others:]]
        picks = self.rng.choice(len(rest), size=min(others, len(rest)), replace=False) if others else []
        return keep + [rest[int(i)] for i in sorted(picks)]

    @property
    def elites(self) -> Scored:
        """The best distinct points measured so far, never a failed one: kept by the next
        generation without being measured again."""
        finite = sorted((h for h in self.history if math.isfinite(h[1])), key=lambda h: h[1])
        return _distinct(finite, self.space)[:self.elite_count]

    def _parents(self) -> tuple[Scored, Scored] | None:
        """(elites, population to select from), or None before any point succeeded."""
        elites = self.elites
        if not elites:
            return None
        current = self._generation or _distinct(sorted(self.history, key=lambda h: h[1]), self.space)[:self.population]
        return elites, _distinct(elites + current, self.space)

    def _child(self, parents: tuple[Scored, Scored] | None) -> MappingOptions:
        if parents is None:  # the first generation
            if self.rng.random() < 0.5:
                return self.space.sample(self.rng)
            return self.space.mutate(self.space.default(), self.rng, INITIAL_RATE)
        members = parents[1]
        trio = [members[self._select(members)][0] for _ in range(3)]
        return self.space.mutate(self.space.crossover(trio, self.rng), self.rng, self.mutation_rate)

    def _select(self, members: Scored) -> int:
        costs = np.array([c for _, c in members])
        if self.selection is Selection.PROPORTIONAL:
            fitness = np.where(np.isfinite(costs), 1.0 / np.maximum(costs, TINY), 0.0)
            p = fitness / fitness.sum() if fitness.sum() > 0 else None
            return int(self.rng.choice(len(members), p=p))
        entrants = self.rng.choice(len(members), size=min(self.tournament, len(members)), replace=False)
        return int(min(entrants, key=lambda i: (costs[i], i)))


def _distinct(points: Scored, space: SearchSpace) -> Scored:
    seen: set[MappingOptions] = set()
    out = []
    for o, c in points:
        key = space.canonical(o)
        if key not in seen:
            seen.add(key)
            out.append((o, c))
    return out


class CostModel:
    """Ridge regression of log cost on features and their squares (a sweet spot in a
    tile size is a parabola in its log), to rank points before measuring them.

    Failed candidates (cost inf) are left out: a failure says nothing about speed, and
    the search already keeps them out of the elites. Untrained until ``min_samples``
    points have a finite cost.
    """

    def __init__(self, *, alpha: float = 1.0, min_samples: int = 8) -> None:
        self.alpha, self.min_samples = alpha, min_samples
        self._weights: np.ndarray | None = None
        self._mean = self._scale = np.zeros(0)
        self._bias = 0.0

    @property
    def trained(self) -> bool:
        return self._weights is not None

    def fit(self, features: np.ndarray, costs: np.ndarray) -> None:
        """Fit on all measurements so far (rows of ``features``, costs in seconds)."""
        costs = np.asarray(costs, dtype=np.float64)
        finite = np.isfinite(costs)
        if finite.sum() < self.min_samples:
            self._weights = None
            return
        y = np.log(np.maximum(costs[finite], TINY))
        x = _expand(np.asarray(features, dtype=np.float64)[finite])
        self._mean, scale = x.mean(axis=0), x.std(axis=0)
        self._scale = np.where(scale > 0, scale, 1.0)
        z = (x - self._mean) / self._scale
        self._bias = float(y.mean())
        gram = z.T @ z + self.alpha * np.eye(z.shape[1])
        self._weights = np.linalg.solve(gram, z.T @ (y - self._bias))

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Predicted costs (seconds) of the rows of ``features``."""
        if self._weights is None:
            raise ArgumentError("the cost model has not been fitted on enough measurements")
        z = (_expand(np.asarray(features, dtype=np.float64)) - self._mean) / self._scale
        return np.exp(z @ self._weights + self._bias)


def _expand(x: np.ndarray) -> np.ndarray:
    return np.concatenate([x, x * x], axis=1)
