"""Stores nobody reads, dropped: a loop-IR pass.

A fusion group's definition makes every tensor its statements write an output, so that
a TC caller gets each back; in a model's plan the intermediates are the step's private
temporaries, which nothing reads after the kernel. Once :func:`fuse_epilogues` applies
a contraction's pointwise consumer to its accumulators, the contraction's own result
``T`` is stored and never read again: a whole extra pass of writes over memory (about
50 MB per ResNet-50 inference). The caller names such outputs (``discarded``); a store
to one that no statement of the kernel reads is dropped, and loops left empty go.
"""

from __future__ import annotations

from polyfuse.ir.comprehension import Read
from polyfuse.ir.loops import For, If, LoopKernel, Stmt, Store, rewrite, stmt_nodes, walk_stmts


def drop_dead_stores(kernel: LoopKernel, discarded: frozenset[str] = frozenset()) -> LoopKernel:
    """``kernel`` without its stores to the outputs in ``discarded`` that it never reads."""
    if not discarded:
        return kernel
    read = {e.tensor for st in walk_stmts(kernel.body) for e in stmt_nodes(st) if isinstance(e, Read)}
    dead = discarded - read
    if not dead:
        return kernel

    def drop(s: Stmt) -> Stmt | tuple[Stmt, ...] | None:
        if isinstance(s, Store) and s.buffer in dead:
            return ()
        if isinstance(s, For) and not s.body or isinstance(s, If) and not s.then and not s.other:
            return ()
        return None
    return rewrite(kernel, pre=drop, post=drop)
