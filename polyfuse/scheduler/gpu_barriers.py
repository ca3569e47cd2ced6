"""Barrier placement: ``__syncthreads()`` where threads of a block hand data to each other.

The uniform part of a launch is a sequence of *units*: thread regions, single-thread
statements and shared-memory copies, inside uniform loops and conditionals. Walking it
in order, a barrier goes before a unit that touches a buffer (or shared tile) that a
unit since the last barrier touched, one of them writing it, unless both accesses are
*owned* by the same thread: every thread axis of the region indexes the element as
``thread variable + block-constant`` (the thread that wrote ``C(c0 + c3, c1 + c4)``
reads it back), or both are single-thread statements. A uniform loop also needs a
barrier at the end of its body when the units after its last barrier conflict with
those before its first (the next iteration's copy overwrites a tile the region reads).
Across iterations of the block loops only shared tiles can conflict: the block loops
are coincident, so their iterations share no global data.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from polyfuse.ir.comprehension import Expr, Literal, Read, walk
from polyfuse.ir.gpu import (Barrier, BlockLoops, CopyToShared, GpuKernel, Launch, SingleThread,
                             ThreadFor, children, walk_gpu)
from polyfuse.ir.loops import Assign, For, If, Stmt, Store
from polyfuse.ir.affine import affine, variables

Owner = tuple | None  # which thread touches an element, when that is known


@dataclass(frozen=True, slots=True)
class _Access:
    buffer: str
    write: bool
    owner: Owner


def place_barriers(kernel: GpuKernel) -> GpuKernel:
    return replace(kernel, launches=tuple(_launch(launch) for launch in kernel.launches))


def _launch(launch: Launch) -> Launch:
    return replace(launch, body=_Placer(launch).place(launch.body, set())[0])


def _conflict(a: set[_Access], b: set[_Access]) -> bool:
    return any(x.buffer == y.buffer and (x.write or y.write) and (x.owner is None or x.owner != y.owner)
               for x in a for y in b)


class _Placer:
    def __init__(self, launch: Launch) -> None:
        self.shared = {t.name for t in launch.shared}
        self.block_vars = {r.var for s in walk_gpu(launch.body) if isinstance(s, BlockLoops)
                           for r in s.loops}

    def place(self, body: tuple[Stmt, ...], pending: set[_Access]) -> tuple[tuple[Stmt, ...], set[_Access]]:
        """``body`` with barriers, and the accesses since its last barrier (with ``pending``,
        those before it)."""
        out: list[Stmt] = []
        for s in body:
            if isinstance(s, (For, BlockLoops)):
                inner, tail = self.place(s.body, set())
                head = self.head(inner)
                carried = tail if isinstance(s, For) else {a for a in tail if a.buffer in self.shared}
                if _conflict(carried, head):
                    inner, tail = inner + (Barrier(),), set()
                if _conflict(pending, head):
                    out.append(Barrier())
                    pending = set()
                out.append(replace(s, body=inner))
                synced = any(isinstance(x, Barrier) for x in inner)
                pending = pending | (tail if synced else self.accesses(inner))
            elif isinstance(s, If):
                then, after_then = self.place(s.then, pending)
                other, after_other = self.place(s.other, pending)
                out.append(replace(s, then=then, other=other))
                pending = after_then | after_other
            else:
                touched = self.accesses((s,))
                if _conflict(pending, touched):
                    out.append(Barrier())
                    pending = set()
                out.append(s)
                pending = pending | touched
        return tuple(out), pending

    def head(self, body: tuple[Stmt, ...]) -> set[_Access]:
        """Accesses before the first barrier of ``body``."""
        out: set[_Access] = set()
        for s in body:
            if isinstance(s, Barrier):
                break
            out |= self.accesses((s,))
        return out

    def accesses(self, body: tuple[Stmt, ...]) -> set[_Access]:
        out: set[_Access] = set()
        for s in body:
            if isinstance(s, CopyToShared):
                out |= {_Access(s.tile, True, None), _Access(s.buffer, False, None)}
            elif isinstance(s, SingleThread):
                out |= _touched(s.body, lambda _: ("single",))
            elif isinstance(s, ThreadFor):
                axes = {t.axis: t for t in walk_gpu((s,)) if isinstance(t, ThreadFor)}
                out |= _touched((s,), lambda idx: self.owner(idx, axes))
            else:
                for inner in children(s):
                    out |= self.accesses(inner)
        return out

    def owner(self, indices: tuple[Expr, ...], axes: dict[int, ThreadFor]) -> Owner:
        """Per thread axis: the index position that is ``thread variable + block
        constant`` and the loop's start and step; None when some axis has none."""
        parts = []
        for axis, loop in sorted(axes.items()):
            if not isinstance(loop.lo, Literal):
                return None
            found = None
            for position, index in enumerate(indices):
                f = affine(index)
                if f is not None and f.get(loop.var) == 1 and variables(f) - {loop.var} <= self.block_vars:
                    rest = tuple(sorted((v, c) for v, c in f.items() if v != loop.var))
                    found = (axis, position, int(loop.lo.value), loop.step, rest)
                    break
            if found is None:
                return None
            parts.append(found)
        return tuple(parts)


def _touched(body: tuple[Stmt, ...], owner) -> set[_Access]:  # type: ignore[no-untyped-def]
    """Reads and writes of ``body``, each with ``owner(indices)``."""
    out: set[_Access] = set()
    for s in walk_gpu(body):
        exprs: list[Expr] = []
        if isinstance(s, Store):
            out.add(_Access(s.buffer, True, owner(s.indices)))
            exprs = [*s.indices, s.value]
        elif isinstance(s, Assign):
            exprs = [s.value]
        elif isinstance(s, (For, ThreadFor)):
            exprs = [s.lo, s.hi]
        elif isinstance(s, If):
            exprs = [s.cond]
        out |= {_Access(r.tensor, False, owner(r.indices))
                for e in exprs for r in walk(e) if isinstance(r, Read)}
    return out
