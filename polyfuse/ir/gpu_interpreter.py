"""Interpreter of the GPU IR: every thread of every block, barriers included.

The oracle for the GPU mapping on machines without a GPU. Each thread is a Python
generator that runs the launch body element by element (with the loop-IR
interpreter's expression semantics) and pauses at each barrier; the threads of a block
run one after another, in a random order, from one barrier to the next, and blocks run
in a random order. A warp reduction is a meeting point too: each thread leaves its
value there and pauses, and takes its group's butterfly once all have. An asynchronous
copy reads its elements when it starts and writes them only when a wait lets its
group land, so a read before that sees the tile's old contents. Shared tiles and registers start as NaN (or a sentinel for integers), every access
is bounds-checked, and a thread that finishes while others wait at a barrier is an
error, so a missing barrier, a copy that misses part of a box or a read outside a tile
shows up as a wrong answer or an error.
"""

from __future__ import annotations

import itertools
from typing import Any
from collections.abc import Iterator, Mapping

import numpy as np

from polyfuse.errors import IRVerificationError
from polyfuse.ir.comprehension import Expr, Literal, Read, combine
from polyfuse.ir.gpu import (MMA_DEPTH, AsyncCommit, MmaNest, AsyncWait, Barrier, BlockLoops, CopyToShared, GpuKernel, Launch, Registers,
                             SharedTile, SingleThread, ThreadFor, Threads, WarpReduce, verify_gpu_kernel, walk_gpu)
from polyfuse.ir.loops import Buffer, For, If, Stmt, Store, TileProduct, numbers
from polyfuse.ir.loops_interpreter import _Interpreter


