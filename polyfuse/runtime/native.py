"""The native runtime: thread pool, parallel-for ABI, aligned buffers, kernel calls.

This module is the only importer of the C++ extension ``polyfuse._native``
(``polyfuse/runtime/native/runtime.cpp``, built by ``pip install``).

**Thread pool.** One process-wide pool of persistent threads, started on the first
parallel region and reused; idle threads spin for a moment, then sleep. Its size
defaults to ``POLYFUSE_NUM_THREADS`` when set, else to the number of online CPUs. The
variable is read once, at import, by ``native/num_threads.h``, which the bundles' C pool
reads it with too: a whole number from 1 to 4096 (blanks around it allowed; empty counts
as unset); anything else (``0``, a negative, ``2.5``, ``many``, ``5000``) is ignored
with a ``RuntimeWarning`` that names it. The thread that starts a region works in it
too, so a pool of N threads runs N - 1 workers.

**Parallel-for ABI**, for generated code, bound by address (see
:func:`parallel_for_address`)::

    typedef void (*body)(int64_t begin, int64_t end, void* ctx);
    void polyfuse_parallel_for(body, int64_t n, void* ctx);
    void polyfuse_parallel_for_threads(body, int64_t n, void* ctx, int64_t num_threads);

``[0, n)`` is split into ``min(n, 4 * threads)`` contiguous chunks of near-equal size,
which the calling thread and the workers claim one at a time (a dynamic schedule: a
worker that wakes late or a core taken away for a while leaves its chunks to the
others); the call returns when every chunk is done.
``num_threads`` caps the threads of one region (0 or less: the pool's size; more
than the pool has: the pool's size). ``n <= 0`` does nothing; a one-thread pool, a
one-chunk region and a region started inside a body (nesting) run the body inline
on the calling thread as ``body(0, n, ctx)``. Regions from different threads run
one after another. Bodies must not raise or unwind.

**Kernel calls.** :func:`call` runs a kernel with the C signature
``void kernel(void** args)``: ``args[i]`` is the data pointer of an ndarray (it
must be C-contiguous; any dtype, 0-d included), or, for a Python or numpy
scalar, a pointer to an 8-byte slot holding it: ``int``, ``bool`` and numpy
integers/bools as ``int64_t``, ``float`` and numpy floats as ``double`` — whatever
the scalar's own width. Slots live only during the call. The GIL is released while
the kernel runs. Shapes, dtypes and which arrays get written are not checked
here: callers check them first (see :mod:`polyfuse.runtime.arguments`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from polyfuse.errors import OptionError
from polyfuse.scheduler.options import THREADS_MAX, number

try:
    from polyfuse import _native
except ImportError as e:  # pragma: no cover - only when the package was not built
    raise ImportError("polyfuse's native extension (polyfuse._native) is not built; "
                      "reinstall polyfuse with `pip install -e .`") from e

__all__ = [
    "Program", "aligned_buffers_live", "call", "empty_aligned", "first_fit", "get_num_threads", "is_aligned",
    "parallel_for_address", "parallel_for_threads_address", "set_num_threads",
    "test_kernel_address",
]

call: Callable[[int, Sequence[Any]], None] = _native.call
"""``call(fn_address, args)``: run ``void kernel(void** args)`` at ``fn_address``.

``args`` is a list or tuple of ndarrays and scalars, passed as the module docstring
says; an argument that is none of these, a non-contiguous array or an int outside
int64 raises ``TypeError`` naming ``args[i]``. Up to 16 arguments need no heap
allocation. Implemented in C with no Python wrapper, to keep the call under a
microsecond.
"""


first_fit: Callable[..., tuple[np.ndarray, int]] = _native.first_fit
"""``first_fit(bounds, values, last, size)``: :func:`polyfuse.ir.plan.first_fit` over
numbered values (int64 arrays), for a plan template's every call: the values defined at
event ``k`` are ``values[bounds[k]:bounds[k + 1]]``, value ``v`` live to event
``last[v]`` and ``size[v]`` bytes; returns each value's offset (-1 for one never
defined) and the arena's bytes."""

Program = _native.Program
"""A compiled model's plan as one native call: kernel calls, and the copies, counters and
jumps of its loops and branches, run from a program counter
(:mod:`polyfuse.runtime.instructions`).

``Program()`` starts empty. Operands are ``(base, index, offset)`` triples resolved at
each run: base 0 is the arena (``offset`` bytes into it), 1 input array ``index``, 2
output array ``index``, 3 the fixed address ``index`` (memory the caller keeps alive), 4
the program's int64 error slot, which a kernel sets when an index read from a tensor is
out of bounds. Instructions, appended in order (jump targets are positions among them):

* ``add(fn, args, zero)``: call ``void fn(void**)`` on ``args``, first clearing
  ``zero``'s ``(argument, bytes)``;
* ``copy(dst, src, bytes, row=None)``: ``memmove`` ``bytes``, to ``dst`` plus
  ``*row * bytes`` when ``row`` (an int64) is given;
* ``set(dst, value, bytes)``: the low ``bytes`` of ``value`` into ``dst``;
  ``increment(counter)``: add one to an int64;
* ``jump(target)``; ``jump_unless(cond, target)``: when the byte at ``cond`` is 0;
  ``jump_if_at_least(counter, limit, target)``: when int64 ``counter >= limit``.

``run(arena, inputs, outputs)`` runs from the first instruction to the end with the GIL
released and returns -1, or the position among the calls of the first call that set the
error slot (nothing runs after it); ``times``, a float64 array with a slot per call,
accumulates each call's seconds. ``len(program)`` is the number of calls. Arrays must
be C-contiguous and large enough for what the instructions touch: nothing is checked
here (callers plan the memory).
"""


