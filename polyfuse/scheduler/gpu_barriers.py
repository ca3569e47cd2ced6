"""Barrier placement: ``__syncthreads()`` where threads of a block hand data to each other.

The uniform part of a launch is a sequence of *units*: thread regions, single-thread
statements, shared-memory copies and the statements every thread runs alike (reading
every thread's partial total after a warp reduction), inside uniform loops and
conditionals. Walking it
in order, a barrier goes before a unit that touches a buffer (or shared tile) that a
unit since the last barrier touched, one of them writing it, unless both accesses are
*owned* by the same thread: every thread axis of the region indexes the element as
``thread variable + block-constant`` (the thread that wrote ``C(c0 + c3, c1 + c4)``
reads it back), or both are single-thread statements. A uniform loop also needs a
barrier at the end of its body when the units after its last barrier conflict with
those before its first (the next iteration's copy overwrites a tile the region reads).
Across iterations of the block loops only shared tiles can conflict: the block loops
are coincident, so their iterations share no global data.

A :class:`~polyfuse.ir.gpu.Threads` region is walked into: its uniform loops and
conditions that hold copies are walked like those outside (a contraction's reduction
loop gets a barrier after its copies and one at the end of its body), its other
statements are units of their own. There a thread owns an element when some index is
``its variable + micro-tile offset + block constant``, the offset (a constant loop's
variable times its step) within the thread's step, so two threads never share it; its
registers are its own and never conflict.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from polyfuse.ir.comprehension import Expr, IndexVar, Literal, Read
from polyfuse.ir.gpu import Barrier, BlockLoops, CopyToShared, GpuKernel, Launch, SingleThread, ThreadFor, Threads
from polyfuse.ir.loops import For, If, LoopRewriter, Scope, Stmt, Store, constant_trips, stmt_nodes, walk_stmts
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
    return replace(launch, body=_Placer(launch).body(launch.body, Scope()))


def _conflict(a: set[_Access], b: set[_Access]) -> bool:
    return any(x.buffer == y.buffer and (x.write or y.write) and (x.owner is None or x.owner != y.owner)
               for x in a for y in b)


class _Placer(LoopRewriter):
    """Puts barriers in a launch's uniform part, walking it in order: ``pending`` holds
    the accesses since the last barrier before the statement at hand."""

    def __init__(self, launch: Launch) -> None:
        self.shared = {t.name for t in launch.shared}
        self.block_vars = {r.var for s in walk_stmts(launch.body) if isinstance(s, BlockLoops)
                           for r in s.loops}
        self.pending: set[_Access] = set()
        self.region: Threads | None = None      # the register tile walked in, if any
        self.micro: dict[str, tuple[int, int]] = {}  # its loops with constant bounds: first, last value

    def loop(self, s: For, scope: Scope) -> Stmt | tuple[Stmt, ...]:
        return self.leaf(s, scope) if self.own(s) else self.repeated(s, scope)

    def nested(self, s: Stmt, scope: Scope) -> Stmt | tuple[Stmt, ...]:
        """Block loops repeat what they hold; a register tile is walked into; a thread
        region or single-thread statements are one unit."""
        if isinstance(s, Threads):
            self.region, self.micro = s, _constant_loops(s.body)
            body = self.body(s.body, scope)
            self.region = None
            return replace(s, body=body)
        return self.repeated(s, scope) if isinstance(s, BlockLoops) else self.leaf(s, scope)

    def own(self, s: Stmt) -> bool:
        """Whether ``s``, in a register tile, is a unit: the thread's own code (depending
        on its variables) or uniform code without copies."""
        if self.region is None:
            return False
        private = any(isinstance(e, IndexVar) and e.name in self.region.vars for e in stmt_nodes(s))
        return private or not any(isinstance(x, CopyToShared) for x in walk_stmts((s,)))

    def branch(self, s: If, scope: Scope) -> Stmt | tuple[Stmt, ...]:
        if self.own(s):
            return self.leaf(s, scope)
        before = self.pending
        then = self.body(s.then, scope.under_guard())
        after_then, self.pending = self.pending, before
        other = self.body(s.other, scope.under_guard())
        self.pending = after_then | self.pending
        return replace(s, then=then, other=other)

    def leaf(self, s: Stmt, scope: Scope) -> Stmt | tuple[Stmt, ...]:
        touched = self.accesses((s,))
        out: tuple[Stmt, ...] = (s,)
        if _conflict(self.pending, touched):
            out = (Barrier(), s)
            self.pending = set()
        self.pending = self.pending | touched
        return out

    def repeated(self, s: For | BlockLoops, scope: Scope) -> tuple[Stmt, ...]:
        """A uniform loop or the block loops: a barrier at the end of the body where the
        next iteration's start conflicts with its end, and before it where its start
        conflicts with what came before."""
        before, self.pending = self.pending, set()
        inner = self.body(s.body, scope.inside(s) if isinstance(s, For) else scope)
        tail = self.pending
        head = self.head(inner)
        carried = tail if isinstance(s, For) else {a for a in tail if a.buffer in self.shared}
        if _conflict(carried, head):
            inner, tail = inner + (Barrier(),), set()
        out: tuple[Stmt, ...] = ()
        if _conflict(before, head):
            out, before = (Barrier(),), set()
        synced = any(isinstance(x, Barrier) for x in inner)
        self.pending = before | (tail if synced else self.accesses(inner))
        return (*out, replace(s, body=inner))

    def head(self, body: tuple[Stmt, ...]) -> set[_Access]:
        """Accesses before the first barrier of ``body``."""
        out: set[_Access] = set()
        for s in body:
            if isinstance(s, Barrier):
                break
            out |= self.accesses((s,))
        return out

    def accesses(self, body: tuple[Stmt, ...]) -> set[_Access]:
        """What the units of ``body`` read and write."""
        out: set[_Access] = set()
        for s in walk_stmts(body, into=lambda s: not isinstance(s, (ThreadFor, SingleThread, Threads))):
            if isinstance(s, CopyToShared):
                out |= {_Access(s.tile, True, None), _Access(s.buffer, False, None)}
            elif isinstance(s, SingleThread):
                out |= _touched(s.body, lambda _: ("single",))
            elif isinstance(s, ThreadFor):
                axes = {t.axis: t for t in walk_stmts((s,)) if isinstance(t, ThreadFor)}
                out |= _touched((s,), lambda idx: self.owner(idx, axes))
            elif isinstance(s, Threads):
                outer, micro = self.region, self.micro
                self.region, self.micro = s, _constant_loops(s.body)
                out |= self.accesses(s.body)
                self.region, self.micro = outer, micro
            else:
                out |= self.own_accesses(s, self.region)
        return out

    def own_accesses(self, s: Stmt, region: Threads | None) -> set[_Access]:
        """What a statement of a register tile, or of uniform code (every thread alike,
        no owner), reads and writes itself (not the statements in its body), the tile's
        registers left out."""
        private = {r.name for r in region.registers} if region is not None else set()

        def owner(indices: tuple[Expr, ...]) -> Owner:
            return self.tile_owner(indices, region) if region is not None else None
        out = {_Access(r.tensor, False, owner(r.indices))
               for r in stmt_nodes(s) if isinstance(r, Read) and r.tensor not in private}
        if isinstance(s, Store) and s.buffer not in private:
            out.add(_Access(s.buffer, True, owner(s.indices)))
        return out

    def tile_owner(self, indices: tuple[Expr, ...], region: Threads) -> Owner:
        """Per range of the register tile: the index position that is ``its variable +
        offset within its step + block constant``, and that constant; None when some
        range has none."""
        parts = []
        for r in region.ranges:
            found = None
            for position, index in enumerate(indices):
                f = affine(index)
                if f is None or f.get(r.var) != 1:
                    continue
                rest = {v: c for v, c in f.items() if v != r.var and v not in self.micro}
                ends = [c * end for v, c in f.items() if v in self.micro for end in self.micro[v]]
                if variables(rest) <= self.block_vars and all(0 <= x < r.step for x in ends):
                    found = (r.axis, position, tuple(sorted(rest.items())))
                    break
            if found is None:
                return None
            parts.append(found)
        return tuple(parts)

    def owner(self, indices: tuple[Expr, ...], axes: dict[int, ThreadFor]) -> Owner:
        """Per thread axis: the index position that is ``thread variable + block
        constant`` and the loop's start and step (and its vector and end); None when
        some axis has none."""
        parts = []
        for axis, loop in sorted(axes.items()):
            if not isinstance(loop.lo, Literal):
                return None
            found = None
            for position, index in enumerate(indices):
                f = affine(index)
                if f is not None and f.get(loop.var) == 1 and variables(f) - {loop.var} <= self.block_vars:
                    rest = tuple(sorted((v, c) for v, c in f.items() if v != loop.var))
                    # a vector's groups, and the iterations past them, depend on its end too
                    spread = (loop.vector, loop.hi) if loop.vector > 1 else ()
                    found = (axis, position, int(loop.lo.value), loop.step, rest, *spread)
                    break
            if found is None:
                return None
            parts.append(found)
        return tuple(parts)


def _constant_loops(body: tuple[Stmt, ...]) -> dict[str, tuple[int, int]]:
    """The first and last value of each loop of ``body`` with constant bounds."""
    out = {}
    for f in walk_stmts(body):
        if isinstance(f, For) and (trips := constant_trips(f)):
            first = int(f.lo.value)  # type: ignore[attr-defined]
            out[f.var] = (first, first + (trips - 1) * f.step)
    return out


def _touched(body: tuple[Stmt, ...], owner) -> set[_Access]:  # type: ignore[no-untyped-def]
    """Reads and writes of ``body``, each with ``owner(indices)``."""
    out: set[_Access] = set()
    for s in walk_stmts(body):
        if isinstance(s, Store):
            out.add(_Access(s.buffer, True, owner(s.indices)))
        out |= {_Access(r.tensor, False, owner(r.indices)) for r in stmt_nodes(s) if isinstance(r, Read)}
    return out
