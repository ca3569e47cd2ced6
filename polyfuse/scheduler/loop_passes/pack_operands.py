"""Operand packing: a loop-IR pass (BLIS's packed panels, TVM's ``cache_read``).

A register-blocked micro-kernel reads one operand a vector at a time, one row per step
of its reduction loop: ``B(c2 + c6, c1 + c4 + c8)`` of a matmul, ``c8`` the vector loop.
The rows of a large matrix lie a power of two apart, so a panel's rows fall into a few
L1 sets and evict each other, and the micro-kernel waits on L2 for every vector. The
pass copies the box of such an operand that a loop nest reads into a ``local`` buffer
(private to each thread, on its stack), once per run of the nest, laid out in the order
the micro-kernel reads it, and rewrites the reads. For a box of extents
``(e0, ..., el)`` read ``nr`` elements at a time along ``el`` the layout is
``(el / nr, e0, ..., e(l-1), nr)``: each micro-panel is contiguous, as BLIS packs B.

A read is packed at the outermost loop (the nest's top) where

* every loop from there to the read is serial with constant bounds, with no ``if``
  between them (the copy reads exactly what the nest reads: never outside the tensor);
* its indices are affine in the loops, its last one ``v + rest`` for the vector loop
  ``v in 0:nr`` and a ``rest`` that moves in whole multiples of ``nr``;
* all reads of that tensor in the nest share their offsets from outside the nest;
* the copy is reused: the loops that no index of the tensor uses run at least
  :data:`MIN_REUSE` times per copy;
* the copy is laid out otherwise than the source (a box of whole rows read as one
  panel is already contiguous);
* the box takes at most :data:`PACK_BYTES`, and a kernel's packed buffers together at most
  :data:`LOCAL_BYTES`.
"""

from __future__ import annotations

import math

import numpy as np
from dataclasses import dataclass, replace

from polyfuse.ir.comprehension import Binary, BinaryOp, Expr, IndexVar, Literal, Read, walk
from polyfuse.ir.loops import (Assign, Buffer, BufferRole, For, If, LoopKernel, LoopKind, Stmt, Store,
                               constant_trips, fresh_name, map_body_exprs)
from polyfuse.ir.types import DType
from polyfuse.scheduler.gpu_affine import Affine, affine

PACK_BYTES = 128 << 10     # one packed box at most (L2-resident; its micro-panels fit L1)
LOCAL_BYTES = 192 << 10    # all packed boxes of a kernel together (they live on the stack)
MIN_REUSE = 4              # reads of each packed element per copy, at least

_I64 = DType.INT64


@dataclass(frozen=True)
class _Loop:
    var: str
    lo: int
    trips: int
    step: int
    vector: int

    @property
    def last(self) -> int:
        return self.lo + (self.trips - 1) * self.step


@dataclass(frozen=True)
class _Site:
    """One read of the tensor inside the nest: its index forms split at the nest's top."""

    read: Read
    path: tuple[_Loop, ...]       # the nest's loops around the read, outermost first
    outer: tuple[Affine, ...]     # per index: the part fixed outside the nest
    inner: tuple[Affine, ...]     # per index: the part the nest's loops move (with constants)
    vector: _Loop                 # the vector loop moving the last index


def pack_operands(kernel: LoopKernel) -> LoopKernel:
    """Pack the vector-read operands of ``kernel``'s micro-kernels into local buffers."""
    packer = _Packer(kernel)
    body = packer.body(kernel.body, inside_parallel=False)
    if not packer.buffers:
        return kernel
    return replace(kernel, buffers=kernel.buffers + tuple(packer.buffers), body=body)