class _Thread(_Interpreter):
    def __init__(self, kernel: GpuKernel, buffers: dict[str, np.ndarray], scalars: Mapping[str, object],
                 launch: Launch, block: int, thread: tuple[int, int, int],
                 exchange: dict[tuple[int, int], Any], meets: frozenset[int] = frozenset()) -> None:
        super().__init__(kernel, buffers, scalars)  # type: ignore[arg-type]
        self.launch = launch
        self.block = block
        self.thread = thread
        bx, by, _ = launch.block
        self.flat = thread[0] + bx * (thread[1] + by * thread[2])
        self.exchange = exchange   # (warp reduction, thread) -> value, shared by the block
        self.meetings = 0          # warp reductions this thread has reached
        self.open: list[tuple[np.ndarray, tuple[int, ...], object]] = []   # copies started, not committed
        self.groups: list[list[tuple[np.ndarray, tuple[int, ...], object]]] = []  # committed, not landed
        self.idle = False          # a lane other than 0 in a warp region
        self.meets = meets         # ids of the loops that hold statements every thread takes part in

    def index(self, name: str, indices: tuple[Expr, ...]) -> tuple[int, ...]:
        return self.inside(name, tuple(int(self.eval(i)) for i in indices))

    def inside(self, name: str, where: tuple[int, ...]) -> tuple[int, ...]:
        shape = self.buffers[name].shape
        if any(not 0 <= w < n for w, n in zip(where, shape)):
            raise IRVerificationError(f"launch {self.launch.name}: thread {self.thread} of block "
                                      f"{self.block} accesses {name}{list(where)}, outside {list(shape)}")
        return where

    def eval(self, e: Expr):  # type: ignore[no-untyped-def]
        if isinstance(e, Read):
            value = self.buffers[e.tensor][self.inside(e.tensor, self.element(e))]
            return int(value) if e.dtype.is_int else e.dtype.compute.numpy.type(value)
        return super().eval(e)

    def steps(self, body: tuple[Stmt, ...]) -> Iterator[None]:
        """Run ``body``; yields at every barrier."""
        for s in body:
            if self.idle and (isinstance(s, (Store, TileProduct)) or isinstance(s, For) and id(s) not in self.meets):
                continue
            if isinstance(s, Barrier):
                yield
            elif isinstance(s, For):
                for value in range(int(self.eval(s.lo)), int(self.eval(s.hi)), s.step):
                    self.env[s.var] = value
                    yield from self.steps(s.body)
            elif isinstance(s, ThreadFor):
                if any(self.thread[a] for a in s.idle):
                    continue
                for value in thread_iterations(s, int(self.eval(s.lo)), int(self.eval(s.hi)),
                                               self.thread[s.axis], self.launch.block[s.axis]):
                    self.env[s.var] = value
                    yield from self.steps(s.body)
            elif isinstance(s, BlockLoops):
                for combination in range(self.block, s.trips, self.launch.grid):
                    for r, k in zip(s.loops, np.unravel_index(combination, [r.trips for r in s.loops])):
                        self.env[r.var] = r.lo + int(k) * r.step
                    yield from self.steps(s.body)
            elif isinstance(s, If):
                yield from self.steps(s.then if self.eval(s.cond) else s.other)
            elif isinstance(s, SingleThread):
                if self.flat == 0:
                    yield from self.steps(s.body)
            elif isinstance(s, Threads):
                for t in s.ranges:
                    self.env[t.var] = int(self.eval(t.lo)) + self.thread[t.axis] * t.step
                self.buffers.update((a.name, _poisoned(a)) for a in s.registers)
                # a warp's registers are its lane 0's here: the other lanes take part in
                # the copies and barriers only (the fragment layout is the code's affair)
                self.idle = s.warps and self.thread[0] != 0
                yield from self.steps(s.body)
                self.idle = False
            elif isinstance(s, CopyToShared):
                self.copy(s)
            elif isinstance(s, AsyncCommit):
                self.groups.append(self.open)
                self.open = []
            elif isinstance(s, AsyncWait):
                while len(self.groups) > s.pending:
                    for tile, where, landed in self.groups.pop(0):
                        tile[where] = landed
            elif isinstance(s, WarpReduce):
                meeting, self.meetings = self.meetings, self.meetings + 1
                self.exchange[meeting, self.flat] = self.env[s.var]
                yield
                self.env[s.var] = self.butterfly(s, meeting)
            elif isinstance(s, TileProduct) and s.builtin in MMA_DEPTH:
                self.tile_product(s)
            else:
                if isinstance(s, Store) and s.buffer in self.buffers:
                    self.index(s.buffer, s.indices)
                self.run((s,))

    def tile_product(self, s: TileProduct) -> None:
        """A warp's product as its nest says (``acc(r, c) = acc(r, c) + x * y`` for ``k`` in
        order, in float32), with each operand evaluated once per element rather than once
        per product."""
        nest = MmaNest.of(s)
        rows, cols, depth = s.shape

        def values(e: Expr, outer: str, extent: int) -> np.ndarray:
            out = np.empty((extent, depth), np.float32)
            for i in range(extent):
                self.env[outer] = i
                for k in range(depth):
                    self.env[nest.k] = k
                    out[i, k] = self.eval(e)
            return out

        a, b = values(nest.x, nest.r, rows), values(nest.y, nest.c, cols)
        acc = self.buffers[s.acc.tensor]
        for k in range(depth):
            acc[...] = acc + np.outer(a[:, k], b[:, k]).astype(np.float32)

    def butterfly(self, s: WarpReduce, meeting: int) -> Any:
        """This thread's value after the shuffles of ``s``: at each offset, every lane of the
        group combines its value with that of the lane the offset's bit apart (worked out
        once per group, by the first of its threads to resume)."""
        lane = self.thread[0] % s.lanes
        first = self.flat - lane
        values = self.exchange.get((meeting, -1 - first))
        if values is None:
            values = [self.exchange[meeting, first + k] for k in range(s.lanes)]
            offset = s.lanes // 2
            while offset:
                values = [self.eval(combine(s.op, Literal(values[k], s.dtype), Literal(values[k ^ offset], s.dtype),
                                            s.dtype)) for k in range(s.lanes)]
                offset //= 2
            self.exchange[meeting, -1 - first] = values
        return values[lane]

    def copy(self, s: CopyToShared) -> None:
        tile = self.buffers[s.tile]
        if s.stage is not None:
            stage = int(self.eval(s.stage))
            if not 0 <= stage < tile.shape[0]:
                raise IRVerificationError(f"launch {self.launch.name}: copy to stage {stage} of {s.tile}, "
                                          f"which has {tile.shape[0]}")
            tile = tile[stage]
        source = self.buffers[s.buffer]
        offsets = [int(self.eval(o)) for o in s.offsets]
        for flat in range(self.flat, tile.size, self.launch.threads):
            local = tuple(int(k) for k in np.unravel_index(flat, tile.shape))
            where = tuple(o + k for o, k in zip(offsets, local))
            inside = all(0 <= w < n for w, n in zip(where, source.shape))
            value: Any = source[where] if inside else 0
            if s.asynchronous:
                self.open.append((tile, local, value))
            else:
                tile[local] = value


