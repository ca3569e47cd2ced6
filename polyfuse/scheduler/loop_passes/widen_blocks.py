"""A partial register block computed in whole vectors over zero-padded panels: a loop-IR
pass run after operand packing (BLIS's edge micro-kernels, which run the full kernel's loops on packed
panels padded with zeros and store only the valid part of the block).

A product whose columns are not whole register blocks ends in a narrower block: 1000
columns in blocks of 64 leave one of 40, two vectors of 16 and a half. Its vector loops
run 40 lanes, the last vector under a mask, and LLVM keeps masked accumulators in memory,
loading and storing each one on every reduction step. Such a block's operand comes from a
packed panel whose lanes past the operand's edge hold zeros (:mod:`.pack_operands`), so
its accumulators can take whole vectors: the loops that set and update them run the
lanes up to the next whole vector (48), where the padded lanes add zeros, and the loop
that stores the block keeps its 40 lanes. The accumulators then live in registers as a
full block's do (benchmarks/LOG.md).

A vector loop ``v in 0:t`` (``t`` not whole vectors, nothing nested in it) is widened
when each statement in it stores a ``local`` accumulator at ``acc(..., v)`` and reads,
through ``v``, only such accumulators and packed panels ``P(..., v)`` at least that wide;
an accumulator is widened with every loop that stores it, or with none.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import NamedTuple

from polyfuse.ir.comprehension import IndexVar, Literal, Read, index_names, walk
from polyfuse.ir.loops import (Assign, Buffer, BufferRole, For, LoopKernel, Stmt, Store, constant_trips, rewrite,
                               stmt_nodes, walk_stmts)


def widen_partial_blocks(kernel: LoopKernel) -> LoopKernel:
    """``kernel`` with its partial register blocks' accumulator loops run in whole
    vectors over its ``panel`` buffers (whole and zero-padded)."""
    buffers = {b.name: b for b in kernel.buffers}
    panels = frozenset(b.name for b in kernel.buffers if b.panel)
    accumulators = {b.name for b in kernel.buffers if b.role is BufferRole.LOCAL and b.name not in panels}
    stores = Counter(s.buffer for s in walk_stmts(kernel.body) if isinstance(s, Store))
    loops = {id(s): found for s in walk_stmts(kernel.body)
             if isinstance(s, For) and (found := _widenable(s, buffers, accumulators, panels)) is not None}
    # an accumulator widens with every loop that stores it, or with none
    while True:
        covered = sum((lp.stores for lp in loops.values()), Counter())
        blocked = {acc for acc in accumulators if covered[acc] < stores[acc]}
        keep = {key: lp for key, lp in loops.items() if not (set(lp.stores) | lp.reads) & blocked}
        if len(keep) == len(loops):
            break
        loops = keep
    if not loops:
        return kernel
    lanes: dict[str, int] = {}
    for lp in loops.values():
        for acc in lp.stores:
            lanes[acc] = max(lanes.get(acc, 0), lp.lanes)

    def widen(s: Stmt) -> Stmt | None:
        if isinstance(s, For) and id(s) in loops:
            return replace(s, hi=Literal(loops[id(s)].lanes, s.hi.dtype))  # type: ignore[attr-defined]
        return None

    grown = tuple(replace(b, shape=(*b.shape[:-1], max(b.shape[-1], lanes[b.name])))
                  if b.name in lanes else b for b in kernel.buffers)
    return replace(kernel, buffers=grown, body=rewrite(kernel.body, pre=widen))


class _Widenable(NamedTuple):
    lanes: int              # the whole vectors' lanes the loop runs widened
    stores: Counter[str]    # its stores, by accumulator
    reads: set[str]         # the accumulators it reads


def _widenable(lp: For, buffers: dict[str, Buffer], accumulators: set[str],
               panels: frozenset[str]) -> _Widenable | None:
    """How a partial vector loop ``lp`` would run in whole vectors, or None where it may not."""
    trips = constant_trips(lp)
    if lp.vector <= 1 or trips is None or not trips % lp.vector or lp.step != 1 \
            or not isinstance(lp.lo, Literal) or lp.lo.value != 0:
        return None
    lanes = -(-trips // lp.vector) * lp.vector
    v = lp.var
    stored: Counter[str] = Counter()
    reads: set[str] = set()
    for st in lp.body:
        if isinstance(st, Store):
            if st.buffer not in accumulators or not _along(st.indices, v):
                return None
            stored[st.buffer] += 1
        elif not isinstance(st, Assign):
            return None
        for r in (n for e in stmt_nodes(st) for n in walk(e) if isinstance(n, Read)):
            if r.tensor in accumulators:
                reads.add(r.tensor)
            if any(v in index_names(i) for i in r.indices):
                ok = r.tensor in accumulators or (r.tensor in panels and buffers[r.tensor].shape[-1] >= lanes)
                if not ok or not _along(r.indices, v):
                    return None
    return _Widenable(lanes, stored, reads) if stored else None


def _along(indices: tuple, v: str) -> bool:
    """Whether ``v`` is the last index exactly and appears in no other."""
    *rest, last = indices
    return isinstance(last, IndexVar) and last.name == v and not any(v in index_names(i) for i in rest)
