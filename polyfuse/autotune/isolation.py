"""Child processes for the builder and the runner: start one, hear from it, stop it.

Children come from a ``forkserver`` that has imported polyfuse and LLVM once (never a
plain fork of the caller, which may hold LLVM and a thread pool), ``spawn`` where there
is no forkserver; a child starts in about 15 ms, the server in about 1.5 s, once per
process. A child that crashes, hangs or dies is heard as a :class:`MeasureResult` with
an error, and the caller goes on.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from polyfuse.autotune.measure_types import ErrorCode, MeasureResult

_PRELOAD = ["polyfuse.autotune.builder", "polyfuse.autotune.runner", "polyfuse.runtime.cpu"]
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


@contextlib.contextmanager
def child(target: Callable[..., None], *args: Any) -> Iterator[tuple[Connection, BaseProcess]]:
    """A child running ``target(connection, *args)`` and the parent's end of that
    connection; the child is killed, if still alive, when the block ends."""
    ctx = _context()
    conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=target, daemon=True, args=(child_conn, *args))
    try:
        with _STARTING, _main_hidden():
            proc.start()
        child_conn.close()
        yield conn, proc
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


def receive(conn: Connection, proc: BaseProcess, timeout: float, phase: str,
            death: ErrorCode) -> Any:
    """The child's next message, or the result of its silence: a timeout, or its death
    (reported as ``death``: a compiler's crash is a compile error, a kernel's a runtime one)."""
    if not conn.poll(timeout):
        return MeasureResult((), ErrorCode.TIMEOUT, f"{phase} took longer than {timeout:g} s")
    try:
        return conn.recv()
    except EOFError:
        proc.join(5)
        return MeasureResult((), death, f"the process {_death(proc.exitcode)} while {phase}")


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"died of {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"died of signal {-exitcode}"
    return f"exited with status {exitcode}"


@contextlib.contextmanager
def host_lock() -> Iterator[None]:
    """Held while a child times a kernel: one timing at a time per machine and user."""
    path = Path(tempfile.gettempdir()) / f"polyfuse-measure-{os.getuid()}.lock"
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
