"""Register tiles: a contraction's thread region as a :class:`Threads` statement.

The loop IR of a contraction on the GPU, after accumulator promotion, is

    for c2 in 0:K step 32 {                  # the reduction's tile loops (uniform)
      thread for c3 in 0:32 {                # the output tile's point loops
        thread for c4 in 0:32 {
          let acc1 = C(c0 + c3, c1 + c4)     # inits
          for c5 in 0:32 { let acc1 = acc1 + A(c0 + c3, c2 + c5) * B(c2 + c5, c1 + c4) }
          C(c0 + c3, c1 + c4) = acc1         # stores
        }
      }
    }

which reloads and stores each accumulator on every reduction tile. Here each thread
instead owns an ``r_y x r_x`` micro-tile of the outputs (``c3 = 8 * t_y + c3r``) and
keeps its accumulators in :class:`Registers` through the whole reduction:

    threads c3 in 0:32 step 4 on y, c4 in 0:32 step 4 on x registers acc1 float32(4, 4) {
      for c3r, c4r { acc1(c3r, c4r) = C(c0 + c3 + c3r, c1 + c4 + c4r) }
      for c2 in 0:K step 32 {
        for c5 in 0:32 { for c3r, c4r { acc1(c3r, c4r) = acc1(c3r, c4r) + A(..) * B(..) } }
      }
      for c3r, c4r { C(c0 + c3 + c3r, c1 + c4 + c4r) = acc1(c3r, c4r) }
    }

The reduction's loops are uniform in the new region, so shared-memory promotion puts
the copies of each step (and barrier placement their barriers) inside it; the micro
loops are innermost and unrolled, so one read of ``A`` serves a row of the micro-tile
and one of ``B`` a column.

Why it is sound: the thread loops are coincident, so points touch disjoint outputs and
only the order of each point's own work matters, which stays; each point's
accumulators are stored to outputs no other statement of the nest reads and reloaded
from the same elements on the next reduction tile, so keeping them in registers
instead changes nothing; the copies read inputs only. The pattern is refused
otherwise: stores not of an accumulator, indices that vary with the reduction tiles,
reads of an output in the products, loops whose bounds depend on the point.

The block's threads along an axis come from the options (``block``); a thread keeps
the points beyond them. The micro-tile along an axis divides the region's extent (threads then cover it
exactly, and shared tiles, sized to the region, are never read past their end); where
the extent is not constant (the last, partial tile), inits, stores and any products
that read global memory are guarded by the point's own bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import takewhile

from polyfuse.ir.affine import max_trips, normal_form, to_expr
from polyfuse.ir.comprehension import (Binary, BinaryOp, Expr, IndexVar, Literal, LocalRef, Read, index_names,
                                       map_expr, walk)
from polyfuse.ir.gpu import Registers, ThreadRange, Threads
from polyfuse.ir.loops import (Assign, For, If, LoopKind, Stmt, Store, fresh_name, perfect_nest, rewrite,
                               stmt_nodes)
from polyfuse.ir.types import DType
from polyfuse.scheduler.heuristics import divisor_at_most

MAX_AXES = 3
MAX_MICRO = 8   # points per thread along an axis (8 x 8 accumulators fit the registers)


@dataclass(frozen=True, slots=True)
class _Axis:
    """One thread loop of the region and what it becomes."""

    loop: For
    axis: int
    micro: int          # points per thread along it
    threads: int
    inner: str          # the variable of the micro loop (unused when ``micro`` is 1)

    @property
    def full(self) -> bool:
        """Whether every point of every thread lies inside the loop (constant bounds)."""
        return isinstance(self.loop.lo, Literal) and isinstance(self.loop.hi, Literal)

    def point(self) -> Expr:
        """The loop variable as the thread's corner plus its micro loop's variable."""
        if self.micro == 1:
            return IndexVar(self.loop.var)
        return to_expr({self.loop.var: 1, self.inner: self.loop.step})


@dataclass(frozen=True, slots=True)
class _Nest:
    """A point's statements: accumulator inits, what sums into them, stores."""

    inits: tuple[Assign, ...]
    middle: tuple[Stmt, ...]
    stores: tuple[Store, ...]


