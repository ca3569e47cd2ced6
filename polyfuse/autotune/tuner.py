"""The tuning loop: ask the search for candidates, measure them, record every trial.

Each batch of measurements is appended to the records file as soon as it is measured,
so an interrupted tune (Ctrl-C) keeps every trial it made. The default schedule is the
first candidate, so the speedup over it is always known.
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from polyfuse.autotune import records as db
from polyfuse.autotune.measure import MeasureConfig, measure_all
from polyfuse.autotune.search import GeneticSearch, RandomSearch, Search
from polyfuse.autotune.space import SearchSpace
from polyfuse.autotune.task import Task
from polyfuse.errors import OptionError
from polyfuse.scheduler.options import MappingOptions, number


SLOW_CUTOFF = 4.0   # a candidate this many times slower than the best is timed once
FINALISTS = 3       # best candidates measured again at the end of a search
MARGIN = 0.03       # how much faster than the default a finalist must be to replace it


@dataclass(frozen=True)
class TuneConfig:
    trials: int = 64
    strategy: str = "genetic"      # or "random"
    seed: int = 0
    jobs: int = 0                  # parallel builds; 0: all cores
    number: int = 10
    repeat: int = 3
    timeout: float = 10.0          # seconds a candidate may run
    build_timeout: float = 60.0
    batch: int = 0                 # candidates per round; 0: the population size

    def __post_init__(self) -> None:
        for name, low, meaning in (("trials", 1, ""), ("seed", 0, ""), ("jobs", 0, "0: all cores"),
                                   ("number", 1, ""), ("repeat", 1, ""),
                                   ("batch", 0, "0: the population size")):
            object.__setattr__(self, name, number("TuneConfig", name, getattr(self, name),
                                                  low=low, meaning=meaning))
        for name in ("timeout", "build_timeout"):
            object.__setattr__(self, name, number("TuneConfig", name, getattr(self, name), float,
                                                  low=1e-3, meaning="seconds"))
        if self.strategy not in ("genetic", "random"):
            raise OptionError(f"TuneConfig: unknown search strategy {self.strategy!r}; use "
                              "'genetic' or 'random'")

    def measure_config(self) -> MeasureConfig:
        kwargs = {"jobs": self.jobs} if self.jobs > 0 else {}
        return MeasureConfig(number=self.number, repeat=self.repeat, run_timeout=self.timeout,
                             build_timeout=self.build_timeout, seed=self.seed, **kwargs)


@dataclass
class TuneResult:
    best: db.Record | None = None
    default_cost: float = math.inf
    curve: list[float] = field(default_factory=list)   # best cost so far after each trial
    trials: int = 0
    seconds: float = 0.0
    interrupted: bool = False


def make_search(task: Task, config: TuneConfig) -> Search:
    space = SearchSpace.of_target(task)
    if config.strategy == "random":
        return RandomSearch(space, seed=config.seed)
    if config.strategy == "genetic":
        return GeneticSearch(space, seed=config.seed)
    raise OptionError(f"unknown search strategy '{config.strategy}'; use genetic or random")


def _check_output(output: object) -> None:
    """The records file to append to: a path that is not a directory."""
    if not isinstance(output, (str, os.PathLike)):
        raise OptionError(f"tune(): output is the path of the records file to append to, "
                          f"got {type(output).__name__}")
    if Path(output).is_dir():
        raise OptionError(f"tune(): output '{output}' is a directory; give the path of a records "
                          "file (e.g. tune.jsonl) to append to")


def _check_measurable(task: Task) -> None:
    """Tuning times code on this machine: refuse targets whose code runs here only under
    an emulator (its times say nothing of the real CPU)."""
    from polyfuse.targets.cpu import emulated   # loads LLVM
    target = task.target
    if emulated(target):
        raise OptionError(f"tuning measures kernels on this machine, where {target} code runs "
                          "only under an emulator whose times say nothing of that CPU; tune "
                          f"on a {target.name} machine and bring its records here")


def tune(task: Task, output: str | Path, config: TuneConfig | None = None, *,
         executor: Executor | None = None, previous: db.Records | None = None,
         progress: bool = False) -> TuneResult:
    """Measure up to ``config.trials`` candidates of ``task``, appending a record per trial
    to ``output``. ``previous`` records (of this or nearby shapes) seed the search."""
    config = config or TuneConfig()
    _check_output(output)
    _check_measurable(task)
    search = make_search(task, config)
    default = search.space.default()
    measure = config.measure_config()
    result = TuneResult()
    start = time.perf_counter()
    seeds: list[MappingOptions] = []
    if previous is not None:
        known = previous.options(task)
        if known is not None:   # tuned here, or at the nearest shapes: adapt it to these
            seeds.append(search.space.repair(known))
    batch_size = config.batch or max(4, min(16, config.trials))
    bar = _progress(task, config.trials) if progress else None
    try:
        while result.trials < config.trials:
            n = min(batch_size, config.trials - result.trials)
            batch = search.ask(n - len(seeds))
            batch, seeds = seeds + [o for o in batch if o not in seeds], []
            if not batch:
                break  # the space is exhausted
            if result.best is not None:   # no time on candidates that cannot win
                measure = replace(measure, cutoff=SLOW_CUTOFF * result.best.cost)
            measured = measure_all(task, batch, measure, executor)
            records = [db.Record.of(task, o, m.costs, m.error.value, m.message)
                       for o, m in zip(batch, measured)]
            db.append(output, records)
            search.tell(batch, [r.cost for r in records])
            for o, r in zip(batch, records):
                if o == default:
                    result.default_cost = r.cost
                if r.ok and (result.best is None or r.cost < result.best.cost):
                    result.best = r
                result.trials += 1
                result.curve.append(result.best.cost if result.best else math.inf)
            if bar is not None:
                bar.update(len(records))
                if result.best is not None:
                    speedup = result.default_cost / result.best.cost
                    bar.set_postfix_str(f"best {result.best.cost * 1e3:.4g} ms, "
                                        f"{speedup:.2f}x the default")
        if result.best is not None:
            _remeasure_finalists(task, output, search, default, measure, executor, result)
    except KeyboardInterrupt:
        result.interrupted = True
    finally:
        if bar is not None:
            bar.close()
    result.seconds = time.perf_counter() - start
    return result


def _remeasure_finalists(task: Task, output: str | Path, search: Search, default: MappingOptions,
                         measure: MeasureConfig, executor: Executor | None, result: TuneResult) -> None:
    """Measure the best few candidates and the default again, twice each, and choose
    from those measurements alone: the fastest median, unless it beats the default by
    less than ``MARGIN`` (then the default stays; a gain that small is noise on a busy
    machine). The chosen options' trials are marked ``chosen`` in the records."""
    ranked = sorted((h for h in search.history if math.isfinite(h[1])), key=lambda h: h[1])
    finalists = list(dict.fromkeys([o for o, _ in ranked[:FINALISTS]] + [default]))
    batch = finalists * 2
    measured = measure_all(task, batch, replace(measure, cutoff=math.inf), executor)
    costs: dict[MappingOptions, list[float]] = {o: [] for o in finalists}
    for o, m in zip(batch, measured):
        costs[o].append(min(m.costs) if m.ok and m.costs else math.inf)
    median = {o: sorted(c)[(len(c) - 1) // 2] for o, c in costs.items()}
    winner = min(finalists, key=lambda o: median[o])
    if winner != default and math.isfinite(median[default]) and median[winner] > (1 - MARGIN) * median[default]:
        winner = default
    if not math.isfinite(median[winner]):
        return
    records = [db.Record.of(task, o, m.costs, m.error.value, m.message or "finalist", chosen=o == winner)
               for o, m in zip(batch, measured)]
    db.append(output, records)
    result.best = min((r for r in records if r.chosen and r.ok), key=lambda r: r.cost)


def _progress(task: Task, total: int) -> Any:   # a tqdm bar (tqdm ships no type stubs)
    from tqdm import tqdm
    return tqdm(total=total, desc=(task.name or task.entry)[:30], unit="trial", leave=False)

