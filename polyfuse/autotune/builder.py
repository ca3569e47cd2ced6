"""The builder: each candidate of a task compiled in a child process, into a typed result.

Each candidate's kernel is compiled in its own child, under ``build_timeout``,
``jobs`` children at a time; one that raises, crashes or hangs becomes a
:class:`BuildResult` with an error, and the others go on. A child sends back the kernel
it built as an :class:`~polyfuse.runtime.artifact.Artifact`, the code itself, so the
runner (:mod:`polyfuse.autotune.runner`) needs neither the disk cache nor anything in
the environment to load it. Compiling still uses the caller's disk cache as a cache:
a candidate built before, by any process, is loaded instead of compiled.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection

from polyfuse.autotune import isolation
from polyfuse.autotune.measure_types import ErrorCode, MeasureConfig, MeasureResult
from polyfuse.autotune.task import Task
from polyfuse.errors import ArgumentError
from polyfuse.runtime import cache
from polyfuse.runtime.artifact import Artifact, save_kernel
from polyfuse.runtime.kernel import Kernel
from polyfuse.scheduler.options import MappingOptions


@dataclass(frozen=True)
class BuildResult:
    """One candidate's build: the kernel's artifact, or why there is none."""

    options: MappingOptions
    artifact: Artifact | None       # None unless ok
    build_seconds: float
    error: ErrorCode = ErrorCode.NONE   # COMPILE_ERROR or TIMEOUT for a failed build
    message: str = ""                   # what went wrong, for a person

    def __post_init__(self) -> None:
        if (self.artifact is not None) != self.ok:
            raise ArgumentError("BuildResult: a build has an artifact exactly when it has no "
                                f"error, got error {self.error.value} and "
                                f"{'an' if self.artifact is not None else 'no'} artifact")

    @property
    def ok(self) -> bool:
        return self.error is ErrorCode.NONE


def build(task: Task, candidates: Sequence[MappingOptions], config: MeasureConfig) -> list[BuildResult]:
    """The builds of ``candidates``, in order, ``config.jobs`` at a time."""
    with ThreadPoolExecutor(max_workers=config.jobs) as pool:
        return list(pool.map(lambda options: build_one(task, options, config), candidates))


def build_one(task: Task, options: MappingOptions, config: MeasureConfig) -> BuildResult:
    """The build of one candidate, in a child process."""
    cache_dir = cache.cache_dir()
    with isolation.child(_child, task, options, "" if cache_dir is None else str(cache_dir)) \
            as (conn, proc):
        reply = isolation.receive(conn, proc, config.build_timeout, "building",
                                  death=ErrorCode.COMPILE_ERROR)
    if isinstance(reply, MeasureResult):
        return BuildResult(options, None, 0.0, reply.error, reply.message)
    code, seconds, detail = reply
    if code == "built":
        return BuildResult(options, detail, seconds)
    return BuildResult(options, None, seconds, ErrorCode.COMPILE_ERROR, detail)


def _child(conn: Connection, task: Task, options: MappingOptions, cache_dir: str) -> None:
    """Build the kernel and send it, or why not, to the parent: one message."""
    # compile with the caller's disk cache (the forkserver's environment may be older)
    os.environ["POLYFUSE_CACHE_DIR"] = cache_dir
    start = time.perf_counter()
    try:
        kernel = Kernel(task.definition, task.target, task.source, options)
        artifact = save_kernel(kernel.specialize(*task.placeholders()))
    except Exception as err:
        conn.send(("failed", time.perf_counter() - start, f"{type(err).__name__}: {err}"))
        return
    conn.send(("built", time.perf_counter() - start, artifact))