def tile_registers(s: For, asked: Callable[[int], tuple[int, ...]], max_block: tuple[int, int, int],
                   max_threads: int, taken: set[str], zeroed: frozenset[str] = frozenset(),
                   outside: frozenset[str] = frozenset()) -> Threads | None:
    """``s`` (the reduction's tile loops around a thread region, or the region itself)
    as a :class:`Threads`, or None where the pattern (see the module doc) does not hold,
    nothing would be kept in registers, or the threads would not fit ``max_block`` and
    ``max_threads``. ``asked(axes)``: the threads per block the options ask for along x,
    y, z in a region of that many axes; a thread keeps the points of the region's extent
    beyond those (the largest divisor of the extent up to ``MAX_MICRO`` that leaves at
    least as many threads as asked). ``taken``: names in use; the new ones are added.
    ``zeroed``: outputs that start as zeros and that one statement writes; an accumulator
    of one, indexed by every loop around ``s`` (``outside``: their variables; so the
    region sums whole reductions), starts at zero instead of loading them."""
    outer: list[For] = []
    while s.kind is not LoopKind.THREAD and len(s.body) == 1 and isinstance(s.body[0], For):
        outer.append(s)
        s = s.body[0]
    if s.kind is not LoopKind.THREAD:
        return None
    chain = list(takewhile(lambda f: f.kind is LoopKind.THREAD, perfect_nest(s)))
    if len(chain) > MAX_AXES:
        return None
    axes = _axes(chain, asked(len(chain)), taken)
    nest = _nest(chain[-1].body, {f.var for f in outer}, {f.var for f in chain})
    if axes is None or nest is None or (not outer and all(a.micro == 1 for a in axes)):
        return None
    shape = [1, 1, 1]
    for a in axes:
        shape[a.axis] = a.threads
    if any(n > m for n, m in zip(shape, max_block)) or shape[0] * shape[1] * shape[2] > max_threads:
        return None
    return _build(outer, axes, nest, taken, frozenset(
        a.var for a in nest.inits if isinstance(a.value, Read) and a.value.tensor in zeroed
        and outside <= set().union(*map(index_names, a.value.indices))))