def set_num_threads(n: int) -> None:
    """Resize the thread pool (1 to 4096 threads; else an
    :class:`~polyfuse.errors.OptionError`); not from inside a parallel region.

    Waits for a region running in another thread to finish; the new threads start
    with the next region.
    """
    _native.set_num_threads(number("set_num_threads()", "the number of threads", n, low=1,
                                   high=THREADS_MAX, meaning="the caller's included"))


def get_num_threads() -> int:
    """The pool's size: threads a parallel region may use, the caller's included."""
    return int(_native.get_num_threads())


def parallel_for_address() -> int:
    """Address of ``polyfuse_parallel_for``, for ``llvmlite.binding.add_symbol``."""
    return int(_native.parallel_for_address())


def parallel_for_threads_address() -> int:
    """Address of ``polyfuse_parallel_for_threads``, for ``llvmlite.binding.add_symbol``."""
    return int(_native.parallel_for_threads_address())


def empty_aligned(shape: int | Sequence[int], dtype: DTypeLike, alignment: int = 64,
                  zero: bool = False) -> np.ndarray:
    """A C-contiguous array whose data starts at a multiple of ``alignment``; zero-filled
    if ``zero``, else uninitialized.

    ``alignment`` is a power of two. The memory is the array's own (its ``base`` is a
    capsule that releases it when the last view goes), so it is never copied or leaked.
    Released buffers of 1 MiB or more are kept (512 MiB in all) and reused for the next
    buffer of the same size, which then costs no page faults. Buffers of 2 MiB or more
    (outputs, a model's arena, prepacked weights) start on a 2 MiB boundary, span whole
    2 MiB pages and are advised as transparent huge pages (see :func:`set_huge_pages`).
    """
    dims = (operator.index(shape),) if not isinstance(shape, Sequence) else tuple(
        operator.index(d) for d in shape)
    return _native.empty_aligned(dims, np.dtype(dtype), operator.index(alignment), bool(zero))


def set_huge_pages(on: bool) -> bool:
    """Whether buffers of 2 MiB or more made from now on ask for transparent huge pages
    (``madvise(MADV_HUGEPAGE)``, what Linux's default THP mode waits for; on by default);
    returns the previous setting. A kernel that strides through megabytes (a GEMM's
    packing of a row-major operand, one page per row at 4 KiB pages) then misses the TLB
    once per 2 MiB (SGEMM 1024 and 2048 with a huge-page output: benchmarks/LOG.md).
    Where THP is off (``never``) the advice does nothing. ``on`` must be a bool
    (else an :class:`~polyfuse.errors.OptionError`)."""
    if not isinstance(on, (bool, np.bool_)):
        raise OptionError(f"set_huge_pages() needs True or False, got {on!r}")
    return bool(_native.set_huge_pages(bool(on)))


def is_aligned(array: np.ndarray, alignment: int = 64) -> bool:
    """Whether ``array``'s data pointer is a multiple of ``alignment`` bytes."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"is_aligned needs a numpy array, got {type(array).__name__}")
    return bool(_native.is_aligned(array, operator.index(alignment)))


def aligned_buffers_live() -> int:
    """How many buffers made by :func:`empty_aligned` are not yet freed (for leak checks)."""
    return int(_native.aligned_buffers_live())


def test_kernel_address(name: str) -> int:
    """Address of a built-in kernel with the ``call`` signature, for tests and benchmarks.

    - ``noop``: does nothing.
    - ``add`` ``(float32 a[n], float32 b[n], float32 out[n], int64 n)``: ``out = a + b``,
      through ``polyfuse_parallel_for``.
    - ``count`` ``(int64 counts[n], int64 n, int64 num_threads)``: adds 1 to every
      ``counts[i]`` through ``polyfuse_parallel_for_threads``.
    - ``nested_count`` ``(int64 counts[n, m], int64 n, int64 m)``: the same over rows and
      columns, with a parallel-for over the columns inside one over the rows.
    """
    return int(_native.test_kernel_address(name))


# pytest would otherwise collect the function above as a test (mypy does not model
# attributes set on a function).
test_kernel_address.__test__ = False  # type: ignore[attr-defined]
