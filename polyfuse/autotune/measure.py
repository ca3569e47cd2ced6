"""Builder and runner: compile candidate schedules of a task and time them, in isolation.

Each candidate (a task and its :class:`MappingOptions`) is built and run in a child
process, so a candidate that crashes, hangs or computes wrong values becomes a
:class:`MeasureResult` with an :class:`ErrorCode`, and the caller goes on.

* **Build**: the child compiles the kernel (under ``build_timeout``). Compiling fills the
  disk cache (:mod:`polyfuse.runtime.cache`), so a later child loads the object code.
* **Run**: the child calls the kernel once on ``task.random_inputs(seed)`` (and, for the
  outputs a definition accumulates into without ``!``, random initial contents from the
  same seed, given as ``out=`` would) and checks the
  outputs against the reference interpreter, calls it ``warmup`` times, then ``repeat``
  times ``number`` calls; each cost is the mean seconds of one call in a repeat. The
  whole run phase is under ``run_timeout``. Run phases hold a lock per host and user,
  so no two timings on one machine overlap, whoever started them.

:func:`measure_one` does all of this for one candidate and is a picklable top-level
function: :func:`measure_all` hands it to any ``concurrent.futures.Executor`` (a Dask
``Client.get_executor()`` measures each candidate on a worker's own machine, with that
machine's cache; one thread per worker keeps builds from disturbing timings). Without an
executor, :func:`measure_all` builds every candidate in ``jobs`` parallel children
first, then runs them one after another, so compiles never disturb timings.

Children come from a ``forkserver`` that has imported polyfuse and LLVM once (never a
plain fork of the caller, which may hold LLVM and a thread pool), ``spawn`` where there
is no forkserver; a child starts in about 15 ms, the server in about 1.5 s, once per
process. As with any multiprocessing code, a script that measures needs the
``if __name__ == "__main__":`` guard. Children use the caller's kernel cache directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import fcntl
import functools
import math
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import numpy as np

from polyfuse.autotune.task import Task
from polyfuse.errors import OptionError
from polyfuse.ir.comprehension_interpreter import interpret
from polyfuse.ir.symbolic import evaluate_int
from polyfuse.runtime import cache
from polyfuse.runtime.arguments import bind_arguments
from polyfuse.runtime.kernel import Kernel, SpecializedKernel
from polyfuse.scheduler.model import initial_outputs
from polyfuse.scheduler.options import MappingOptions, number


class ErrorCode(enum.Enum):
    """Why a candidate has no costs (the values go into JSON records)."""

    NONE = "none"
    COMPILE_ERROR = "compile_error"    # the scheduler or code generator refused it, or crashed
    RUNTIME_ERROR = "runtime_error"    # the kernel raised or killed its process (a signal)
    TIMEOUT = "timeout"                # the build or the run took longer than allowed
    WRONG_ANSWER = "wrong_answer"      # outputs differ from the reference interpreter's


class Fault(enum.Enum):
    """Testing aid: a failure :attr:`MeasureConfig.inject_faults` makes a child suffer."""

    SEGFAULT = "segfault"          # a real SIGSEGV (a read of address 0) instead of a call
    HANG = "hang"                  # an endless loop instead of a call
    WRONG_ANSWER = "wrong_answer"  # each call's outputs changed after the kernel ran


@dataclass(frozen=True)
class MeasureConfig:
    number: int = 10          # calls per repeat
    repeat: int = 3           # costs per candidate
    warmup: int = 1           # untimed calls before the first repeat
    build_timeout: float = 60.0
    run_timeout: float = 10.0  # for the check, the warm-up and every repeat together
    check: bool = True         # compare with the reference interpreter first
    seed: int = 0              # of task.random_inputs
    jobs: int = field(default_factory=lambda: os.cpu_count() or 1)  # parallel local builds
    cutoff: float = math.inf   # seconds: a candidate whose first call takes longer is
                               # measured by that call alone (a search sets a few times its best)
    rtol: float = 1e-3         # float outputs: |got - want| <= rtol*|want| + atol*max|want|
    atol: float = 1e-4
    # Testing aid, never set by a search: candidates whose options are keys here suffer
    # that fault in their child, to prove that the runner survives it.
    inject_faults: Mapping[MappingOptions, Fault] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for name, low in (("number", 1), ("repeat", 1), ("warmup", 0), ("jobs", 1), ("seed", 0)):
            object.__setattr__(self, name, number("MeasureConfig", name, getattr(self, name), low=low))
        for name, low in (("build_timeout", 1e-3), ("run_timeout", 1e-3), ("cutoff", 0.0),
                          ("rtol", 0.0), ("atol", 0.0)):
            object.__setattr__(self, name, number("MeasureConfig", name, getattr(self, name), float,
                                                  low=low))


@dataclass(frozen=True)
class MeasureResult:
    costs: tuple[float, ...]   # seconds of one call, one per repeat; empty unless ok
    error: ErrorCode
    message: str = ""          # what went wrong, for a person
    build_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is ErrorCode.NONE

    @property
    def mean(self) -> float:
        """Mean cost in seconds; infinite for a failed candidate."""
        return sum(self.costs) / len(self.costs) if self.ok and self.costs else float("inf")

    def to_json(self) -> dict[str, Any]:
        return {"costs": list(self.costs), "error": self.error.value, "message": self.message,
                "build_seconds": self.build_seconds}

    @staticmethod
    def from_json(j: dict[str, Any]) -> MeasureResult:
        return MeasureResult(tuple(float(c) for c in j["costs"]), ErrorCode(j["error"]),
                             str(j.get("message", "")), float(j.get("build_seconds", 0.0)))


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
        return _measure_locally(task, list(candidates), config)
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
    """Build and run one candidate in a child process (what executors run)."""
    return _isolated(task, options, config, _expected(task, config), run=True)


def _measure_locally(task: Task, candidates: list[MappingOptions],
                     config: MeasureConfig) -> list[MeasureResult]:
    expected = _expected(task, config)
    if cache.cache_dir() is None:  # nothing a build could leave for the run: build in the run
        return [_isolated(task, o, config, expected, run=True) for o in candidates]
    with ThreadPoolExecutor(max_workers=config.jobs) as pool:
        builds = list(pool.map(lambda o: _isolated(task, o, config, None, run=False), candidates))
    results = []
    for options, built in zip(candidates, builds):
        if built.ok:  # the child loads the object code from the disk cache
            result = _isolated(task, options, config, expected, run=True)
            built = MeasureResult(result.costs, result.error, result.message, built.build_seconds)
        results.append(built)
    return results


def _expected(task: Task, config: MeasureConfig) -> dict[str, np.ndarray] | None:
    return _reference(task, config.seed) if config.check else None


@functools.lru_cache(maxsize=4)
def _reference(task: Task, seed: int) -> dict[str, np.ndarray]:
    bound = bind_arguments(task.definition, task.random_inputs(seed))
    return interpret(task.definition, bound.values | _initial_outputs(task, bound.sizes, seed),
                     bound.sizes)


def _initial_outputs(task: Task, sizes: Mapping[str, int], seed: int) -> dict[str, np.ndarray]:
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


# ---- the parent's side: start a child, feed it, wait for it, stop it --------------------

_PRELOAD = ["polyfuse.autotune.measure", "polyfuse.runtime.cpu"]
_STARTING = threading.Lock()


@functools.cache
def _context() -> multiprocessing.context.BaseContext:
    """How this process starts children (set up once per process)."""
    me = multiprocessing.current_process()
    if me.daemon:
        # A daemonic process (a Dask worker, by default) may not start children, lest
        # they outlive it; ours never outlive the call that starts them.
        me.daemon = False
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)  # each child starts with LLVM loaded
        return ctx
    return multiprocessing.get_context("spawn")


def _isolated(task: Task, options: MappingOptions, config: MeasureConfig,
              expected: dict[str, np.ndarray] | None, run: bool) -> MeasureResult:
    ctx = _context()
    conn, child_conn = ctx.Pipe()
    cache_dir = cache.cache_dir()
    fault = config.inject_faults.get(options)
    proc = ctx.Process(target=_child, daemon=True, args=(
        child_conn, task, options, config, expected, fault, run,
        "" if cache_dir is None else str(cache_dir)))
    try:
        with _STARTING, _main_hidden():
            proc.start()
        child_conn.close()
        reply = _receive(conn, proc, config.build_timeout, "building")
        if isinstance(reply, MeasureResult):  # a crash while building is the compiler's
            return reply if reply.error is ErrorCode.TIMEOUT else \
                MeasureResult((), ErrorCode.COMPILE_ERROR, reply.message)
        if reply[0] != "built":
            return MeasureResult((), ErrorCode.COMPILE_ERROR, reply[1], reply[2])
        build_seconds = reply[1]
        if not run:
            return MeasureResult((), ErrorCode.NONE, "", build_seconds)
        with _host_lock():
            conn.send("go")
            reply = _receive(conn, proc, config.run_timeout, "running")
        if isinstance(reply, MeasureResult):
            return MeasureResult((), reply.error, reply.message, build_seconds)
        code, detail = reply
        if code == "ok":
            return MeasureResult(tuple(detail), ErrorCode.NONE, "", build_seconds)
        return MeasureResult((), ErrorCode(code), detail, build_seconds)
    finally:
        conn.close()
        if proc.is_alive():
            proc.kill()
        if proc.pid is not None:
            proc.join()


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """Children run only polyfuse's code, so they need not import the main script: hide
    it from multiprocessing while a child starts, or a script without an
    ``if __name__ == "__main__"`` guard would run its top level again in every child."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__.pop(k) for k in ("__file__",) if main is not None and k in main.__dict__}
    spec = getattr(main, "__spec__", None)
    if main is not None:
        main.__spec__ = None
    try:
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)
            main.__spec__ = spec


