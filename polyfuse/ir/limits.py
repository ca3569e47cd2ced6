"""Limits every stage of polyfuse respects, so that hostile or generated input gets a
polyfuse error instead of exhausting Python's stack or the machine's memory.

Expressions are trees that every stage (type checks, printers, range inference, the
scheduler's isl model, code generation, the interpreters) walks recursively; their depth
is bounded where they are made: the TC parser refuses deeper text at the line:col where
the limit is passed, and fusion stops growing a fused expression before it gets deeper.
"""

from __future__ import annotations

from polyfuse.ir.comprehension import Expr, children

MAX_EXPR_DEPTH = 200
"""The deepest expression tree a statement may hold (``a + a + ... + a`` with 200 terms,
or 200 nested parentheses or calls)."""


def expr_depth(e: Expr) -> int:
    """The depth of ``e``'s tree (1 for a leaf), computed without recursion."""
    deepest, stack = 0, [(e, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((c, depth + 1) for c in children(node))
    return deepest