def _meeting_loops(launch: Launch) -> frozenset[int]:
    """The ids of the launch's loops that hold a statement every thread of the block takes
    part in (which a warp's idle lanes must run too)."""
    meeting = (Barrier, CopyToShared, AsyncCommit, AsyncWait, WarpReduce)
    return frozenset(id(s) for s in walk_gpu(launch.body)
                     if isinstance(s, For) and any(isinstance(x, meeting) for x in walk_gpu(s.body)))


def _poisoned(tile: SharedTile | Registers | Buffer) -> np.ndarray:
    """An array no kernel should read before writing: NaN, or the largest integer (a
    staged tile: one per stage, the stage first)."""
    dtype = tile.dtype.numpy
    fill = np.nan if tile.dtype.is_float else (True if tile.dtype.is_bool else np.iinfo(dtype).max)
    stages = (tile.stages,) if isinstance(tile, SharedTile) and tile.stages > 1 else ()
    return np.full(stages + numbers(tile.shape), fill, dtype)


def _run_block(kernel: GpuKernel, launch: Launch, block: int, buffers: dict[str, np.ndarray],
               scalars: Mapping[str, object], rng: np.random.Generator) -> None:
    memory = dict(buffers) | {t.name: _poisoned(t) for t in launch.shared}
    bx, by, bz = launch.block
    # each thread's own view of memory: the same arrays, and registers of its own
    exchange: dict[tuple[int, int], Any] = {}
    meets = _meeting_loops(launch)
    threads = [_Thread(kernel, dict(memory), scalars, launch, block, (x, y, z), exchange, meets).steps(launch.body)
               for z, y, x in itertools.product(range(bz), range(by), range(bx))]
    active = list(range(len(threads)))
    while active:
        waiting, done = [], []
        for k in rng.permutation(active):
            try:
                next(threads[k])
                waiting.append(int(k))
            except StopIteration:
                done.append(int(k))
        if waiting and done:
            raise IRVerificationError(f"launch {launch.name}: some threads of block {block} "
                                      "finished while others wait at a barrier")
        active = waiting


def interpret_gpu_kernel(kernel: GpuKernel, args: Mapping[str, object], zeroed: set[str],
                         seed: int = 0) -> dict[str, np.ndarray]:
    """Run ``kernel`` on input arrays and scalars by name. The outputs in ``zeroed``
    start zero-filled (as the runtime fills them), the others poisoned, so an element
    the kernel fails to write shows."""
    verify_gpu_kernel(kernel)
    rng = np.random.default_rng(seed)
    buffers = {b.name: np.array(args[b.name]) if b.name in args else
               np.zeros(numbers(b.shape), b.dtype.numpy) if b.name in zeroed else _poisoned(b)
               for b in kernel.buffers}
    scalars = {s.name: args[s.name] for s in kernel.scalars}
    with np.errstate(all="ignore"):
        for launch in kernel.launches:
            for block in rng.permutation(launch.grid):
                _run_block(kernel, launch, int(block), buffers, scalars, rng)
    return {b.name: buffers[b.name] for b in kernel.buffers if b.name not in args}


def thread_iterations(s: ThreadFor, lo: int, hi: int, thread: int, threads: int) -> Iterator[int]:
    """The iterations of ``s`` (from ``lo`` to ``hi``) the thread at ``thread`` of
    ``threads`` along its axis runs, in order: one in every ``threads``, or with a
    vector of w its groups of w (every ``w threads``-th), then its one of the rest."""
    w = s.vector
    if w == 1:
        yield from range(lo + thread * s.step, hi, threads * s.step)
        return
    full = lo + max(0, hi - lo) // w * w
    for group in range(lo + thread * w, full, threads * w):
        yield from range(group, group + w)
    yield from range(full + thread, hi, threads)
