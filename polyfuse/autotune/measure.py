"""Measuring candidate schedules of a task: build them, then run them, in isolation.

Measuring is two steps, as in TVM's auto-scheduler:

* the **builder** (:mod:`polyfuse.autotune.builder`) compiles each candidate (a task and
  its :class:`MappingOptions`) in a child process into a
  :class:`~polyfuse.autotune.builder.BuildResult`: the kernel's code as an
  :class:`~polyfuse.runtime.artifact.Artifact`, or the :class:`ErrorCode` of a build
  that failed;
* the **runner** (:mod:`polyfuse.autotune.runner`) loads each artifact in a child
  process, checks its outputs against the reference interpreter and times it, into a
  :class:`MeasureResult`.

A candidate that crashes, hangs or computes wrong values becomes a result with an error,
and the caller goes on.

:func:`measure_one` does both for one candidate and is a picklable top-level function:
:func:`measure_all` hands it to any ``concurrent.futures.Executor`` (a Dask
``Client.get_executor()`` measures each candidate on a worker's own machine; one thread
per worker keeps builds from disturbing timings). Without an executor,
:func:`measure_all` builds every candidate in ``jobs`` parallel children first, then
runs them one after another, so compiles never disturb timings.

As with any multiprocessing code, a script that measures needs the
``if __name__ == "__main__":`` guard (see :mod:`polyfuse.autotune.isolation`).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor

from polyfuse.autotune.builder import BuildResult, build
from polyfuse.autotune.measure_types import ErrorCode, Fault, MeasureConfig, MeasureResult
from polyfuse.autotune.runner import initial_contents, reference, run
from polyfuse.autotune.task import Task
from polyfuse.scheduler.options import MappingOptions

__all__ = ["BuildResult", "ErrorCode", "Fault", "MeasureConfig", "MeasureResult", "build",
           "measure_all", "measure_one", "run"]

# the names these had when this module built and ran candidates itself
_reference, _initial_outputs = reference, initial_contents


def measure_all(task: Task, candidates: Sequence[MappingOptions],
                config: MeasureConfig | None = None,
                executor: Executor | None = None) -> list[MeasureResult]:
    """Results of ``candidates``, in order.

    With ``executor``, each candidate is one :func:`measure_one` job on it; an exception
    the executor raises (a lost worker) is recorded as a ``RUNTIME_ERROR``. Without, the
    local two-phase path: parallel builds, then runs one at a time.
    """
    config = config or MeasureConfig()
    if executor is None:
        return run(task, build(task, candidates, config), config)
    futures = [executor.submit(measure_one, task, options, config) for options in candidates]
    results = []
    for future in futures:
        try:
            results.append(future.result())
        except Exception as err:  # the executor's failure, not the candidate's
            results.append(MeasureResult((), ErrorCode.RUNTIME_ERROR,
                                         f"the executor raised {type(err).__name__}: {err}"))
    return results


def measure_one(task: Task, options: MappingOptions, config: MeasureConfig) -> MeasureResult:
    """Build and run one candidate, each in a child process (what executors run)."""
    return run(task, build(task, [options], config), config)[0]
