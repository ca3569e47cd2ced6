"""The runner: built kernels loaded and timed in child processes, checked against the reference.

Each :class:`~polyfuse.autotune.builder.BuildResult` that holds an artifact is loaded in
a child of its own (under ``build_timeout``, like the build it completes), which then
calls the kernel once on ``task.random_inputs(seed)`` (and, for the outputs a definition
accumulates into without ``!``, random initial contents from the same seed, given as
``out=`` would) and checks the outputs against the reference interpreter, calls it
``warmup`` times, then ``repeat`` times ``number`` calls; each cost is the mean seconds
of one call in a repeat. The whole run is under ``run_timeout``, and holds a lock per
host and user, so no two timings on one machine overlap, whoever started them. A failed
build is reported as it is, without a child.
"""

from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from polyfuse.autotune import isolation
from polyfuse.autotune.builder import BuildResult
from polyfuse.autotune.measure_types import ErrorCode, Fault, MeasureConfig, MeasureResult
from polyfuse.autotune.task import Task
from polyfuse.ir.comprehension_interpreter import interpret
from polyfuse.ir.symbolic import evaluate_int
from polyfuse.runtime.arguments import bind_arguments
from polyfuse.runtime.artifact import Artifact, load_kernel
from polyfuse.runtime.kernel import SpecializedKernel
from polyfuse.scheduler.model import initial_outputs


def run(task: Task, builds: Sequence[BuildResult], config: MeasureConfig) -> list[MeasureResult]:
    """The results of ``builds``, in order, one at a time."""
    expected = reference(task, config.seed) if config.check else None
    return [run_one(task, built, config, expected) for built in builds]


def run_one(task: Task, built: BuildResult, config: MeasureConfig,
            expected: dict[str, np.ndarray] | None) -> MeasureResult:
    """The result of one build, run in a child process (``expected``: the reference's
    outputs to compare with, or None not to check)."""
    if built.artifact is None:   # a failed build
        return MeasureResult((), built.error, built.message, built.build_seconds)
    fault = config.inject_faults.get(built.options)
    with isolation.child(_child, task, built.artifact, config, expected, fault) as (conn, proc):
        reply = isolation.receive(conn, proc, config.build_timeout, "loading",
                                  death=ErrorCode.COMPILE_ERROR)
        if not isinstance(reply, MeasureResult) and reply[0] == "loaded":
            with isolation.host_lock():
                conn.send("go")
                reply = isolation.receive(conn, proc, config.run_timeout, "running",
                                          death=ErrorCode.RUNTIME_ERROR)
    if isinstance(reply, MeasureResult):
        return MeasureResult((), reply.error, reply.message, built.build_seconds)
    code, detail = reply
    if code == "ok":
        return MeasureResult(tuple(detail), ErrorCode.NONE, "", built.build_seconds)
    return MeasureResult((), ErrorCode(code), detail, built.build_seconds)


def _child(conn: Connection, task: Task, artifact: Artifact, config: MeasureConfig,
           expected: dict[str, np.ndarray] | None, fault: Fault | None) -> None:
    """Load, tell the parent, wait for its go, run, tell the parent; one message each."""
    try:
        kernel = load_kernel(artifact)
    except Exception as err:
        conn.send((ErrorCode.COMPILE_ERROR.value, f"{type(err).__name__}: {err}"))
        return
    conn.send(("loaded", ""))
    try:
        conn.recv()
    except EOFError:  # the parent gave up on this candidate
        return
    try:
        conn.send(_run(task, kernel, config, expected, fault))
    except Exception as err:
        conn.send((ErrorCode.RUNTIME_ERROR.value, f"{type(err).__name__}: {err}"))


@functools.lru_cache(maxsize=4)
def reference(task: Task, seed: int) -> dict[str, np.ndarray]:
    """The reference interpreter's outputs on the inputs every run of ``task`` gets."""
    bound = bind_arguments(task.definition, task.random_inputs(seed))
    return interpret(task.definition, bound.values | initial_contents(task, bound.sizes, seed),
                     bound.sizes)


