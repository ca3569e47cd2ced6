"""Keep reductions in registers: a loop-IR pass.

A loop nest whose only statement is ``T(idx) = combine(T(idx), value)``, with ``idx``
independent of the nest's iterators, becomes::

    let acc = T(idx)
    for ...: let acc = combine(acc, value)
    T(idx) = acc

The accumulator lives in compute precision (float32 for float16 tensors), so a
float16 sum is rounded once, as the reference interpreter does, and the loop body no
longer loads and stores memory on every step.
"""

from __future__ import annotations

from polyfuse.ir.comprehension import Expr, IndexVar, LocalRef, Read, map_expr, walk
from polyfuse.ir.loops import Assign, For, LoopKernel, LoopKind, Stmt, Store, perfect_nest, rewrite, walk_stmts


def promote_accumulators(kernel: LoopKernel) -> LoopKernel:
    """Keep each accumulation of a loop nest into one fixed element in a local
    (``acc1``, ``acc2``, ... in the order the nests come)."""
    counter = [0]
    return rewrite(kernel, pre=lambda s: _promote(s, counter) if isinstance(s, For) else None)


def _nest(loop: For) -> tuple[list[str], Store] | None:
    """The iterators of a perfect loop nest ending in exactly one store, or None."""
    loops = perfect_nest(loop)
    inner = loops[-1].body
    if len(inner) != 1 or not isinstance(inner[0], Store):
        return None
    return [lp.var for lp in loops], inner[0]


def _promote(loop: For, counter: list[int]) -> tuple[Stmt, ...] | None:
    found = _nest(loop)
    if found is None:
        return None
    names, store = found
    if any(isinstance(s, For) and s.kind is not LoopKind.SERIAL for s in walk_stmts((loop,))):
        return None
    uses = {n.name for i in store.indices for n in walk(i) if isinstance(n, IndexVar)}
    if uses & set(names):
        return None
    reads = [n for n in walk(store.value) if isinstance(n, Read) and n.tensor == store.buffer]
    if not reads or any(r.indices != store.indices for r in reads):
        return None  # not an accumulation into one fixed element
    target = reads[0]
    counter[0] += 1
    acc = LocalRef(f"acc{counter[0]}", target.dtype)

    def swap(e: Expr) -> Expr:
        return acc if isinstance(e, Read) and e.tensor == store.buffer and e.indices == store.indices else e

    update = Assign(acc.name, map_expr(store.value, swap))
    nest = rewrite((loop,), post=lambda s: update if s is store else None)
    return (Assign(acc.name, target), *nest, Store(store.buffer, store.indices, acc))
