"""Consecutive launches over the same blocks, fused into one.

Launches run one after another so that every block of the first has finished before any
block of the second reads what it wrote. Where two consecutive launches have the same
block loops and the same block shape, and each block of the second touches only data
its own block of the first wrote (and writes only data no other block of the first
touches), nothing crosses between blocks: the second launch's body can run in the
same block right after the first's, and the barrier placement (which runs later) puts
``__syncthreads()`` where the block's threads hand each other data. The split-k sum of
a contraction and the bias and activation after it (three launches) become one that
way, as do the elementwise launches a fusion-less schedule leaves after a reduction.

A buffer that one launch writes and the other touches is *owned by the block* when at
every access, in both launches, each block loop's variable ``v`` (step ``s``) indexes the
same dimension as ``v + r`` with ``r`` an affine expression of the loops inside the
block whose values lie in ``[0, s)``: a block's box of the buffer, disjoint from every
other block's. Launches with register tiles (:class:`~polyfuse.ir.gpu.Threads`) are
left to the epilogue fusion, which keeps the values in registers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from polyfuse.ir.affine import affine, to_expr, variables
from polyfuse.ir.comprehension import Expr, Read, index_names
from polyfuse.ir.gpu import BlockLoops, GpuKernel, Launch, LoopRange, Threads, walk_gpu
from polyfuse.ir.loops import Interval, Stmt, Store, interval, stmt_nodes, walk_scoped


@dataclass(frozen=True, slots=True)
class _Access:
    buffer: str
    indices: tuple[Expr, ...]
    write: bool
    env: dict[str, Interval]   # the ranges of the loops around it inside the blocks


def fuse_launches(kernel: GpuKernel) -> GpuKernel:
    """``kernel`` with each launch that may run in the blocks of the one before it joined
    to it (see the module docstring); the launches renumbered."""
    return join_consecutive(kernel, _fused)


def join_consecutive(kernel: GpuKernel, join: Callable[[Launch, Launch], Launch | None]) -> GpuKernel:
    """``kernel`` with each launch that ``join`` joins to the (joined) one before it
    replaced by what it returns (None: kept apart); the launches renumbered."""
    launches: list[Launch] = []
    for launch in kernel.launches:
        joined = join(launches[-1], launch) if launches else None
        if joined is None:
            launches.append(launch)
        else:
            launches[-1] = joined
    if len(launches) == len(kernel.launches):
        return kernel
    return replace(kernel, launches=tuple(replace(x, name=f"{kernel.name}_{k}") for k, x in enumerate(launches)))


def _fused(first: Launch, second: Launch) -> Launch | None:
    a, b = _block_loops(first), _block_loops(second)
    if a is None or b is None or a.loops != b.loops or first.block != second.block \
            or any(isinstance(s, Threads) for s in walk_gpu(first.body + second.body)):
        return None
    tiles = {t.name for t in first.shared + second.shared}
    one, two = list(_accesses(a.body, a.ranges)), list(_accesses(b.body, a.ranges))
    written = {x.buffer for x in one if x.write}, {x.buffer for x in two if x.write}
    touched = {x.buffer for x in one}, {x.buffer for x in two}
    crossing = ((written[0] & touched[1]) | (written[1] & touched[0])) - tiles
    boxes: dict[str, tuple[int, ...]] = {}
    for x in one + two:
        if x.buffer not in crossing:
            continue
        box = _box(x, a.loops)
        if box is None or boxes.setdefault(x.buffer, box) != box:
            return None
    return replace(first, body=(replace(a, body=a.body + b.body),), grid=max(first.grid, second.grid),
                   shared=first.shared + second.shared)


def _block_loops(launch: Launch) -> BlockLoops | None:
    body = launch.body
    return body[0] if len(body) == 1 and isinstance(body[0], BlockLoops) else None


def _accesses(body: tuple[Stmt, ...], blocks: dict[str, Interval]) -> Iterator[_Access]:
    """Every read and store of ``body`` with the ranges of the loops around it (the block
    loops' from ``blocks``)."""
    for s, scope in walk_scoped(body):
        env = scope.ranges(blocks)
        for e in stmt_nodes(s):
            if isinstance(e, Read):
                yield _Access(e.tensor, e.indices, False, env)
        if isinstance(s, Store):
            yield _Access(s.buffer, s.indices, True, env)


def _box(x: _Access, loops: tuple[LoopRange, ...]) -> tuple[int, ...] | None:
    """The dimension each block loop's variable indexes at ``x`` as ``v + r`` with ``r`` in
    ``[0, step)``; None where some block loop has none, or a block variable appears
    elsewhere."""
    block_vars = {r.var for r in loops}
    forms = [affine(i) for i in x.indices]
    if any(form is None and block_vars & index_names(i) for form, i in zip(forms, x.indices)):
        return None
    dims = []
    for r in loops:
        found = None
        for d, form in enumerate(forms):
            if form is None or form.get(r.var, 0) == 0:
                continue
            rest = {v: c for v, c in form.items() if v != r.var}
            span = interval(to_expr(rest), x.env)
            if found is not None or form[r.var] != 1 or block_vars & variables(rest) or span is None \
                    or span[0] < 0 or span[1] >= r.step:
                return None
            found = d
        if found is None:
            return None
        dims.append(found)
    return tuple(dims)
