"""Limits every stage of polyfuse respects, so that hostile or generated input gets a
polyfuse error instead of exhausting Python's stack or the machine's memory.

Expressions are trees that every stage (type checks, printers, range inference, the
scheduler's isl model, code generation, the interpreters) walks recursively; their depth
is bounded where they are made: the TC parser refuses deeper text at the line:col where
the limit is passed, and fusion stops growing a fused expression before it gets deeper.
"""

from __future__ import annotations

from collections.abc import Callable

from polyfuse.ir.comprehension import Expr, children

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
