"""The tuning records database: append-only JSON lines, one per trial.

Each line holds the schema version, polyfuse's version, the target (its spec, as
``str(target)`` writes it: ``x86``, ``x86:skylake-avx512``, ``aarch64+sve``), the task (its
workload and family keys, entry, shapes, dtypes, and the text of the definition tuned),
the mapping options, their tile sizes and orders again by index name (``named_options``,
see :class:`~polyfuse.scheduler.loop_nest.NamedOptions`), the cost of each repeat in
seconds, an error code (``none`` for a valid measurement) and a timestamp. Lines of older
files have no definition text and no named options; they load, with the positional
options alone.

Writes are atomic per line: each :func:`append` is one ``write`` of whole lines to a
file opened for appending, under an exclusive ``flock``, so two tuners can append to
one file. Reading skips corrupted or foreign lines with one warning; it is never fatal.

:class:`Records` answers what compilation asks: the best valid options for a task,
from an exact record, or else from the nearest shapes of the same kernel (what
Tensor Comprehensions did with tuned options across sizes), said at debug level. Options
from other shapes are placed on the task's loop nest by index name where the record names
them, then repaired into the task's search space (tile sizes cut to its extents, register
tiles, vector width and unrolling lowered until they fit), so they are valid there.

Targets are compared as :class:`~polyfuse.targets.Target` objects (name, CPU, features),
as TVM's autotvm dispatches its history: first the records of the task's very target
(``x86:skylake-avx512`` records for ``x86:skylake-avx512`` only; ``host`` is the same
target as its spec, ``x86`` on this machine), and only when that target has no record of
the kernel at any shape, those of another target of the same backend (``x86`` records for
``x86:znver5``, ``aarch64`` ones for ``aarch64+sve``), said at debug level: options tuned
for another CPU of one instruction set are valid there, if maybe slower. Records of
another backend never apply.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polyfuse.autotune.space import SearchSpace
from polyfuse.autotune.task import Task
from polyfuse.errors import ArgumentError, OptionError, TargetError
from polyfuse.scheduler.loop_nest import LoopNest, NamedOptions
from polyfuse.scheduler.options import MappingOptions
from polyfuse.targets import Target

SCHEMA_VERSION = 1
SKIPPED_SHOWN = 5     # skipped lines a warning lists
log = logging.getLogger("polyfuse.autotune")


class RecordsWarning(UserWarning):
    """A line of a records file was skipped."""


def _version() -> str:
    from polyfuse.version import __version__
    return __version__


@dataclass(frozen=True)
class Record:
    workload_key: str
    family_key: str
    target: Target
    entry: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    options: MappingOptions
    costs: tuple[float, ...]            # seconds of one call, per repeat
    error: str = "none"                 # none, compile_error, runtime_error, timeout, wrong_answer
    message: str = ""
    timestamp: float = field(default_factory=time.time)
    version: str = field(default_factory=_version)
    name: str = ""
    chosen: bool = False                # a tuner's final pick for the workload (see below)
    definition: str = ""                # the text of the definition tuned ("": an older record)
    named: NamedOptions | None = None   # the options' per-member fields by index name

    @staticmethod
    def of(task: Task, options: MappingOptions, costs: Iterable[float], error: str = "none",
           message: str = "", chosen: bool = False) -> Record:
        nest = LoopNest.of(task.definition, task.sizes)
        return Record(task.workload_key, task.family_key, task.target, task.entry, task.shapes,
                      task.dtypes, options, tuple(float(c) for c in costs), error, message,
                      name=task.name, chosen=chosen, definition=str(task.definition),
                      named=nest.to_named(options))

    def task(self) -> Task:
        """The task this record measured, to replay it (records of older files hold no
        definition: an :class:`~polyfuse.errors.ArgumentError`)."""
        if not self.definition:
            raise ArgumentError(f"the record of {self.name or self.entry} comes from an older polyfuse "
                                "and holds no definition text to replay; tune it again")
        return Task(self.definition, self.entry, self.shapes, self.dtypes, self.target, self.name)

    @property
    def ok(self) -> bool:
        return self.error == "none" and bool(self.costs) and all(c > 0 for c in self.costs)

    @property
    def cost(self) -> float:
        """The fastest repeat (the one least disturbed by the rest of the machine), or
        infinity for a failed trial."""
        return min(self.costs) if self.ok else math.inf

    def to_json(self) -> dict[str, Any]:
        return ({"schema": SCHEMA_VERSION, "version": self.version, "target": str(self.target),
                "workload_key": self.workload_key, "family_key": self.family_key,
                "entry": self.entry, "name": self.name, "shapes": [list(s) for s in self.shapes],
                "dtypes": list(self.dtypes), "options": self.options.to_json(),
                "costs": list(self.costs), "error": self.error, "message": self.message,
                "timestamp": self.timestamp, "chosen": self.chosen, "definition": self.definition}
                | ({} if self.named is None else {"named_options": self.named.to_json()}))

    @staticmethod
    def from_json(j: Any) -> Record:
        """The record ``j`` holds; :class:`BadRecord` when it is not one (another schema,
        a missing field, a field of the wrong type, bad mapping options). Unknown keys
        are ignored: a later polyfuse may add fields."""
        if not isinstance(j, dict):
            raise BadRecord(f"a JSON {type(j).__name__}, not an object")
        if j.get("schema") != SCHEMA_VERSION:
            raise BadRecord(f"schema {j.get('schema')!r}, expected {SCHEMA_VERSION}")
        try:
            options = MappingOptions.from_json(_field(j, "options", dict))
            target = Target.parse(_field(j, "target", str))   # a bare name in older files
            named = None if "named_options" not in j else NamedOptions.from_json(j["named_options"])
        except (OptionError, TargetError) as err:
            raise BadRecord(str(err)) from None
        return Record(_field(j, "workload_key", str), _field(j, "family_key", str),
                      target, _field(j, "entry", str),
                      tuple(_numbers(s, int, "shapes") for s in _field(j, "shapes", list)),
                      tuple(_field(j, "dtypes", list, str)), options,
                      _numbers(_field(j, "costs", list), float, "costs"), _field(j, "error", str),
                      _field(j, "message", str, default=""), float(_field(j, "timestamp", float)),
                      _field(j, "version", str), _field(j, "name", str, default=""),
                      _field(j, "chosen", bool, default=False), _field(j, "definition", str, default=""),
                      named)


class BadRecord(ValueError):
    """A line of a records file that is not a record (never escapes :func:`load`)."""


_MISSING = object()


def _field(j: dict[str, Any], key: str, kind: type, item: type | None = None,
           default: Any = _MISSING) -> Any:
    """``j[key]``, checked to be a ``kind`` (of ``item`` elements, for a list)."""
    value = j.get(key, default)
    if value is _MISSING:
        raise BadRecord(f"no field '{key}'")
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float \
        else isinstance(value, kind)
    if not ok or (item is not None and not all(isinstance(v, item) for v in value)):
        raise BadRecord(f"field '{key}' is {value!r:.60}, not a {kind.__name__}")
    return value


def _numbers(values: Any, kind: type, key: str) -> tuple:
    """A list of JSON numbers of ``kind`` (int: integers only) as a tuple."""
    allowed = (int,) if kind is int else (int, float)
    if not isinstance(values, list) or not all(
            isinstance(v, allowed) and not isinstance(v, bool) for v in values):
        raise BadRecord(f"field '{key}' holds {values!r:.60}, not a list of numbers")
    return tuple(kind(v) for v in values)


def append(path: str | os.PathLike, records: Iterable[Record]) -> None:
    """Append ``records`` to the file at ``path`` (created if missing) in one locked write."""
    data = "".join(json.dumps(r.to_json(), separators=(",", ":")) + "\n" for r in records).encode()
    if not data:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)   # closing releases the lock


def load(path: str | os.PathLike) -> list[Record]:
    """Every record of the file; lines that are not records are skipped, with one
    :class:`RecordsWarning` for the file that lists the first few."""
    records: list[Record] = []
    skipped: list[str] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(Record.from_json(json.loads(line)))
            except (ValueError, RecursionError) as err:   # BadRecord, bad JSON, nesting too deep
                skipped.append(f"{path}:{lineno}: {type(err).__name__}: {str(err):.200}")
    if skipped:
        shown = "; ".join(skipped[:SKIPPED_SHOWN])
        more = f"; and {len(skipped) - SKIPPED_SHOWN} more" if len(skipped) > SKIPPED_SHOWN else ""
        warnings.warn(f"{path}: skipped {len(skipped)} line{'s' if len(skipped) > 1 else ''} that "
                      f"{'are' if len(skipped) > 1 else 'is'} not polyfuse tuning records ({shown}{more}); "
                      f"the {len(records)} valid records are used (`polyfuse records distill` writes "
                      "a clean file)", RecordsWarning, stacklevel=2)
    return records


def best_per_workload(records: Iterable[Record]) -> dict[tuple[str, Target], Record]:
    """The best valid record of each (workload, target): a tuner's final pick (its
    ``chosen`` trials; the latest pick wins), else the options with the lowest median
    over their trials, so a lucky measurement does not outrank options measured again."""
    trials: dict[tuple[str, Target, MappingOptions], list[Record]] = {}
    chosen: dict[tuple[str, Target], Record] = {}
    for r in records:
        if r.ok:
            trials.setdefault((r.workload_key, r.target, r.options), []).append(r)
            key = (r.workload_key, r.target)
            if r.chosen and (key not in chosen or r.timestamp >= chosen[key].timestamp):
                chosen[key] = r
    best: dict[tuple[str, Target], tuple[float, Record]] = {}
    for (key, target, _), rs in trials.items():
        costs = sorted(r.cost for r in rs)
        cost = costs[(len(costs) - 1) // 2]   # the lower median
        fastest = min(rs, key=lambda r: r.cost)
        if (key, target) not in best or cost < best[(key, target)][0]:
            best[(key, target)] = (cost, fastest)
    return {k: r for k, (_, r) in best.items()} | chosen


class Records:
    """Records loaded for compilation: the options to use for a task."""

    def __init__(self, records: Iterable[Record]) -> None:
        self.records = list(records)
        self.best = best_per_workload(self.records)

    @staticmethod
    def open(path: str | os.PathLike | Records | None) -> Records | None:
        if path is None or isinstance(path, Records):
            return path
        if not isinstance(path, (str, os.PathLike)):
            raise OptionError(f"tuning_records must be the path of a records file (`polyfuse tune` "
                              f"writes one) or a Records, got {type(path).__name__}")
        p = Path(path)
        if not p.is_file():
            raise ArgumentError(f"no tuning records file at '{p}'"
                                + (" (it is a directory)" if p.is_dir() else ""))
        try:
            return Records(load(p))
        except OSError as err:
            raise ArgumentError(f"cannot read the tuning records file '{p}': {err.strerror}") from None

    def lookup(self, task: Task) -> Record | None:
        """The best valid record of ``task``, or of the same kernel at the nearest shapes:
        of the task's own target if it has any, else of another target of its backend
        (see the module docstring)."""
        found = self._lookup(task, [task.target])
        if found is None:
            kin = sorted({t for _, t in self.best if t.name == task.target.name} - {task.target}, key=str)
            found = self._lookup(task, kin)
            if found is not None:
                log.debug("tuning records: none for %s; using those tuned for %s",
                          task.target, found.target)
        return found

    def _lookup(self, task: Task, targets: list[Target]) -> Record | None:
        """The best record of ``task`` for one of ``targets``, or of its nearest shapes."""
        exact = [r for t in targets if (r := self.best.get((task.workload_key, t))) is not None]
        if exact:
            best = min(exact, key=lambda r: r.cost)
            log.debug("tuning records: %s uses options measured at %.3g ms", task, best.cost * 1e3)
            return best
        family = [r for r in self.best.values()
                  if r.family_key == task.family_key and r.target in targets
                  and len(r.shapes) == len(task.shapes)]
        if not family:
            return None
        nearest = min(family, key=lambda r: (_distance(r.shapes, task.shapes), r.cost))
        log.debug("tuning records: no record of %s; reusing the options tuned for shapes %s",
                  task, [list(s) for s in nearest.shapes])
        return nearest

    def options(self, task: Task) -> MappingOptions | None:
        """The options of :meth:`lookup`'s record: as tuned when it measured ``task``'s very
        workload; else placed on ``task``'s loop nest by index name (where the record names
        them) and repaired, so they are valid in ``task``'s search space."""
        r = self.lookup(task)
        if r is None or r.workload_key == task.workload_key:
            return None if r is None else r.options
        space = SearchSpace.of_target(task)
        options = r.options if r.named is None else space.nest.from_named(r.named, r.options)
        return space.repair(options)


def _distance(a: tuple[tuple[int, ...], ...], b: tuple[tuple[int, ...], ...]) -> float:
    """How far apart two shape lists are: the summed log-ratio of their dimensions."""
    if [len(s) for s in a] != [len(s) for s in b]:
        return math.inf
    return sum(abs(math.log(max(x, 1) / max(y, 1))) for sa, sb in zip(a, b) for x, y in zip(sa, sb))
