"""A partial register block computed in whole vectors over zero-padded panels: part of
operand packing (BLIS's edge micro-kernels, which run the full kernel's loops on packed
panels padded with zeros and store only the valid part of the block).

A product whose columns are not whole register blocks ends in a narrower block: 1000
columns in blocks of 64 leave one of 40, two vectors of 16 and a half. Its vector loops
run 40 lanes, the last vector under a mask, and LLVM keeps masked accumulators in memory,
loading and storing each one on every reduction step. Such a block's operand comes from a
packed panel whose lanes past the operand's edge hold zeros (:mod:`.pack_operands`), so
its accumulators can take whole vectors: the loops that set and update them run the
lanes up to the next whole vector (48), where the padded lanes add zeros, and the loop
that stores the block keeps its 40 lanes. The accumulators then live in registers as a
full block's do (1024 x 1024 x 1000: 1.4x).

A vector loop ``v in 0:t`` (``t`` not whole vectors, nothing nested in it) is widened
when each statement in it stores a ``local`` accumulator at ``acc(..., v)`` and reads,
through ``v``, only such accumulators and packed panels ``P(..., v)`` at least that wide;
an accumulator is widened with every loop that stores it, or with none.
"""

from __future__ import annotations

from dataclasses import replace

from polyfuse.ir.comprehension import IndexVar, Literal, Read, walk
from polyfuse.ir.loops import (Assign, Buffer, BufferRole, For, LoopKernel, Stmt, Store, constant_trips, rewrite,
                               stmt_nodes, walk_stmts)


def widen_partial_blocks(kernel: LoopKernel, panels: frozenset[str]) -> LoopKernel:
    """``kernel`` with its partial register blocks' accumulator loops run in whole
    vectors; ``panels`` names the packed buffers, whose panels are whole and zero-padded."""
    buffers = {b.name: b for b in kernel.buffers}
    accumulators = {b.name for b in kernel.buffers if b.role is BufferRole.LOCAL and b.name not in panels}
    loops: dict[int, tuple[For, int, set[str]]] = {}   # id -> loop, its lanes widened, the accumulators it stores
    storers: dict[str, list[int]] = {}                  # accumulator -> the loops storing it
    for s in walk_stmts(kernel.body):
        if isinstance(s, For):
            found = _widenable(s, buffers, accumulators, panels)
            if found is not None:
                loops[id(s)] = (s, *found)
        if isinstance(s, Store):
            storers.setdefault(s.buffer, []).append(id(s))
    # the stores of each accumulator, by loop: all of them in widenable loops, or none widen
    inside = {id(st): key for key, (lp, _, _) in loops.items() for st in lp.body if isinstance(st, Store)}
    widened = set(loops)
    while True:
        blocked = {acc for acc in accumulators
                   if any(inside.get(st) not in widened for st in storers.get(acc, []))}
        keep = {key for key in widened if not (loops[key][2] & blocked)
                and not (_reads(loops[key][0], accumulators) & blocked)}
        if keep == widened:
            break
        widened = keep
    if not widened:
        return kernel
    lanes: dict[str, int] = {}
    for key in widened:
        for acc in loops[key][2]:
            lanes[acc] = max(lanes.get(acc, 0), loops[key][1])

    def widen(s: Stmt) -> Stmt | None:
        if isinstance(s, For) and id(s) in widened:
            return replace(s, hi=Literal(loops[id(s)][1], s.hi.dtype))  # type: ignore[attr-defined]
        return None

    body = rewrite(kernel.body, pre=widen)
    grown = tuple(replace(b, shape=(*b.shape[:-1], max(b.shape[-1], lanes[b.name])))
                  if b.name in lanes else b for b in kernel.buffers)
    return replace(kernel, buffers=grown, body=body)


def _widenable(lp: For, buffers: dict[str, Buffer], accumulators: set[str],
               panels: frozenset[str]) -> tuple[int, set[str]] | None:
    """The lanes of whole vectors a partial vector loop ``lp`` may run and the
    accumulators it stores, or None."""
    trips = constant_trips(lp)
    if lp.vector <= 1 or trips is None or not trips % lp.vector or lp.step != 1 \
            or not isinstance(lp.lo, Literal) or lp.lo.value != 0:
        return None
    lanes = -(-trips // lp.vector) * lp.vector
    v = lp.var
    stored: set[str] = set()
    for st in lp.body:
        if isinstance(st, Store):
            if st.buffer not in accumulators or not _along(st.indices, v):
                return None
            stored.add(st.buffer)
        elif not isinstance(st, Assign):
            return None
        for e in stmt_nodes(st):
            for r in walk(e):
                if isinstance(r, Read) and any(v in _names(i) for i in r.indices):
                    ok = r.tensor in accumulators or (r.tensor in panels and buffers[r.tensor].shape[-1] >= lanes)
                    if not ok or not _along(r.indices, v):
                        return None
    return (lanes, stored) if stored else None


def _along(indices: tuple, v: str) -> bool:
    """Whether ``v`` is the last index exactly and appears in no other."""
    *rest, last = indices
    return isinstance(last, IndexVar) and last.name == v and not any(v in _names(i) for i in rest)


def _reads(lp: For, accumulators: set[str]) -> set[str]:
    """The accumulators loop ``lp`` reads."""
    return {r.tensor for st in lp.body for e in stmt_nodes(st) for r in walk(e)
            if isinstance(r, Read) and r.tensor in accumulators}


def _names(e) -> set[str]:  # type: ignore[no-untyped-def]
    return {n.name for n in walk(e) if isinstance(n, IndexVar)}
