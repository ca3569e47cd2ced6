"""What the runtime asks the autotuner, handed to kernels and compiled models as one
object (the runtime's :class:`~polyfuse.runtime.kernel.Tuning` protocol): the tuning task
of a kernel call, and its tuned options from the records (None without records, or
when no record fits: the heuristic schedules it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from polyfuse.autotune.records import Records
from polyfuse.autotune.task import Task
from polyfuse.ir.comprehension import Definition
from polyfuse.scheduler.options import MappingOptions
from polyfuse.targets import Target


@dataclass(frozen=True)
class Tuning:
    records: Records | None = None

    def task(self, definition: Definition, arrays: Sequence[np.ndarray], target: Target,
             label: str = "") -> Task:
        return Task.of(definition, list(arrays), target, label)

    def options(self, definition: Definition, arrays: Sequence[np.ndarray],
                target: Target) -> MappingOptions | None:
        if self.records is None:
            return None
        return self.records.options(self.task(definition, arrays, target))
