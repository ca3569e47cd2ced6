"""GPU loop IR: a loop kernel mapped onto CUDA launches.

A :class:`GpuKernel` has the buffers and scalars of its loop kernel and a sequence of
:class:`Launch` es that run in order on one stream. A launch's body is loop IR plus
the statements below:

* :class:`BlockLoops`: perfectly nested loops with constant bounds whose iteration
  combinations are spread over the grid (one combination per block at a time; blocks
  stride over the rest, so any grid size is correct);
* :class:`ThreadFor`: a loop spread over the block's threads along one axis (thread
  ``t`` runs iterations ``t, t + blockDim, ...``);
* :class:`SingleThread`: statements run by thread (0, 0, 0) of the block only;
* :class:`CopyToShared`: every thread of the block copies part of a box of a global
  buffer into a shared-memory tile (zeros outside the buffer);
* :class:`Barrier`: ``__syncthreads()``.

Everything outside thread loops and single-thread statements is *uniform*: every
thread of a block runs it alike, which is where barriers may stand. A read of a
shared tile is a ``Read`` of the tile's name, indexed within the tile.

``str(kernel)`` prints it, e.g.::

    gpu kernel mm(in float32(64, 64) A, in float32(64, 64) B, out float32(64, 64) C) {
      launch mm_0 grid 4 block 32x8 shared A_s0 float32(32, 32), B_s1 float32(32, 32) {
        blocks c0 in 0:64 step 32, c1 in 0:64 step 32 {
          for c2 in 0:64 step 32 {
            copy A_s0 <- A(c0, c2)
            ...
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from polyfuse.ir.comprehension import Expr, ScalarDecl, map_expr
from polyfuse.ir.loops import Buffer, Stmt, format_body, format_loop_expr, map_body_exprs, walk_stmts
from polyfuse.ir.types import DType

ExprMap = Callable[[Expr], Expr]

AXES = "xyz"


@dataclass(frozen=True, slots=True)
class LoopRange:
    """One loop of a :class:`BlockLoops`: ``var`` runs ``lo, lo + step, ...`` ``trips`` times."""

    var: str
    lo: int
    step: int
    trips: int


@dataclass(frozen=True, slots=True)
class BlockLoops(Stmt):
    """Loops run by blocks; the last loop varies fastest across consecutive blocks."""

    loops: tuple[LoopRange, ...]
    body: tuple[Stmt, ...]

    @property
    def trips(self) -> int:
        return math.prod(r.trips for r in self.loops)

    def map_exprs(self, fn: ExprMap) -> BlockLoops:
        return replace(self, body=map_body_exprs(self.body, fn))

    def exprs(self) -> tuple[Expr, ...]:
        return ()

    def format_lines(self, indent: str) -> list[str]:
        ranges = ", ".join(f"{r.var} in {r.lo}:{r.lo + r.trips * r.step}"
                           + (f" step {r.step}" if r.step != 1 else "") for r in self.loops)
        return [f"{indent}blocks {ranges} {{", *format_body(self.body, indent + "  "), f"{indent}}}"]


@dataclass(frozen=True, slots=True)
class ThreadFor(Stmt):
    """``for var in lo:hi step s`` with iteration k run by thread k mod blockDim[axis].

    ``idle`` lists the axes along which only thread 0 takes part (the outermost loop of
    a region that does not use every axis of the block's threads)."""

    var: str
    lo: Expr
    hi: Expr
    axis: int
    body: tuple[Stmt, ...]
    step: int = 1
    idle: tuple[int, ...] = ()

    def map_exprs(self, fn: ExprMap) -> ThreadFor:
        return replace(self, lo=map_expr(self.lo, fn), hi=map_expr(self.hi, fn),
                       body=map_body_exprs(self.body, fn))

    def exprs(self) -> tuple[Expr, ...]:
        return (self.lo, self.hi)

    def format_lines(self, indent: str) -> list[str]:
        step = f" step {self.step}" if self.step != 1 else ""
        idle = f" where {' and '.join(f'{AXES[a]} = 0' for a in self.idle)}" if self.idle else ""
        head = f"{indent}thread.{AXES[self.axis]} for {self.var} in " \
               f"{format_loop_expr(self.lo)}:{format_loop_expr(self.hi)}{step}{idle} {{"
        return [head, *format_body(self.body, indent + "  "), f"{indent}}}"]


@dataclass(frozen=True, slots=True)
class SingleThread(Stmt):
    body: tuple[Stmt, ...]

    def map_exprs(self, fn: ExprMap) -> SingleThread:
        return replace(self, body=map_body_exprs(self.body, fn))

    def exprs(self) -> tuple[Expr, ...]:
        return ()

    def format_lines(self, indent: str) -> list[str]:
        return [f"{indent}single thread {{", *format_body(self.body, indent + "  "), f"{indent}}}"]


@dataclass(frozen=True, slots=True)
class Barrier(Stmt):
    def map_exprs(self, fn: ExprMap) -> Barrier:
        return self

    def exprs(self) -> tuple[Expr, ...]:
        return ()

    def format_lines(self, indent: str) -> list[str]:
        return [f"{indent}barrier"]


@dataclass(frozen=True, slots=True)
class SharedTile:
    """A block's copy of a box of ``buffer``, in the buffer's storage type."""

    name: str
    buffer: str
    dtype: DType
    shape: tuple[int, ...]

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def strides(self) -> tuple[int, ...]:
        """Row-major element strides; an even last extent is padded by one, so threads
        reading down a column (``B(n, k)`` along ``n``) hit different memory banks."""
        out, step = [], 1
        for k, extent in enumerate(reversed(self.shape)):
            out.append(step)
            step *= extent + (1 if k == 0 and len(self.shape) > 1 and extent % 2 == 0 else 0)
        return tuple(reversed(out))

    @property
    def size(self) -> int:
        """Elements allocated, padding included."""
        return self.shape[0] * self.strides[0] if self.shape else 1

    @property
    def bytes(self) -> int:
        return self.size * self.dtype.numpy.itemsize

    def __str__(self) -> str:
        return f"{self.name} {self.dtype}({', '.join(map(str, self.shape))})"


@dataclass(frozen=True, slots=True)
class CopyToShared(Stmt):
    """Tile element ``t`` becomes ``buffer(offsets + t)``, or 0 outside the buffer."""

    tile: str
    buffer: str
    offsets: tuple[Expr, ...]

    def map_exprs(self, fn: ExprMap) -> CopyToShared:
        return replace(self, offsets=tuple(map_expr(o, fn) for o in self.offsets))

    def exprs(self) -> tuple[Expr, ...]:
        return self.offsets

    def format_lines(self, indent: str) -> list[str]:
        return [f"{indent}copy {self.tile} <- {self.buffer}"
                f"({', '.join(format_loop_expr(o) for o in self.offsets)})"]


@dataclass(frozen=True, slots=True)
class Launch:
    """One ``__global__`` function and how it is launched: ``grid`` blocks (along x) of
    ``block`` threads (x, y, z)."""

    name: str
    body: tuple[Stmt, ...]
    grid: int
    block: tuple[int, int, int]
    shared: tuple[SharedTile, ...] = ()

    @property
    def threads(self) -> int:
        return math.prod(self.block)

    @property
    def shared_bytes(self) -> int:
        return sum(t.bytes for t in self.shared)

    def tile(self, name: str) -> SharedTile | None:
        return next((t for t in self.shared if t.name == name), None)

    def __str__(self) -> str:
        shared = f" shared {', '.join(map(str, self.shared))}" if self.shared else ""
        head = f"launch {self.name} grid {self.grid} block {'x'.join(map(str, self.block))}{shared} {{"
        return "\n".join([head, *format_body(self.body, "  "), "}"])


@dataclass(frozen=True, slots=True)
class GpuKernel:
    name: str
    buffers: tuple[Buffer, ...]
    scalars: tuple[ScalarDecl, ...]
    launches: tuple[Launch, ...]

    def buffer(self, name: str) -> Buffer:
        return next(b for b in self.buffers if b.name == name)

    def __str__(self) -> str:
        params = [str(b) for b in self.buffers] + [f"{s.dtype} {s.name}" for s in self.scalars]
        launches = [("  " + line) for launch in self.launches for line in str(launch).splitlines()]
        return "\n".join([f"gpu kernel {self.name}({', '.join(params)}) {{", *launches, "}"])


def walk_gpu(body: tuple[Stmt, ...]) -> Iterator[Stmt]:
    """Every statement of a launch body, outer before inner (:func:`walk_stmts`, which
    walks into the GPU IR's statements that hold a body)."""
    return walk_stmts(body)