def _receive(conn: Connection, proc: BaseProcess, timeout: float, phase: str) -> Any:
    """The child's next message, or the result of its silence: a timeout or its death."""
    if not conn.poll(timeout):
        return MeasureResult((), ErrorCode.TIMEOUT, f"{phase} took longer than {timeout:g} s")
    try:
        return conn.recv()
    except EOFError:
        proc.join(5)
        return MeasureResult((), ErrorCode.RUNTIME_ERROR,
                             f"the process {_death(proc.exitcode)} while {phase}")


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"died of {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"died of signal {-exitcode}"
    return f"exited with status {exitcode}"


@contextlib.contextmanager
def _host_lock() -> Iterator[None]:
    """Held while a child times a kernel: one timing at a time per machine and user."""
    path = Path(tempfile.gettempdir()) / f"polyfuse-measure-{os.getuid()}.lock"
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---- the child's side --------------------------------------------------------------------

def _child(conn: Connection, task: Task, options: MappingOptions, config: MeasureConfig,
           expected: dict[str, np.ndarray] | None, fault: Fault | None, run: bool,
           cache_dir: str) -> None:
    """Build, tell the parent, wait for its go, run, tell the parent; one message each."""
    os.environ["POLYFUSE_CACHE_DIR"] = cache_dir  # the forkserver's may be older
    start = time.perf_counter()
    try:
        kernel = Kernel(task.definition, task.target, task.source, options)
        specialized = kernel.specialize(*task.placeholders())
    except Exception as err:
        conn.send(("failed", f"{type(err).__name__}: {err}", time.perf_counter() - start))
        return
    conn.send(("built", time.perf_counter() - start))
    if not run:
        return
    try:
        conn.recv()
    except EOFError:  # the parent gave up on this candidate
        return
    try:
        conn.send(_run(task, specialized, config, expected, fault))
    except Exception as err:
        conn.send(("runtime_error", f"{type(err).__name__}: {err}"))


def _run(task: Task, kernel: SpecializedKernel, config: MeasureConfig,
         expected: dict[str, np.ndarray] | None, fault: Fault | None) -> tuple[str, Any]:
    bound = bind_arguments(task.definition, task.random_inputs(config.seed))
    # outputs read before written start from the reference's contents, and keep
    # accumulating over the timed calls (as a caller's out= arrays would)
    values = bound.values | _initial_outputs(task, bound.sizes, config.seed)
    call = _faulty(kernel.run, fault) if fault else kernel.run
    start = time.perf_counter()
    outputs = call(values)
    first = time.perf_counter() - start
    if expected is not None:
        mismatch = _compare(task, outputs, expected, config)
        if mismatch:
            return ("wrong_answer", mismatch)
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
