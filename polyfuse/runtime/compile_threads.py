"""A model's kernels compiled on a few threads at once.

One thread schedules a kernel (isl, in Python) while another makes machine code (LLVM,
which gives up the GIL) and a third waits for the code generator. While they run, the
interpreter switches threads more often than its default 5 ms (:func:`quick_switches`),
and sets its interval back when the last such block ends.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

# threads compiling a model's kernels: one schedules while another makes machine code
# and a third, its kernel scheduled, waits for the code generator
THREADS = 3 if (os.cpu_count() or 1) > 1 else 1
SWITCH_INTERVAL = 2e-4   # seconds between the interpreter's thread switches while they do


def each(work: Callable[[Any], None], items: list[Any], threads: int | None = None) -> None:
    """``work`` on every item, on up to ``threads`` threads (:data:`THREADS` by default);
    the first item's error (in ``items``' order) is raised, as a loop would raise it."""
    threads = min(THREADS if threads is None else threads, len(items))
    if threads <= 1:
        for item in items:
            work(item)
        return
    with quick_switches(), \
            concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="polyfuse-compile") as pool:
        futures = [pool.submit(work, item) for item in items]
        try:
            for f in futures:
                f.result()
        except BaseException:
            for f in futures:
                f.cancel()
            raise


@dataclasses.dataclass
class _Switching:
    """The blocks inside :func:`quick_switches` now, and the interval before the first."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    blocks: int = 0
    saved: float = 0.0


_SWITCHING = _Switching()


@contextlib.contextmanager
def quick_switches() -> Iterator[None]:
    """Run the block with the interpreter switching threads every
    :data:`SWITCH_INTERVAL` seconds (its interval restored when the last such block
    ends). The code generator's thread makes dozens of short calls into LLVM per
    kernel, each giving up the GIL; at the default 5 ms it waited that long for it
    after most of them while another thread scheduled, and ResNet-50's kernels compiled
    no faster on three threads than on one (benchmarks/LOG.md)."""
    state = _SWITCHING
    with state.lock:
        if not state.blocks:
            state.saved = sys.getswitchinterval()
            sys.setswitchinterval(SWITCH_INTERVAL)
        state.blocks += 1
    try:
        yield
    finally:
        with state.lock:
            state.blocks -= 1
            if not state.blocks:
                sys.setswitchinterval(state.saved)
