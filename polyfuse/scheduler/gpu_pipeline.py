"""Pipelined copies: the shared tiles of a reduction loop filled ``stages - 1`` steps ahead.

Barrier placement leaves a contraction's reduction loop as::

    for k in lo:hi step s {
      copy A_s <- A(.., k)   copy B_s <- B(k, ..)   barrier
      products reading A_s, B_s
      barrier
    }

so the block waits for each step's copies before its products, and the memory system
idles while they run. With ``stages`` = S > 1 (and a device with ``cp.async``, sm_80
on) each tile holds S boxes, and the copies run S - 1 steps ahead, asynchronously::

    (before the loop, for p in 0 .. S-2)  if lo + p*s < hi { copy async A_s[p] <- A(.., lo + p*s) ... }  commit
    for k in lo:hi step s {
      if k + (S-1)*s < hi { copy async A_s[(i + S-1) % S] <- A(.., k + (S-1)*s) ... }
      commit
      wait copies (S - 1 in flight)      -- this step's group has landed
      barrier                            -- and the other threads' too
      products reading A_s[i % S], B_s[i % S]          (i = (k - lo) / s)
      barrier                            -- before the next step's copies overwrite stage i % S
    }

Every thread commits one group per step, empty ones included, so "S - 1 in flight"
always means "up to this step". A loop is pipelined when its body is exactly that
shape, its tiles are read nowhere else, are of 2-, 4- or 8-byte elements (2-byte ones
go asynchronously 16 bytes at a time only, where rows allow; elsewhere the copy lands at
once, which the next stage's buffer allows), and S copies of them (fewer stages, down to
2, where they do not fit) fit in the shared-memory budget.
"""

from __future__ import annotations

import re
from dataclasses import replace

from polyfuse.ir.comprehension import Binary, BinaryOp, Expr, IndexVar, Literal, Read
from polyfuse.ir.affine import affine, combine, normal_form, to_expr
from polyfuse.ir.gpu import AsyncCommit, AsyncWait, Barrier, CopyToShared, GpuKernel, Launch, SharedTile
from polyfuse.ir.loops import For, If, LoopKind, LoopRewriter, Scope, Stmt, map_body_exprs, stmt_nodes, walk_stmts
from polyfuse.ir.types import DType

ASYNC_ARCH = 80   # cp.async: sm_80 and later


def pipeline_copies(kernel: GpuKernel, stages: int, budget: int, arch: str) -> GpuKernel:
    """``kernel`` with the copies of its reduction loops ``stages`` deep (see above)."""
    if stages < 2 or int(re.sub(r"\D", "", arch) or 0) < ASYNC_ARCH:
        return kernel
    return replace(kernel, launches=tuple(_launch(launch, stages, budget) for launch in kernel.launches))


def _launch(launch: Launch, stages: int, budget: int) -> Launch:
    tiles = {t.name: t for t in launch.shared}
    staged: dict[str, int] = {}

    class Pipeline(LoopRewriter):
        def loop(self, s: For, scope: Scope) -> Stmt | tuple[Stmt, ...]:
            copies = _pattern(s, launch)
            if copies is None:
                return super().loop(s, scope)
            names = {c.tile for c in copies}
            extra = sum(tiles[n].bytes for n in names)
            depth = stages
            while depth > 1 and launch.shared_bytes + sum(tiles[n].bytes * (k - 1) for n, k in staged.items()) \
                    + extra * (depth - 1) > budget:
                depth -= 1
            if depth < 2:
                return super().loop(s, scope)
            staged.update(dict.fromkeys(names, depth))
            return _pipelined(s, copies, names, depth)

    body = Pipeline().body(launch.body, Scope())
    shared = tuple(replace(t, stages=staged[t.name]) if t.name in staged else t for t in launch.shared)
    return replace(launch, body=body, shared=shared)


