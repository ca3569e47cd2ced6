"""Limits every stage of polyfuse respects, so that hostile or generated input gets a
polyfuse error instead of exhausting Python's stack or the machine's memory.

Expressions are trees that every stage (type checks, printers, range inference, the
scheduler's isl model, code generation, the interpreters) walks recursively; their depth
is bounded where they are made: the TC parser refuses deeper text at the line:col where
the limit is passed, and fusion stops growing a fused expression before it gets deeper.
Tensors are bounded in bytes before they are allocated (:func:`check_tensor_size`), by
kernels and by model plans alike.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from polyfuse.errors import ShapeError, SizeLimitError
from polyfuse.ir.comprehension import Expr, children
from polyfuse.ir.types import DType

MAX_EXPR_DEPTH = 128
"""The deepest expression tree a statement may hold (``a + a + ... + a`` with 127 terms,
or 126 nested parentheses or calls). The deepest stage takes about four Python frames a
level, so a caller already 400 frames deep still has room under Python's default limit of
1,000."""


MAX_NEST_DEPTH = 64
"""The most loops and conditionals a loop kernel's text may nest (a kernel polyfuse makes
nests two loops per tiled dimension and a few conditionals)."""

MAX_EXPR_NODES = 20_000
"""The most nodes a statement's expression tree may hold, counting a shared subtree (a
``where`` binding used twice) at each use: a chain of bindings each using the last twice
doubles the tree per binding while its text stays short."""


def expr_depth(e: Expr) -> int:
    """The depth of ``e``'s tree (1 for a leaf), computed without recursion, in time
    linear in the distinct nodes (shared subtrees are measured once)."""
    return _measure(e, lambda kids: 1 + max(kids, default=0))


def expr_size(e: Expr) -> int:
    """The number of nodes of ``e``'s tree, a shared subtree counted at each use, computed
    without recursion in time linear in the distinct nodes."""
    return _measure(e, lambda kids: 1 + sum(kids))


def _measure(e: Expr, combine: Callable[[list[int]], int]) -> int:
    done: dict[int, int] = {}
    stack = [(e, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in done:
            continue
        kids = children(node)
        if expanded:
            done[id(node)] = combine([done[id(k)] for k in kids])
        else:
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in done)
    return done[id(e)]


MAX_TENSOR_BYTES_VARIABLE = "POLYFUSE_MAX_TENSOR_BYTES"


def max_tensor_bytes() -> int:
    """The most bytes one tensor, or one model's activation arena, may take: the
    environment variable ``POLYFUSE_MAX_TENSOR_BYTES`` if set, else half of this
    machine's physical memory or of the process's address-space limit (ulimit -v),
    whichever is less (more could not be held while anything else runs)."""
    text = os.environ.get(MAX_TENSOR_BYTES_VARIABLE, "").strip()
    if text:
        try:
            return int(float(text))
        except ValueError:
            raise ShapeError(f"{MAX_TENSOR_BYTES_VARIABLE}={text!r} is not a number of bytes; "
                             "set it to e.g. 8e9 or unset it") from None
    memory = _physical_memory()
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            memory = min(memory, soft)
    except (ImportError, OSError, ValueError):
        pass
    return memory // 2


@functools.cache
def _physical_memory() -> int:
    """This machine's memory in bytes (read once: every tensor a plan makes is checked)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # no sysconf: assume a 16 GiB machine
        return 16 << 30


def check_tensor_size(what: str, dtype: DType, shape: tuple[int, ...]) -> None:
    """Raise before ``what`` (a tensor of ``dtype`` and concrete ``shape``) is allocated
    if a dimension is negative or it would take more than :func:`max_tensor_bytes`."""
    if any(d < 0 for d in shape):
        raise ShapeError(f"{what} would have shape {tuple(shape)}, with a negative dimension; "
                         "sizes must be >= 0 (check the shape values the model computes or is fed)")
    count = 1
    for d in shape:
        count *= d
    nbytes = count * max(1, dtype.bits // 8)
    if nbytes > max_tensor_bytes():   # (the message only where it is raised)
        check_bytes(f"{what} would have shape {tuple(shape)} ({dtype}):", nbytes)


def check_bytes(what: str, nbytes: int) -> None:
    """Raise :class:`SizeLimitError` if ``what`` needs more than :func:`max_tensor_bytes`."""
    limit = max_tensor_bytes()
    if nbytes > limit:
        raise SizeLimitError(f"{what} {nbytes} bytes ({nbytes / 2**30:.1f} GiB), over the limit of "
                             f"{limit} bytes ({limit / 2**30:.1f} GiB) per tensor; "
                             f"set the environment variable {MAX_TENSOR_BYTES_VARIABLE} to raise "
                             "it (the default is half of this machine's memory or address-space "
                             "limit), or feed smaller sizes")