def _axes(chain: list[For], asked: tuple[int, ...], taken: set[str]) -> list[_Axis] | None:
    """The region's loops outermost first, the innermost on x: each loop's extent must be
    bounded by a constant and its start uniform."""
    out = []
    variables = {f.var for f in chain}
    for axis, loop in zip(reversed(range(len(chain))), chain):
        trips = max_trips(loop.lo, loop.hi, loop.step)
        if not trips or index_names(loop.lo) & variables or index_names(loop.hi) & variables:
            return None
        threads = asked[axis] if axis < len(asked) else 1
        micro = divisor_at_most(trips, min(MAX_MICRO, -(-trips // threads)))
        inner = fresh_name(f"{loop.var}r", taken) if micro > 1 else ""
        out.append(_Axis(loop, axis, micro, trips // micro, inner))
    return out


def _nest(body: tuple[Stmt, ...], tiles: set[str], points: set[str]) -> _Nest | None:
    """``body`` as inits, middle and stores, when it has that form: stores of
    accumulators at indices the reduction tiles (``tiles``) do not change, outputs not
    read in the middle, whose loops do not depend on the point (``points``)."""
    k = 0
    inits: list[Assign] = []
    while k < len(body) and isinstance(body[k], Assign):
        inits.append(body[k])  # type: ignore[arg-type]
        k += 1
    stores: list[Store] = []
    end = len(body)
    while end > k and isinstance(body[end - 1], Store):
        stores.insert(0, body[end - 1])  # type: ignore[arg-type]
        end -= 1
    accs = {a.var for a in inits}
    if not stores or len(accs) != len(inits):
        return None
    target: dict[str, Store] = {}
    for st in stores:
        if not (isinstance(st.value, LocalRef) and st.value.name in accs) or \
                any(index_names(i) & tiles for i in st.indices):
            return None
        target[st.value.name] = st
    outputs = {st.buffer for st in stores}
    for a in inits:
        own = target.get(a.var)
        reads = [r for r in walk(a.value) if isinstance(r, Read) and r.tensor in outputs]
        if any(own is None or (r.tensor, r.indices) != (own.buffer, own.indices) for r in reads):
            return None
        if tiles and (own is None or not _reloads(a.value, own)):
            return None  # with reduction tiles, each one starts from what the last stored
    middle = body[k:end]
    if not _summing(middle, accs, outputs, points):
        return None
    return _Nest(tuple(inits), middle, tuple(stores))


def _reloads(value: Expr, store: Store) -> bool:
    return isinstance(value, Read) and (value.tensor, value.indices) == (store.buffer, store.indices)


def _summing(body: tuple[Stmt, ...], accs: set[str], outputs: set[str], points: set[str]) -> bool:
    """Whether ``body`` only assigns accumulators, in loops whose bounds do not depend on
    the point, without reading the outputs."""
    for s in body:
        if any(isinstance(r, Read) and r.tensor in outputs for r in stmt_nodes(s)):
            return False
        if isinstance(s, For):
            if index_names(s.lo) & points or index_names(s.hi) & points or \
                    not _summing(s.body, accs, outputs, points):
                return False
        elif not (isinstance(s, Assign) and s.var in accs):
            return False
    return True


class _Builder:
    """Rewrites a point's statements for the thread that owns a micro-tile of points."""

    def __init__(self, axes: list[_Axis], inits: tuple[Assign, ...], from_zero: frozenset[str]) -> None:
        self.from_zero = from_zero   # accumulators that start at zero, not from their output
        self.axes = axes
        self.micro = [a for a in axes if a.micro > 1]
        self.index = tuple(IndexVar(a.inner) for a in self.micro) or (Literal(0, DType.INT64),)
        self.registers = {a.var: Registers(a.var, a.value.dtype.compute, tuple(x.micro for x in self.micro) or (1,))
                          for a in inits}
        points = {a.loop.var: a.point() for a in axes}
        self.guard = None
        for a in axes:
            if not a.full:
                inside = Binary(BinaryOp.LT, points[a.loop.var], a.loop.hi, DType.BOOL)
                self.guard = inside if self.guard is None else Binary(BinaryOp.AND, self.guard, inside, DType.BOOL)

        def substitute(e: Expr) -> Expr:
            if isinstance(e, IndexVar) and e.name in points:
                return points[e.name]
            if isinstance(e, LocalRef) and e.name in self.registers:
                return Read(e.name, self.index, self.registers[e.name].dtype)
            if isinstance(e, Read):
                return replace(e, indices=tuple(normal_form(i) for i in e.indices))
            return e
        self.substitute = substitute

    def expr(self, e: Expr) -> Expr:
        return map_expr(e, self.substitute)

    def loops(self, body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
        """``body`` run for each point of the micro-tile (unrolled loops, x innermost)."""
        for a in reversed(self.micro):
            body = (For(a.inner, Literal(0, DType.INT64), Literal(a.micro, DType.INT64), body, unroll=a.micro),)
        return body

    def guarded(self, then: tuple[Stmt, ...], other: tuple[Stmt, ...] = ()) -> tuple[Stmt, ...]:
        return then if self.guard is None else (If(self.guard, then, other),)

    def set(self, acc: str, value: Expr) -> Store:
        return Store(acc, self.index, self.expr(value))

    def inits(self, inits: tuple[Assign, ...]) -> tuple[Stmt, ...]:
        def zero(a: Assign) -> Store:
            return self.set(a.var, Literal(0.0 if a.value.dtype.is_float else 0, a.value.dtype.compute))
        loaded = tuple(a for a in inits if a.var not in self.from_zero)
        started = tuple(zero(a) for a in inits if a.var in self.from_zero)
        guarded = self.guarded(tuple(self.set(a.var, a.value) for a in loaded), tuple(map(zero, loaded))) \
            if loaded else ()
        return self.loops((*started, *guarded))

    def middle(self, body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
        """Loops stay (uniform now); each run of accumulator updates goes in micro loops,
        guarded where they read global memory and some point may lie outside."""
        out: list[Stmt] = []
        run: list[Stmt] = []

        def flush() -> None:
            if run:
                reads = any(isinstance(r, Read) and r.tensor not in self.registers for s in run for r in stmt_nodes(s))
                out.extend(self.loops(self.guarded(tuple(run)) if reads else tuple(run)))
                run.clear()
        for s in body:
            if isinstance(s, For):
                flush()
                out.append(replace(s, kind=LoopKind.SERIAL, body=self.middle(s.body)))
            else:
                run.append(self.set(s.var, s.value))  # type: ignore[attr-defined]
        flush()
        return tuple(out)

    def stores(self, stores: tuple[Store, ...]) -> tuple[Stmt, ...]:
        tidy = tuple(Store(st.buffer, tuple(normal_form(self.expr(i)) for i in st.indices), self.expr(st.value))
                     for st in stores)
        return self.loops(self.guarded(tidy))


def _build(outer: list[For], axes: list[_Axis], nest: _Nest, taken: set[str],
           from_zero: frozenset[str]) -> Threads:
    b = _Builder(axes, nest.inits, from_zero)
    body: tuple[Stmt, ...] = b.middle(nest.middle)
    for loop in reversed(outer):
        body = (replace(loop, kind=LoopKind.SERIAL, body=body),)
    ranges = tuple(ThreadRange(a.loop.var, a.loop.lo, a.loop.step * a.micro, a.threads, a.axis) for a in axes)
    return Threads(ranges, tuple(b.registers.values()), (*b.inits(nest.inits), *body, *b.stores(nest.stores)))


def speculate(region: Threads, tiles: set[str]) -> Threads:
    """``region`` with the guards dropped from updates of its registers that read only
    registers and shared ``tiles``: every point of every thread lies inside the tiles
    (their boxes cover the threads' whole ranges), and the registers of points past the
    region's bounds are never stored, so updating them is harmless and the unrolled
    micro-tile runs without a branch per point."""
    registers = {r.name for r in region.registers}
    local = registers | tiles

    def harmless(s: Stmt) -> bool:
        return isinstance(s, Store) and s.buffer in registers and all(
            r.tensor in local for r in stmt_nodes(s) if isinstance(r, Read))

    def drop(s: Stmt) -> Stmt | tuple[Stmt, ...] | None:
        if isinstance(s, If) and not s.other and all(harmless(x) for x in s.then):
            return s.then
        return None
    return replace(region, body=rewrite(region.body, post=drop))
