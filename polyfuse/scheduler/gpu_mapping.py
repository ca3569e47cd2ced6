"""Loop kernel -> GPU kernel: which loops run on blocks, which on threads (after TC).

The GPU schedule marks the coincident loops of each outermost band: ``block for`` in
the tile band, ``thread for`` in the point band. Each top-level loop nest whose
outermost loop is a block loop becomes one launch (launches run in order, so
dependences between nests hold); the other top-level statements share a launch of
one block. In a launch:

* the outermost perfectly nested block loops with constant bounds become
  :class:`BlockLoops`, spread over a one-dimensional grid (coincident, so no two blocks
  touch the same data); block loops further in run serially in every block;
* below them, each outermost chain of perfectly nested thread loops is a *region*: its
  innermost three loops go to threads x (innermost, so neighbouring threads touch
  neighbouring elements), y and z; outer ones of a longer chain, and thread loops
  nested deeper, run serially in each thread;
* statements outside every region run on one thread of the block, and a region that
  uses fewer thread axes than the block has runs on the threads at 0 along the others
  (else each of them would run it again: a race where it accumulates);
* with ``use_private_memory``, a contraction's region whose tile has more points than
  the block threads along an axis, or which the reduction's tile loops enclose, becomes
  with them a :class:`~polyfuse.ir.gpu.Threads` (gpu_registers.py): each thread keeps a
  micro-tile of outputs in registers through the whole reduction; the block's shape is
  then the first such region's (a later one of another shape stays a thread region).

Reductions run sequentially in each thread (their loops are never coincident), or,
with ``block_reduction``, across the block's threads along x (gpu_reduction.py): then a
reduction in register form is taken out of the single-thread statements, and thread
loops around one run serially, every thread of the block taking part in each output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import takewhile

from polyfuse.ir.comprehension import IndexVar, Literal, Read
from polyfuse.ir.gpu import BlockLoops, GpuKernel, Launch, LoopRange, SingleThread, ThreadFor, Threads, walk_gpu
from polyfuse.ir.loops import (For, LoopKernel, LoopKind, LoopRewriter, Scope, Stmt, Store, map_loops, perfect_nest,
                               stmt_nodes, walk_stmts)
from polyfuse.ir.affine import max_trips
from polyfuse.scheduler.gpu_registers import tile_registers
from polyfuse.scheduler.gpu_reduction import (Reduction, TreeNames, expand_trees, holds_reduction,
                                              match_reduction, partial_slots, spread)
from polyfuse.scheduler.options import MappingOptions

# threads per block by the number of thread axes a launch uses, when the options give none
DEFAULT_BLOCK = {1: (256, 1, 1), 2: (32, 8, 1), 3: (32, 4, 2)}


MAX_VECTOR = 16     # iterations a thread takes at a time along x, at most (16 bytes)
STATIC_SHARED = 48 * 1024
# dynamic shared memory per block by architecture (CUDA's occupancy tables)
SHARED_OPTIN = {"sm_75": 64 * 1024, "sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_87": 163 * 1024,
                "sm_89": 99 * 1024, "sm_90": 227 * 1024, "sm_100": 227 * 1024, "sm_120": 99 * 1024}


@dataclass(frozen=True, slots=True)
class DeviceLimits:
    """What one launch may use on a GPU (an sm_90 device's limits by default)."""

    arch: str = "sm_90"
    max_threads: int = 1024
    max_block: tuple[int, int, int] = (1024, 1024, 64)
    max_grid: int = 2**31 - 1
    shared_bytes: int = STATIC_SHARED   # shared memory per block without asking
    shared_optin: int = 0               # with (dynamic shared memory); 0: the arch's, below

    @property
    def most_shared(self) -> int:
        """The shared memory a launch may ask for (the device's, or its architecture's)."""
        return self.shared_optin or SHARED_OPTIN.get(self.arch, self.shared_bytes)



def map_to_gpu(kernel: LoopKernel, options: MappingOptions, limits: DeviceLimits,
               zeroed: frozenset[str] = frozenset(), initialized: set[str] | None = None) -> GpuKernel:
    """The launches that run ``kernel``; a launch with no work is left out. ``zeroed``:
    outputs that start as zeros (the runtime fills them) and one statement writes, whose
    register tiles may start at zero instead of loading them; those that no launch then
    reads before the one that stores them go into ``initialized`` (the runtime need not
    fill them)."""
    taken = {b.name for b in kernel.buffers} | {s.name for s in kernel.scalars}
    launches = [_launch(group, options, limits, taken, zeroed) for group in _launch_groups(kernel.body)]
    named = tuple(replace(launch, name=f"{kernel.name}_{k}")
                  for k, launch in enumerate(x for x in launches if x is not None))
    if initialized is not None:
        initialized |= {name for name in zeroed if _stored_before_read(named, name)}
    return GpuKernel(kernel.name, kernel.buffers, kernel.scalars, named)


def _stored_before_read(launches: tuple[Launch, ...], name: str) -> bool:
    """Whether some launch stores ``name`` and neither it nor one before it reads it."""
    for launch in launches:
        stmts = list(walk_gpu(launch.body))
        if any(isinstance(e, Read) and e.tensor == name for s in stmts for e in stmt_nodes(s)):
            return False
        if any(isinstance(s, Store) and s.buffer == name for s in stmts):
            return True
    return False


def _launch_groups(body: tuple[Stmt, ...]) -> list[tuple[Stmt, ...]]:
    """A nest led by a block loop alone; runs of other statements together."""
    groups: list[tuple[Stmt, ...]] = []
    run: list[Stmt] = []
    for s in body:
        if isinstance(s, For) and s.kind is LoopKind.BLOCK:
            groups += [tuple(run)] if run else []
            groups.append((s,))
            run = []
        else:
            run.append(s)
    return groups + ([tuple(run)] if run else [])


def shared_budget(options: MappingOptions, limits: DeviceLimits) -> int:
    """Shared-memory bytes a launch may use: what the block gets without asking, or what
    the options ask for up to the device's most (above 48 KiB the launch asks for dynamic
    shared memory)."""
    return min(options.shared_memory_bytes or limits.shared_bytes, max(limits.shared_bytes, limits.most_shared))


class _Trees:
    """Reductions of one launch taken for trees while their partials fit in shared memory
    (at the widest block along x the options allow)."""

    def __init__(self, options: MappingOptions, limits: DeviceLimits) -> None:
        asked = options.block[0] if options.block else max(b[0] for b in DEFAULT_BLOCK.values())
        self.width = min(asked, limits.max_block[0], limits.max_threads)
        self.budget = shared_budget(options, limits)

    def take(self, stmts: tuple[Stmt, ...]) -> Reduction | None:
        r = match_reduction(stmts)
        need = 0 if r is None else partial_slots(self.width) * r.partial_dtype.numpy.itemsize
        if r is None or need > self.budget:
            return None
        self.budget -= need
        return r


def _launch(body: tuple[Stmt, ...], options: MappingOptions, limits: DeviceLimits,
            taken: set[str], zeroed: frozenset[str]) -> Launch | None:
    loops, inner = _block_chain(body)
    trips = math.prod(r.trips for r in loops)
    if trips == 0:
        return None
    uniform = _Uniform(_Trees(options, limits) if options.block_reduction else None,
                       _Registers(options.block, limits, taken, zeroed) if options.use_private_memory else None)
    mapped = uniform.body(inner, Scope())
    if loops:
        mapped = (BlockLoops(tuple(loops), mapped),)
    grid = min(trips, options.grid or trips, limits.max_grid)
    block = uniform.registers.block if uniform.registers and uniform.registers.block else \
        _block_shape(mapped, options, limits)
    mapped = _vectors(mapped, block[0], options.vector_width)
    mapped, partials = expand_trees(mapped, block[0], TreeNames(taken))
    return Launch("", _idle_axes(mapped, block), grid, block, partials)


def _block_chain(body: tuple[Stmt, ...]) -> tuple[list[LoopRange], tuple[Stmt, ...]]:
    """The outermost perfectly nested block loops with constant bounds, and their body."""
    loops: list[LoopRange] = []
    while len(body) == 1 and isinstance(body[0], For) and body[0].kind is LoopKind.BLOCK:
        f = body[0]
        if not (isinstance(f.lo, Literal) and isinstance(f.hi, Literal)):
            break
        lo, hi = int(f.lo.value), int(f.hi.value)
        loops.append(LoopRange(f.var, lo, f.step, max(0, -(-(hi - lo) // f.step))))
        body = f.body
    return loops, body


def _has_thread_loop(s: Stmt) -> bool:
    return any(isinstance(x, For) and x.kind is LoopKind.THREAD for x in walk_stmts((s,)))


class _Registers:
    """Register tiles of one launch: the first fixes the block's shape, later ones must
    have it."""

    def __init__(self, asked: tuple[int, ...], limits: DeviceLimits, taken: set[str],
                 zeroed: frozenset[str] = frozenset()) -> None:
        self.asked = asked
        self.limits = limits
        self.taken = taken
        self.zeroed = zeroed
        self.block: tuple[int, int, int] | None = None

    def take(self, s: For, scope: Scope) -> Threads | None:
        """``s`` as a register tile (inside the loops of ``scope``), or None."""
        tiled = tile_registers(s, lambda axes: self.asked or DEFAULT_BLOCK[axes], self.limits.max_block,
                               self.limits.max_threads, set(self.taken), self.zeroed,
                               frozenset(f.var for f in scope.loops))
        if tiled is None:
            return None
        shape = [1, 1, 1]
        for r in tiled.ranges:
            shape[r.axis] = r.threads
        if self.block not in (None, tuple(shape)):
            return None
        self.block = (shape[0], shape[1], shape[2])
        self.taken |= {v.name for r in walk_gpu((tiled,)) for v in _index_vars(r)}
        return tiled


def _index_vars(s: Stmt) -> list[IndexVar]:
    return [e for e in stmt_nodes(s) if isinstance(e, IndexVar)]


class _Uniform(LoopRewriter):
    """Maps the part of a block's body that every thread runs alike; ``trees`` takes the
    reductions to spread over the threads, ``registers`` the contractions to tile."""

    def __init__(self, trees: _Trees | None, registers: _Registers | None = None) -> None:
        self.trees = trees
        self.registers = registers

    def body(self, stmts: tuple[Stmt, ...], scope: Scope) -> tuple[Stmt, ...]:
        """Runs of statements without thread loops or reductions on one thread, a reduction
        taken for a tree spread, the rest walked into."""
        out: list[Stmt] = []
        run: list[Stmt] = []

        def flush() -> None:
            if run:
                out.append(SingleThread(serial(tuple(run))))
                run.clear()

        k = 0
        while k < len(stmts):
            s = stmts[k]
            taken = self.trees.take(stmts[k:]) if self.trees else None
            if taken is not None:
                flush()
                out += spread(taken, serial)
                k += 3
                continue
            k += 1
            if not (self.reduces(s) or _has_thread_loop(s)):
                run.append(s)
                continue
            flush()
            new = self.stmt(s, scope)
            out += new if isinstance(new, tuple) else (new,)
        flush()
        return tuple(out)

    def loop(self, s: For, scope: Scope) -> Stmt | tuple[Stmt, ...]:
        tiled = self.registers.take(s, scope) if self.registers and not self.reduces(s) else None
        if tiled is not None:
            return tiled
        if s.kind is LoopKind.THREAD and not self.reduces(s):
            return _region(s)
        return replace(s, kind=LoopKind.SERIAL, body=self.body(s.body, scope.inside(s)))

    def reduces(self, s: Stmt) -> bool:
        """Whether ``s`` holds a reduction a tree may take (its thread loops then run serially)."""
        return self.trees is not None and holds_reduction(s)


def _region(loop: For) -> Stmt:
    """A chain of thread loops: the innermost three on threads x, y, z."""
    chain = list(takewhile(lambda f: f.kind is LoopKind.THREAD, perfect_nest(loop)))
    body = serial(chain[-1].body)
    for axis, f in enumerate(reversed(chain[-3:])):
        body = (ThreadFor(f.var, f.lo, f.hi, axis, body, f.step),)
    for f in reversed(chain[:-3]):
        body = (replace(f, kind=LoopKind.SERIAL, body=body),)
    return body[0]


def serial(body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    """Every loop of ``body`` run serially."""
    return map_loops(body, lambda f: replace(f, kind=LoopKind.SERIAL)
                     if f.kind in (LoopKind.BLOCK, LoopKind.THREAD) else f)


def _block_shape(body: tuple[Stmt, ...], options: MappingOptions,
                 limits: DeviceLimits) -> tuple[int, int, int]:
    """Threads per block: the options' (or a default) along each axis a region uses, no
    more than the axis's longest loop, within the device's limits."""
    longest: dict[int, int] = {}
    for s in walk_gpu(body):
        if isinstance(s, ThreadFor):
            trips = max_trips(s.lo, s.hi, s.step)
            longest[s.axis] = max(longest.get(s.axis, 1), limits.max_block[s.axis]
                                  if trips is None else trips)
    if not longest:
        return (1, 1, 1)
    want = options.block or DEFAULT_BLOCK[max(longest) + 1]
    dims = [1, 1, 1]
    for axis, trips in longest.items():
        asked = want[axis] if axis < len(want) else 1
        dims[axis] = max(1, min(asked, trips, limits.max_block[axis]))
    while math.prod(dims) > limits.max_threads:
        k = dims.index(max(dims))
        dims[k] //= 2
    return (dims[0], dims[1], dims[2])


def _vectors(body: tuple[Stmt, ...], threads: int, width: int) -> tuple[Stmt, ...]:
    """Each thread loop along x of step 1 with ``width`` (the options' ``vector_width``)
    consecutive iterations per thread at a time, halved while a loop of known trips would
    leave threads of the block's ``threads`` along x without a group. (The thread loops
    here are the kernel's own, whose iterations are independent; the trees' loops, whose
    iteration t must run on thread t, come later.)"""
    class Vectors(LoopRewriter):
        def nested(self, s: Stmt, scope: Scope) -> Stmt | tuple[Stmt, ...]:
            if not isinstance(s, ThreadFor) or s.axis or s.step != 1:
                return super().nested(s, scope)
            trips = max_trips(s.lo, s.hi, s.step)
            w = min(MAX_VECTOR, 1 << (width.bit_length() - 1))
            while w > 1 and trips is not None and trips < w * threads:
                w //= 2
            return replace(s, vector=w)
    return Vectors().body(body, Scope()) if width > 1 else body


def _idle_axes(body: tuple[Stmt, ...], block: tuple[int, int, int]) -> tuple[Stmt, ...]:
    """Mark each region's outermost thread loop with the block's axes it does not use."""
    class Idle(LoopRewriter):
        def nested(self, s: Stmt, scope: Scope) -> Stmt | tuple[Stmt, ...]:
            if not isinstance(s, ThreadFor):
                return super().nested(s, scope)
            used = {t.axis for t in walk_gpu((s,)) if isinstance(t, ThreadFor)}
            return replace(s, idle=tuple(a for a in range(3) if a not in used and block[a] > 1))
    return Idle().body(body, Scope())