class _Packer:
    def __init__(self, kernel: LoopKernel) -> None:
        self.inputs = {b.name: b for b in kernel.buffers if b.role is BufferRole.IN and b.shape}
        self.taken = {b.name for b in kernel.buffers} | {s.name for s in kernel.scalars}
        self.buffers: list[Buffer] = []
        self.budget = LOCAL_BYTES

    def body(self, stmts: tuple[Stmt, ...], inside_parallel: bool) -> tuple[Stmt, ...]:
        out: list[Stmt] = []
        for s in stmts:
            if isinstance(s, For):
                copies: list[Stmt] = []
                if inside_parallel or s.kind is LoopKind.SERIAL:
                    s, copies = self.nest(s)
                out += copies
                out.append(replace(s, body=self.body(s.body, inside_parallel or s.kind is LoopKind.PARALLEL)))
            elif isinstance(s, If):
                out.append(replace(s, then=self.body(s.then, inside_parallel),
                                   other=self.body(s.other, inside_parallel)))
            else:
                out.append(s)
        return tuple(out)

    def nest(self, top: For) -> tuple[For, list[Stmt]]:
        """``top`` with its packable operands read from packed copies, and the copies."""
        sites = _sites(top, self.inputs)
        if sites is None:
            return top, []
        copies: list[Stmt] = []
        for tensor in sorted(sites):
            packed = self.pack(top, tensor, sites[tensor])
            if packed is not None:
                top, copy = packed
                copies.append(copy)
        return top, copies

    def pack(self, top: For, tensor: str, sites: list[_Site]) -> tuple[For, Stmt] | None:
        source = self.inputs[tensor]
        rank = len(source.shape)
        if any(s.outer != sites[0].outer for s in sites) or any(
                s.vector.var != t.vector.var for s in sites for t in sites if s.read == t.read):
            return None
        nr = sites[0].vector.trips
        spans = [[_span(s.inner[d], s.path) for s in sites] for d in range(rank)]
        lows = [min(lo for lo, _ in dim) for dim in spans]
        highs = [max(hi for _, hi in dim) for dim in spans]
        extents = [h - lo + 1 for lo, h in zip(lows, highs)]
        if any(not _panel_aligned(s, nr, lows[-1]) for s in sites) or extents[-1] % nr:
            return None
        if extents[-1] == nr and tuple(extents[1:]) == tuple(source.shape[1:]):
            return None   # one panel of whole rows: the copy would be laid out as the source
        size = math.prod(extents) * np.dtype(source.dtype.numpy).itemsize
        used = {v for s in sites for form in s.inner for v in form}
        reuse = math.prod(lp.trips for lp in _loops_of(sites) if lp.var not in used)
        if size > min(PACK_BYTES, self.budget) or reuse < MIN_REUSE:
            return None
        self.budget -= size
        name = self.fresh(f"{tensor}_packed")
        shape = (extents[-1] // nr, *extents[:-1], nr)
        self.buffers.append(Buffer(name, source.dtype, shape, BufferRole.LOCAL))

        def packed_read(e: Expr) -> Expr:
            site = next((s for s in sites if s.read == e), None)
            if site is None:
                return e
            v = site.vector.var
            rest = {**site.inner[-1], "": site.inner[-1].get("", 0) - lows[-1]}
            rest.pop(v)
            panel = Binary(BinaryOp.DIV, _expr(rest), Literal(nr, _I64), _I64)
            within = [_expr({**f, "": f.get("", 0) - lo}) for f, lo in zip(site.inner[:-1], lows)]
            return Read(name, (panel, *within, IndexVar(v, _I64)), source.dtype)

        return replace(top, body=map_body_exprs(top.body, packed_read)), self.copy(name, source, sites[0], lows, shape, nr)

    def copy(self, name: str, source: Buffer, site: _Site, lows: list[int],
             shape: tuple[int, ...], nr: int) -> Stmt:
        """The loops filling the packed buffer: panel, then the box's leading dims, then
        the elements of a panel row (vectorized like the micro-kernel's loop)."""
        names = [self.fresh(f"{name}_{d}") for d in range(len(shape))]
        ivs = [IndexVar(n, _I64) for n in names]
        last = Binary(BinaryOp.ADD, Binary(BinaryOp.MUL, ivs[0], Literal(nr, _I64), _I64), ivs[-1], _I64)
        within = [*ivs[1:-1], last]
        indices = tuple(_plus(_expr({**outer, "": outer.get("", 0) + lo}), i)
                        for outer, lo, i in zip(site.outer, lows, within))
        stmt: Stmt = Store(name, tuple(ivs), Read(source.name, indices, source.dtype))
        for d in reversed(range(len(shape))):
            vector = site.vector.vector if d == len(shape) - 1 else 1
            stmt = For(names[d], Literal(0, _I64), Literal(shape[d], _I64), (stmt,), vector=vector)
        return stmt

    def fresh(self, base: str) -> str:
        return fresh_name(base, self.taken)


def _sites(top: For, inputs: dict[str, Buffer]) -> dict[str, list[_Site]] | None:
    """The reads of input tensors in the nest under ``top`` that a packed copy could serve,
    by tensor; tensors with any other read are left out; None when the nest has no
    constant loops."""
    found: dict[str, list[_Site]] = {}
    rejected: set[str] = set()

    def visit(s: Stmt, path: tuple[_Loop, ...], guarded: bool) -> bool:
        if isinstance(s, For):
            loop = _constant_loop(s)
            if loop is None or s.kind is not LoopKind.SERIAL:
                rejected.update(_tensors_in((s,)))
                return True
            reads_in((s.lo, s.hi), path, True)
            for inner in s.body:
                visit(inner, path + (loop,), guarded)
        elif isinstance(s, If):
            reads_in((s.cond,), path, guarded)
            for inner in (*s.then, *s.other):
                visit(inner, path, True)
        elif isinstance(s, Store):
            reads_in((*s.indices, s.value), path, guarded)
        elif isinstance(s, Assign):
            reads_in((s.value,), path, guarded)
        return True

    def reads_in(exprs: tuple[Expr, ...], path: tuple[_Loop, ...], guarded: bool) -> None:
        for e in exprs:
            for r in walk(e):
                if isinstance(r, Read) and r.tensor in inputs:
                    site = None if guarded else _site(r, path)
                    if site is None:
                        rejected.add(r.tensor)
                    else:
                        found.setdefault(r.tensor, []).append(site)

    if _constant_loop(top) is None:
        return None
    visit(top, (), False)
    return {t: s for t, s in found.items() if t not in rejected}


def _site(r: Read, path: tuple[_Loop, ...]) -> _Site | None:
    if any(r.is_checked(d) for d in range(len(r.indices))):
        return None
    forms = [affine(i) for i in r.indices]
    if any(f is None for f in forms):
        return None
    mine = {lp.var for lp in path}
    outer = tuple({v: c for v, c in f.items() if v not in mine and v} for f in forms)  # type: ignore[union-attr]
    inner = tuple({v: c for v, c in f.items() if v in mine or not v} for f in forms)  # type: ignore[union-attr]
    vectors = [lp for lp in path if lp.vector > 1 and lp.lo == 0 and lp.step == 1
               and inner[-1].get(lp.var) == 1 and all(lp.var not in f for f in inner[:-1])]
    if not vectors or vectors[-1].trips < 2:
        return None
    return _Site(r, path, outer, inner, vectors[-1])


def _panel_aligned(site: _Site, nr: int, low: int) -> bool:
    """The last index minus the vector loop moves in whole panels (from ``low``)."""
    if site.vector.trips != nr:
        return False
    by_var = {lp.var: lp for lp in site.path}
    rest = {v: c for v, c in site.inner[-1].items() if v != site.vector.var}
    if (rest.pop("", 0) - low) % nr:
        return False
    return all((c * by_var[v].lo) % nr == 0 and (c * by_var[v].step) % nr == 0 for v, c in rest.items())


def _span(form: Affine, path: tuple[_Loop, ...]) -> tuple[int, int]:
    """The least and greatest value of ``form`` over the loops of ``path``."""
    by_var = {lp.var: lp for lp in path}
    lo = hi = form.get("", 0)
    for v, c in form.items():
        if v:
            ends = (c * by_var[v].lo, c * by_var[v].last)
            lo, hi = lo + min(ends), hi + max(ends)
    return lo, hi


def _loops_of(sites: list[_Site]) -> list[_Loop]:
    """The distinct loops around the reads."""
    seen: dict[str, _Loop] = {}
    for s in sites:
        for lp in s.path:
            seen.setdefault(lp.var, lp)
    return list(seen.values())


def _constant_loop(s: For) -> _Loop | None:
    trips = constant_trips(s)
    return _Loop(s.var, int(s.lo.value), trips, s.step, s.vector) if trips else None  # type: ignore[attr-defined]


def _tensors_in(body: tuple[Stmt, ...]) -> set[str]:
    names: set[str] = set()

    def visit(e: Expr) -> Expr:
        if isinstance(e, Read):
            names.add(e.tensor)
        return e
    map_body_exprs(body, visit)
    return names


def _plus(a: Expr, b: Expr) -> Expr:
    if isinstance(a, Literal) and a.value == 0:
        return b
    return Binary(BinaryOp.ADD, a, b, _I64)


def _expr(form: Affine) -> Expr:
    """An int64 expression of an affine form."""
    out: Expr | None = None
    for v in sorted(k for k in form if k):
        term: Expr = IndexVar(v, _I64)
        if form[v] != 1:
            term = Binary(BinaryOp.MUL, Literal(form[v], _I64), term, _I64)
        out = term if out is None else Binary(BinaryOp.ADD, out, term, _I64)
    const = form.get("", 0)
    if out is None:
        return Literal(const, _I64)
    return Binary(BinaryOp.ADD, out, Literal(const, _I64), _I64) if const else out