def initial_contents(task: Task, sizes: Mapping[str, int], seed: int) -> dict[str, np.ndarray]:
    """Starting contents for the outputs the definition accumulates into (the caller
    gives them): deterministic in ``seed``, small values like ``random_inputs``."""
    d = task.definition
    needed = initial_outputs(d)
    rng = np.random.default_rng([seed, 1])
    arrays = {}
    for t in d.outputs:
        if t.name in needed:
            shape = tuple(evaluate_int(e, sizes) for e in t.shape)
            dt = t.dtype.numpy
            arrays[t.name] = (rng.standard_normal(shape).astype(dt) if t.dtype.is_float
                              else rng.integers(0, 2, shape).astype(dt))
    return arrays


def _run(task: Task, kernel: SpecializedKernel, config: MeasureConfig,
         expected: dict[str, np.ndarray] | None, fault: Fault | None) -> tuple[str, Any]:
    bound = bind_arguments(task.definition, task.random_inputs(config.seed))
    # outputs read before written start from the reference's contents, and keep
    # accumulating over the timed calls (as a caller's out= arrays would)
    values = bound.values | initial_contents(task, bound.sizes, config.seed)
    call = _faulty(kernel.run, fault) if fault else kernel.run
    start = time.perf_counter()
    outputs = call(values)
    first = time.perf_counter() - start
    if expected is not None:
        mismatch = _compare(task, outputs, expected, config)
        if mismatch:
            return (ErrorCode.WRONG_ANSWER.value, mismatch)
    if first > config.cutoff:  # far slower than the best: its first call measures it
        return ("ok", [first])
    for _ in range(config.warmup):
        call(values)
    costs = []
    for _ in range(config.repeat):
        start = time.perf_counter()
        for _ in range(config.number):
            call(values)
        costs.append((time.perf_counter() - start) / config.number)
    return ("ok", costs)


def _faulty(run: Callable[[Mapping[str, object]], dict[str, np.ndarray]],
            fault: Fault) -> Callable[[Mapping[str, object]], dict[str, np.ndarray]]:
    def call(values: Mapping[str, object]) -> dict[str, np.ndarray]:
        if fault is Fault.SEGFAULT:
            ctypes.string_at(0)  # reads address 0
        elif fault is Fault.HANG:
            while True:
                pass
        outputs = run(values)
        for out in outputs.values():
            flat = out.reshape(-1)
            flat[0] = ~flat[0] if out.dtype == np.bool_ else flat[0] + 1
        return outputs
    return call


def _compare(task: Task, outputs: dict[str, np.ndarray], expected: dict[str, np.ndarray],
             config: MeasureConfig) -> str:
    """Where ``outputs`` differ from the reference beyond the tolerance ('' if nowhere)."""
    for t in task.definition.outputs:
        got, want = np.asarray(outputs[t.name]), expected[t.name]
        if got.shape != want.shape:
            return f"output '{t.name}' has shape {got.shape}, the reference {want.shape}"
        if not t.dtype.is_float:
            bad = got != want
            tolerance = "exactly"
        else:
            got, want = got.astype(np.float64), want.astype(np.float64)
            # 16-bit floats round every stored value: looser bounds
            rtol, atol = (1e-2, 1e-2) if t.dtype.bits <= 16 else (config.rtol, config.atol)
            finite = np.abs(want[np.isfinite(want)])
            scale = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
            bad = ~np.isclose(got, want, rtol=rtol, atol=atol * scale, equal_nan=True)
            tolerance = f"within rtol={rtol:g}, atol={atol:g} x {scale:.3g}"
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            return (f"output '{t.name}': {int(bad.sum())} of {bad.size} values differ from the "
                    f"reference (first at {where}: got {got[where].item()!r}, expected "
                    f"{want[where].item()!r}; compared {tolerance})")
    return ""