def _pattern(f: For, launch: Launch) -> tuple[CopyToShared, ...] | None:
    """The copies that start ``f``'s body, where the body is copies, a barrier, products
    and a barrier, and its tiles can be staged."""
    body = f.body
    n = next((k for k, s in enumerate(body) if not isinstance(s, CopyToShared)), len(body))
    copies = tuple(s for s in body[:n] if isinstance(s, CopyToShared))
    if f.kind is not LoopKind.SERIAL or not copies or len(body) < n + 3 or not isinstance(body[n], Barrier) \
            or not isinstance(body[-1], Barrier):
        return None
    if any(isinstance(s, (CopyToShared, Barrier, AsyncCommit, AsyncWait)) for s in walk_stmts(body[n + 1:-1])):
        return None
    if len({c.tile for c in copies}) != len(copies):
        return None
    for c in copies:
        tile = launch.tile(c.tile)
        if tile is None or tile.stages != 1 or tile.dtype.numpy.itemsize not in (2, 4, 8) \
                or c.stage is not None or c.asynchronous or _read_outside(launch, f, tile):
            return None
    return copies


def _read_outside(launch: Launch, f: For, tile: SharedTile) -> bool:
    """Whether the launch touches ``tile`` anywhere but in ``f``."""
    inside = {id(s) for s in walk_stmts((f,))}
    for s in walk_stmts(launch.body):
        if id(s) in inside:
            continue
        if isinstance(s, CopyToShared) and s.tile == tile.name:
            return True
        if any(isinstance(e, Read) and e.tensor == tile.name for e in stmt_nodes(s)):
            return True
    return False


def _int(value: int) -> Literal:
    return Literal(value, DType.INT64)


def _add(a: Expr, b: int) -> Expr:
    """``a + b``, folded where ``a`` is affine."""
    return normal_form(Binary(BinaryOp.ADD, a, _int(b), DType.INT64))


def _guarded(a: Expr, hi: Expr, then: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    """``then`` where ``a < hi``: as it is, or not at all, where both are constants."""
    if isinstance(a, Literal) and isinstance(hi, Literal):
        return then if a.value < hi.value else ()
    return (If(Binary(BinaryOp.LT, a, hi, DType.BOOL), then),)


def _pipelined(f: For, copies: tuple[CopyToShared, ...], names: set[str], depth: int) -> tuple[Stmt, ...]:
    k = IndexVar(f.var)
    lo = affine(f.lo)
    since = to_expr(combine({f.var: 1}, lo, -1)) if lo is not None else Binary(BinaryOp.SUB, k, f.lo, DType.INT64)
    index = since if f.step == 1 else Binary(BinaryOp.DIV, since, _int(f.step), DType.INT64)

    def stage(offset: int) -> Expr:
        return Binary(BinaryOp.MOD, _add(index, offset) if offset else index, _int(depth), DType.INT64)

    def at(value: Expr, where: Expr) -> tuple[Stmt, ...]:
        """The copies of the step where ``k`` is ``value``, to stage ``where``."""
        def bind(e: Expr) -> Expr:
            return value if isinstance(e, IndexVar) and e.name == f.var else e
        return tuple(replace(c.map_exprs(bind), stage=where, asynchronous=True)
                     for c in copies)

    prologue: list[Stmt] = []
    for p in range(depth - 1):
        start = _add(f.lo, p * f.step)
        prologue += [*_guarded(start, f.hi, at(start, _int(p))), AsyncCommit()]

    def staged_reads(e: Expr) -> Expr:
        if isinstance(e, Read) and e.tensor in names:
            return replace(e, indices=(stage(0), *e.indices))
        return e

    n = len(copies)
    products = map_body_exprs(f.body[n + 1:-1], staged_reads)
    ahead = _add(k, (depth - 1) * f.step)
    body = (*_guarded(ahead, f.hi, at(ahead, stage(depth - 1))),
            AsyncCommit(), AsyncWait(depth - 1), Barrier(), *products, Barrier())
    return (*prologue, replace(f, body=body))
