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
A box read ``nr`` elements at a time along another dimension ``ed`` (a transposed
operand: ``B(n, k)`` of ``A·Bᵀ``, the vector loop moving ``n``) is laid out
``(ed / nr, e0, ..., el without ed, nr)``: the copy transposes it, as BLIS's packing
takes either layout of an operand, and the micro-kernel reads it contiguously.
The scalars a block broadcasts, one per jammed row (``A(k, m + j)``, ``j`` in ``0:mr``),
are packed the same way along the rows' index, in panels of ``mr`` (BLIS's packed A),
where each reduction step would read them a cache line or more from the last step's
(``Aᵀ·B``: a new line, and a new page, every step); read along a row they stay.

A read is packed at the outermost loop (the nest's top) where

* every loop from there to the read is serial with constant bounds, with no ``if``
  between them (the copy reads exactly what the nest reads: never outside the tensor);
* its indices are affine in the loops, one of them (the last, or for a transposed
  operand another) ``v + rest`` for a vector loop ``v`` of at most ``nr`` lanes (the
  widest such loop's) and a ``rest`` that moves in whole multiples of ``nr``, the others
  free of ``v``;
* all reads of that tensor in the nest share their offsets from outside the nest;
* the copy is reused: the loops that no index of the tensor uses run at least
  ``min_reuse`` times per copy (the scheduler's ``PACK_MIN_REUSE``, which its heuristics
  also count on);
* the copy is laid out otherwise than the source (a box of whole rows read as one
  panel is already contiguous, unless the panel is wider than the rows: its lanes past
  them are zeros in the copy);
* the box takes at most ``box_bytes`` (the pipeline gives the heuristics' WHOLE_BYTES),
  and a kernel's packed buffers together at most :data:`LOCAL_BYTES`; another nest's
  copy of the tensor with panels as wide and at least as large (the full tile's, in the
  other branch of a partial tile's guard; the whole reduction panels', before the last,
  shorter one) is filled again instead.

A box that is not whole panels (1000 columns in panels of 64) ends in a partial panel
whose lanes past the box are zeros; the buffers made here are marked ``panel`` so that
the next pass (:func:`widen_partial_blocks`) runs the partial register block reading them
in whole vectors.

A *constant* operand (weights: the same values on every call) is packed once instead, before
the kernel runs: every box the nest's enclosing loops visit goes into one input buffer
(a :class:`~polyfuse.ir.loops.Packing` of the operand, indexed first by those loops' tile
numbers), and the micro-kernel reads its panel there, with no copy in the kernel. This is
BLIS's and oneDNN's prepacked weights: the packing's memory traffic leaves the call, and
threads that would each pack the same panels share one copy. Boxes reaching past the
operand (a partial tile's, a partial panel's lanes) are zeros there (a ``padded``
packing), and nests whose boxes are the same read one packed input.
"""

from __future__ import annotations

import math

import numpy as np
from dataclasses import dataclass, replace

from polyfuse.ir.comprehension import Binary, BinaryOp, Expr, IndexVar, Literal, Read, ScalarRef, index_names, walk
from polyfuse.ir.affine import Affine, ConstantLoop, affine, constant_loop, max_trips, span, to_expr
from polyfuse.ir.loops import (Assign, Buffer, BufferRole, For, If, LoopKernel, LoopKind, LoopRewriter, Packing,
                               Scope, Stmt, Store, TileProduct, fresh_name, map_body_exprs,
                               walk_scoped, walk_stmts)
from polyfuse.ir.types import DType

# (one packed box at most, box_bytes: L2-resident, as large as the box of a whole
# reduction the heuristics keep untiled, their WHOLE_BYTES, which a smaller limit left to a
# copy per register block and row tile, much slower: benchmarks/LOG.md)
LOCAL_BYTES = 768 << 10    # all packed boxes of a kernel together (they live on the stack)
PREPACK_GROWTH = 2         # a prepacked operand takes at most this many times its own size

_I64 = DType.INT64


@dataclass(frozen=True)
class _Site:
    """One read of the tensor inside the nest: its index forms split at the nest's top."""

    read: Read
    path: tuple[ConstantLoop, ...]       # the nest's loops around the read, outermost first
    outer: tuple[Affine, ...]     # per index: the part fixed outside the nest
    inner: tuple[Affine, ...]     # per index: the part the nest's loops move (with constants)
    vector: ConstantLoop | None          # the vector loop moving index ``dim`` (None: a broadcast)
    dim: int                             # the index the vector loop moves (the last, unless transposed)
    # loops of the path whose trips a tile bounds but a size decides (a symbolic kernel's
    # partial tile: the path holds them at the tile's trips): variable -> trips this time
    limits: tuple[tuple[str, Expr], ...] = ()


def pack_operands(kernel: LoopKernel, constants: frozenset[str] = frozenset(), *, min_reuse: int,
                  box_bytes: int, line_bytes: int) -> LoopKernel:
    """Pack the vector-read operands of ``kernel``'s micro-kernels into local buffers; those
    named in ``constants`` (inputs whose values every call shares) into packed inputs. A
    copy is made where its elements are read at least ``min_reuse`` times."""
    packer = _Packer(kernel, constants, min_reuse, box_bytes, line_bytes)
    body = packer.body(kernel.body, Scope())
    if not packer.buffers:
        return kernel
    # packed inputs go after the kernel's inputs: calls pass every input before the outputs
    last_in = max((k for k, b in enumerate(kernel.buffers) if b.role is BufferRole.IN), default=-1)
    ins = tuple(b for b in packer.buffers if b.role is BufferRole.IN)
    buffers = kernel.buffers[:last_in + 1] + ins + kernel.buffers[last_in + 1:] + \
        tuple(b for b in packer.buffers if b.role is not BufferRole.IN)
    return replace(kernel, buffers=buffers, body=body)


class _Packer(LoopRewriter):
    def __init__(self, kernel: LoopKernel, constants: frozenset[str], min_reuse: int, box_bytes: int,
                 line_bytes: int) -> None:
        self.min_reuse = min_reuse
        self.box_bytes = box_bytes      # one packed box at most
        self.line_bytes = line_bytes
        self.inputs = {b.name: b for b in kernel.buffers if b.role is BufferRole.IN and b.shape}
        self.locals = {b.name for b in kernel.buffers if b.role is BufferRole.LOCAL}
        self.constants = constants
        self.taken = {b.name for b in kernel.buffers} | {s.name for s in kernel.scalars}
        self.buffers: list[Buffer] = []
        self.budget = LOCAL_BYTES
        self.copies: dict[str, list[Buffer]] = {}   # the local copies of each tensor

    def body(self, stmts: tuple[Stmt, ...], scope: Scope) -> tuple[Stmt, ...]:
        """``stmts`` in ``scope`` with their nests' operands packed."""
        copies: list[Stmt] = []
        if len(stmts) > 1 and all(isinstance(s, For) and s.kind is LoopKind.SERIAL for s in stmts):
            # sibling nests (full tiles and the partial one after them) share one copy of
            # what they read together; each alone may read too little of it to pay
            group, copies = self.nest(stmts, scope.loops)  # type: ignore[arg-type]
            stmts = group
        return tuple(copies) + super().body(stmts, scope)

    def loop(self, s: For, scope: Scope) -> tuple[Stmt, ...]:
        copies: list[Stmt] = []
        if s.kind is LoopKind.SERIAL or any(lp.kind is LoopKind.PARALLEL for lp in scope.loops):
            (s,), copies = self.nest((s,), scope.loops)
        return (*copies, replace(s, body=self.body(s.body, scope.inside(s))))

    def nest(self, tops: tuple[For, ...], enclosing: tuple[For, ...]) -> tuple[tuple[For, ...], list[Stmt]]:
        """The nests ``tops`` (siblings) with their packable operands read from packed
        copies, and the copies."""
        sites = _sites(tops, self.inputs)
        if sites is None:
            return tops, []
        copies: list[Stmt] = []
        for tensor in sorted(sites):
            # (an input of a symbolic kernel, whose extents are the call's, is packed per call)
            tiles = _tiles(sites[tensor], enclosing) if tensor in self.constants and self.inputs[tensor].fixed \
                else None
            packed = self.pack(tops, tensor, sites[tensor], tiles)
            if packed is not None:
                tops, copy = packed
                copies += copy
        return tops, copies

    def pack(self, tops: tuple[For, ...], tensor: str, sites: list[_Site],
             tiles: list[ConstantLoop] | None) -> tuple[tuple[For, ...], list[Stmt]] | None:
        """The nest reading ``tensor`` packed, and the copy filling the packed buffer (none
        when ``tiles``, the enclosing loops its boxes move with, prepack every box)."""
        source = self.inputs[tensor]
        rank = len(source.shape)
        if any(s.outer != sites[0].outer for s in sites):
            return None
        if all(s.vector is not None for s in sites):
            pd = sites[0].dim
            if any(s.dim != pd for s in sites) or any(
                    s.vector.var != t.vector.var for s in sites for t in sites if s.read == t.read):  # type: ignore[union-attr]
                return None
            # panels as wide as the widest vector loop: a narrower one (a partial register
            # block past the last whole one) reads the last panel, zero-padded
            # (whole vectors: a partial block alone pads its panel to them)
            width = sites[0].vector.vector  # type: ignore[union-attr]
            nr = -(-max(s.vector.trips for s in sites) // width) * width  # type: ignore[union-attr]
            element = {id(s): IndexVar(s.vector.var) for s in sites}  # type: ignore[union-attr]
        else:
            found = _jammed(sites, source, self.line_bytes)
            if found is None:
                return None
            pd, nr, element = found
        spans = [[span(s.inner[d], s.path) for s in sites] for d in range(rank)]
        lows = [min(lo for lo, _ in dim) for dim in spans]
        highs = [max(hi for _, hi in dim) for dim in spans]
        extents = [h - lo + 1 for lo, h in zip(lows, highs)]
        if any(not _panel_aligned(s, pd, nr, lows[pd], element[id(s)]) for s in sites) \
                or (extents[pd] % nr and sites[0].vector is None):
            return None
        if pd == rank - 1 and extents[-1] <= nr and tuple(extents[1:]) == tuple(source.shape[1:]) \
                and (extents[-1] == nr or not self.accumulates(tops)):
            # one panel of whole rows: the copy would be laid out as the source. One
            # narrower than its panel that a register block reads is copied still
            # (prepacked where constant), its lanes past the rows zeros, so that the
            # block runs in whole vectors (ShuffleNet's 58 channels: 3 vectors, 8 lanes
            # and 2 masked ones a step, spilling, before; a 784 x 58 x 58 matmul 55 -> 18 us)
            return None
        across = [d for d in range(rank) if d != pd]   # the box's dimensions within a panel
        fills = _fills(sites, pd, extents)
        if fills is None:
            return None
        box = (-(-extents[pd] // nr), *(extents[d] for d in across), nr)
        size = math.prod(box) * np.dtype(source.dtype.numpy).itemsize
        used = {v for s in sites for form in s.inner for v in form}
        # (a broadcast's vector loops reuse it in registers, not from the copy)
        reuse = math.prod(lp.trips for lp in _loops_of(sites) if lp.var not in used
                          and (sites[0].vector is not None or lp.vector <= 1))
        if reuse < self.min_reuse and tiles is None:
            return None
        packing = None
        if tiles is not None:
            shape = (*(lp.trips for lp in tiles), *box)
            packing = _packing(tensor, sites[0], tiles, lows, nr, len(box), pd, across)
            # every box the tile loops visit, even those an enclosing guard skips (a partial
            # last tile), is packed; where one reaches past the operand (the partial tile's,
            # a last partial panel's lanes) the packing holds zeros there
            if not packing.inside(shape, source.shape):
                packing = replace(packing, padded=True)
            if math.prod(shape) > PREPACK_GROWTH * math.prod(source.shape):
                packing = None
        if tiles is not None and packing is not None:
            # sibling nests with the same boxes (a full tile's and the partial tile's) share them
            name = next((b.name for b in self.buffers if b.packing == packing and b.shape == shape), "")
            if not name:
                name = self.fresh(f"{tensor}_prepacked")
                self.buffers.append(Buffer(name, source.dtype, shape, BufferRole.IN, packing=packing, panel=True))
            lead = [_tile_number(lp) for lp in tiles]
        elif (name := self.copy_holding(tensor, box)):
            # another nest's copy of the tensor holds this box (a full tile's and the
            # partial tile's, a whole reduction panel and the last, shorter one): one
            # buffer serves them all, each nest filling it before it runs
            lead = []
        elif size <= min(self.box_bytes, self.budget):
            self.budget -= size
            name = self.fresh(f"{tensor}_packed")
            self.buffers.append(Buffer(name, source.dtype, box, BufferRole.LOCAL, panel=True))
            self.copies.setdefault(tensor, []).append(self.buffers[-1])
            lead = []
        else:
            return None

        def packed_read(e: Expr) -> Expr:
            site = next((s for s in sites if s.read == e), None)
            if site is None:
                return e
            rest = _without(site.inner[pd], element[id(site)])
            rest = {**rest, "": rest.get("", 0) - lows[pd]}
            panel = Binary(BinaryOp.DIV, to_expr(rest), Literal(nr, _I64), _I64)
            within = [to_expr({**site.inner[d], "": site.inner[d].get("", 0) - lows[d]}) for d in across]
            return Read(name, (*lead, panel, *within, element[id(site)]), source.dtype)

        tops = tuple(replace(top, body=map_body_exprs(top.body, packed_read)) for top in tops)
        if packing is not None:
            return tops, []
        return tops, self.copy(name, source, sites[0], lows, box, extents[pd], pd, across, fills)

    def accumulates(self, tops: tuple[For, ...]) -> bool:
        """Whether the nest under ``tops`` sums into a register block (a local buffer)."""
        return any(isinstance(s, Store) and s.buffer in self.locals for s in walk_stmts(tops))

    def copy(self, name: str, source: Buffer, site: _Site, lows: list[int],
             shape: tuple[int, ...], extent: int, pd: int, across: list[int],
             fills: dict[int, Expr] | None = None) -> list[Stmt]:
        """The loops filling the packed buffer: panel, then the box's other dims, then
        the elements of a panel row (vectorized like the micro-kernel's loop); the
        ``extent`` elements along ``pd`` fill whole panels and a last, partial one, whose
        remaining lanes are zeroed. ``fills``: dims of the source that this call fills
        only partly (a symbolic kernel's partial tile), with how many of the box's
        elements along them it reads."""
        fills = fills or {}
        nr = shape[-1]
        names = [self.fresh(f"{name}_{d}") for d in range(len(shape))]
        ivs = [IndexVar(n) for n in names]
        within: list[Expr] = [ivs[0]] * len(site.outer)
        for d, iv in zip(across, ivs[1:-1]):
            within[d] = iv
        within[pd] = Binary(BinaryOp.ADD, Binary(BinaryOp.MUL, ivs[0], Literal(nr, _I64), _I64),
                                  ivs[-1], _I64)
        indices = tuple(_plus(to_expr({**outer, "": outer.get("", 0) + lo}), i)
                        for outer, lo, i in zip(site.outer, lows, within))
        value = Read(source.name, indices, source.dtype)
        vector = site.vector.vector if site.vector is not None else 1

        def nest(panels: tuple[int, int], lanes: list[tuple[int, int, Expr]]) -> Stmt:
            body: tuple[Stmt, ...] = tuple(
                For(names[-1], Literal(lo, _I64), Literal(hi, _I64), (Store(name, tuple(ivs), e),), vector=vector)
                for lo, hi, e in lanes)
            for d in reversed(range(1, len(shape) - 1)):
                hi = fills.get(across[d - 1], Literal(shape[d], _I64))
                body = (For(names[d], Literal(0, _I64), hi, body),)
            return For(names[0], Literal(panels[0], _I64), Literal(panels[1], _I64), body)

        whole, rest = divmod(extent, nr)
        out = [nest((0, whole), [(0, nr, value)])] if whole else []
        if rest:
            out.append(nest((whole, whole + 1), [(0, rest, value), (rest, nr, Literal(0.0, source.dtype))]))
        return out

    def copy_holding(self, tensor: str, box: tuple[int, ...]) -> str:
        """A local copy of ``tensor`` with panels as wide as ``box``'s that holds it, or ''.
        (A nest whose reads of a tensor are packed has none left for a nest inside it
        to pack, so no copy is refilled while a nest still reads it.)"""
        return next((b.name for b in self.copies.get(tensor, ())
                     if len(b.shape) == len(box) and b.shape[-1] == box[-1]
                     and all(n >= m for n, m in zip(b.shape, box))), "")

    def fresh(self, base: str) -> str:
        return fresh_name(base, self.taken)


def _tiles(sites: list[_Site], enclosing: tuple[For, ...]) -> list[ConstantLoop] | None:
    """The enclosing loops the sites' boxes move with (outermost first), when each has
    constant bounds (then every box they visit is one the kernel reads); else None."""
    moving = {v for form in sites[0].outer for v in form}
    tiles = [constant_loop(lp) for lp in enclosing if lp.var in moving]
    if len(tiles) != len(moving) or any(lp is None for lp in tiles):
        return None
    return tiles  # type: ignore[return-value]


def _tile_number(lp: ConstantLoop) -> Expr:
    """``(var - lo) / step``: which of its iterations loop ``lp`` is in."""
    at: Expr = IndexVar(lp.var)
    if lp.lo:
        at = Binary(BinaryOp.SUB, at, Literal(lp.lo, _I64), _I64)
    return Binary(BinaryOp.DIV, at, Literal(lp.step, _I64), _I64) if lp.step != 1 else at


def _packing(tensor: str, site: _Site, tiles: list[ConstantLoop], lows: list[int], nr: int, rank: int,
             pd: int, across: list[int]) -> Packing:
    """Element ``(t..., panel, e..., v)`` of the prepacked buffer: the box of tile
    numbers ``t`` of the loops ``tiles``, laid out as :meth:`_Packer.copy` lays out one box
    (``across``: the source dimensions of ``e``)."""
    axes = len(tiles) + rank
    offsets, coefs = [], []
    for d, form in enumerate(site.outer):
        row = [0] * axes
        offset = lows[d]
        for k, lp in enumerate(tiles):
            c = form.get(lp.var, 0)
            offset += c * lp.lo
            row[k] = c * lp.step
        if d == pd:
            row[len(tiles)] += nr
            row[axes - 1] += 1
        else:
            row[len(tiles) + 1 + across.index(d)] += 1
        offsets.append(offset)
        coefs.append(tuple(row))
    return Packing(tensor, tuple(offsets), tuple(coefs))


def _sites(tops: tuple[For, ...], inputs: dict[str, Buffer]) -> dict[str, list[_Site]] | None:
    """The reads of input tensors in the nests under ``tops`` that a packed copy could
    serve, by tensor; tensors with any other read are left out. A loop whose bounds are
    not constant (a symbolic kernel's tiles of a size) may hold a read that its variable
    does not move (the box is the same on each of its iterations, taken to be many); None
    when a nest's top loop has neither constant bounds nor other loops in it."""
    found: dict[str, list[_Site]] = {}
    rejected: set[str] = set()

    def reads_in(exprs: tuple[Expr, ...], path: tuple[ConstantLoop, ...], guarded: bool,
                 opaque: set[str], limits: tuple[tuple[str, Expr], ...]) -> None:
        for e in exprs:
            for r in walk(e):
                if isinstance(r, Read) and r.tensor in inputs:
                    site = None if guarded or any(index_names(i) & opaque for i in r.indices) \
                        else _site(r, path, limits)
                    if site is None:
                        rejected.add(r.tensor)
                    else:
                        found.setdefault(r.tensor, []).append(site)

    if any(constant_loop(top) is None and not _opaque_bounds(top) for top in tops):
        return None
    seen: dict[int, tuple[ConstantLoop | None, str]] = {}   # per loop (each seen once), _seen's

    for s, scope in walk_scoped(tops):
        views = [seen.get(id(lp)) or seen.setdefault(id(lp), _seen(lp)) for lp in scope.loops]  # type: ignore[arg-type]
        path = tuple(view for view, _ in views)
        limits = tuple((lp.var, _trips_expr(lp)) for lp, (_, how) in zip(scope.loops, views)  # type: ignore[attr-defined, arg-type]
                       if how == "bounded")
        opaque = {lp.var for lp, (_, how) in zip(scope.loops, views) if how in ("opaque", "")}  # type: ignore[attr-defined]
        if None in path or any(lp.kind is not LoopKind.SERIAL for lp in scope.loops):  # type: ignore[attr-defined]
            continue   # inside a loop whose tensors are all left out
        if isinstance(s, For):
            if s.kind is not LoopKind.SERIAL or (constant_loop(s) is None and not _opaque_bounds(s)):
                rejected.update(_tensors_in((s,)))
            else:
                reads_in((s.lo, s.hi), path, True, opaque, limits)   # type: ignore[arg-type]
        elif isinstance(s, If):
            reads_in((s.cond,), path, scope.guarded, opaque, limits)   # type: ignore[arg-type]
        elif isinstance(s, Store):
            reads_in((*s.indices, s.value), path, scope.guarded, opaque, limits)   # type: ignore[arg-type]
        elif isinstance(s, Assign):
            reads_in((s.value,), path, scope.guarded, opaque, limits)   # type: ignore[arg-type]
        elif isinstance(s, TileProduct):   # its operands are where the tiles read them
            rejected.update(_tensors_in((s,)))
    return {t: s for t, s in found.items() if t not in rejected}


UNKNOWN_TRIPS = 1 << 16   # the iterations a loop of a symbolic size's tiles is taken to run


def _seen(lp: For) -> tuple[ConstantLoop | None, str]:
    """``lp`` as the reads it holds see it, and how: ``constant`` bounds; ``bounded`` by a
    tile (:func:`_bounded`), reads may use its variable; ``opaque`` (a symbolic size's
    tiles), reads may not; or (None, ``""``), nothing under it is packed."""
    constant = constant_loop(lp)
    if constant is not None:
        return constant, "constant"
    bounded = _bounded(lp)
    if bounded is not None:
        return bounded, "bounded"
    return (_opaque(lp), "opaque") if _opaque_bounds(lp) else (None, "")


def _opaque_bounds(s: For) -> bool:
    """Whether ``s``'s bounds read the sizes of a symbolic kernel (and no memory)."""
    nodes = [n for e in (s.lo, s.hi) for n in walk(e)]
    return any(isinstance(n, ScalarRef) and n.dtype.is_int for n in nodes) and not any(isinstance(n, Read) for n in nodes)


def _opaque(lp: For) -> ConstantLoop:
    """A loop without constant bounds as the reads it holds see it (they may not use its
    variable): many iterations."""
    return ConstantLoop(lp.var, 0, UNKNOWN_TRIPS, lp.step, lp.vector)


def _fills(sites: list[_Site], pd: int, extents: list[int]) -> dict[int, Expr] | None:
    """The dims of the source the sites' loops of partial tiles (their ``limits``) move,
    each with how many of its box's elements this run reads: one such loop per dim, by
    steps of 1, not along the panels (``pd``); None otherwise."""
    limits = dict(sites[0].limits)
    if not limits:
        return {}
    if any(s.limits != sites[0].limits for s in sites):
        return None
    out: dict[int, Expr] = {}
    for d in range(len(extents)):
        moving = {v for s in sites for v in s.inner[d] if v in limits}
        if not moving:
            continue
        if d == pd or len(moving) != 1 or any(s.inner[d].get(v, 0) != 1 for s in sites for v in moving):
            return None
        (v,) = moving
        cap = next(lp.trips for lp in sites[0].path if lp.var == v)
        more = extents[d] - cap
        out[d] = limits[v] if not more else Binary(BinaryOp.ADD, limits[v], Literal(more, _I64), _I64)
    return out


def _bounded(lp: For) -> ConstantLoop | None:
    """A loop of a symbolic kernel's partial tile, ``for v in c:min(t, N - x) + 1``, as the
    reads it holds see it: a constant start and, at most, the tile's trips (step 1)."""
    if not (isinstance(lp.lo, Literal) and lp.step == 1 and _opaque_bounds(lp)):
        return None
    trips = max_trips(lp.lo, lp.hi, lp.step)
    return ConstantLoop(lp.var, int(lp.lo.value), trips, lp.step, lp.vector) if trips else None


def _trips_expr(lp: For) -> Expr:
    """The iterations of ``lp`` (step 1, a literal start) as an expression."""
    return lp.hi if lp.lo == Literal(0, _I64) else Binary(BinaryOp.SUB, lp.hi, lp.lo, _I64)


def _site(r: Read, path: tuple[ConstantLoop, ...], limits: tuple[tuple[str, Expr], ...] = ()) -> _Site | None:
    if any(r.is_checked(d) for d in range(len(r.indices))):
        return None
    forms = [affine(i) for i in r.indices]
    if any(f is None for f in forms):
        return None
    mine = {lp.var for lp in path}
    outer = tuple({v: c for v, c in f.items() if v not in mine and v} for f in forms)  # type: ignore[union-attr]
    inner = tuple({v: c for v, c in f.items() if v in mine or not v} for f in forms)  # type: ignore[union-attr]
    # the vector loop moves the last index, or (a transposed operand) another one
    for dim in (len(forms) - 1, *range(len(forms) - 1)):
        vectors = [lp for lp in path if lp.vector > 1 and lp.lo == 0 and lp.step == 1
                   and inner[dim].get(lp.var) == 1
                   and all(lp.var not in f for d, f in enumerate(inner) if d != dim)]
        if vectors and vectors[-1].trips >= 2:
            return _Site(r, path, outer, inner, vectors[-1], dim, limits)
    if any(lp.vector > 1 and all(lp.var not in f for f in inner) for lp in path):
        return _Site(r, path, outer, inner, None, -1, limits)   # a scalar a vector loop broadcasts
    return None


def _panel_aligned(site: _Site, dim: int, nr: int, low: int, element: Expr) -> bool:
    """Index ``dim`` minus the element within a panel (the vector loop, or a jammed
    row's offset) moves in whole panels (from ``low``)."""
    if site.vector is not None and site.vector.trips > nr:
        return False
    by_var = {lp.var: lp for lp in site.path}
    rest = _without(site.inner[dim], element)
    if (rest.pop("", 0) - low) % nr:
        return False
    return all((c * by_var[v].lo) % nr == 0 and (c * by_var[v].step) % nr == 0 for v, c in rest.items())


def _without(form: Affine, element: Expr) -> Affine:
    """``form`` less a panel's element: the vector loop's variable, or a literal offset."""
    if isinstance(element, IndexVar):
        return {v: c for v, c in form.items() if v != element.name}
    return {**form, "": form.get("", 0) - int(element.value)}  # type: ignore[attr-defined]



def _jammed(sites: list[_Site], source: Buffer, line_bytes: int) -> tuple[int, int, dict[int, Expr]] | None:
    """Broadcast reads of the jammed rows of a register block, ``A(k, m + j)`` for
    ``j`` in ``0:mr`` (a transposed ``A`` of ``Aᵀ·B``), as one panel dimension: the
    index where the reads differ, by the offsets ``0 .. mr-1`` only; ``mr``; and each
    read's offset. None unless the innermost reduction loop steps through the source a
    cache line or more at a time (a row apart: its reads would fall on a new line, and a
    new page, every step; reads along a row stay as they are), or the rows lie a number
    of elements apart that only the call knows (a symbolic kernel's source: each row
    would take its own address register, where the packed rows lie side by side)."""
    forms = [s.inner for s in sites]
    differ = [d for d in range(len(forms[0])) if any(f[d] != forms[0][d] for f in forms)]
    if len(differ) != 1:
        return None
    pd = differ[0]
    moving = [{v: c for v, c in f[pd].items() if v} for f in forms]
    offsets = [f[pd].get("", 0) for f in forms]
    base, mr = min(offsets), len(set(offsets))
    if any(m != moving[0] for m in moving) or set(offsets) != set(range(base, base + mr)) or mr < 2:
        return None
    # the innermost loop (of several iterations, not a vector loop) that moves the read
    inner = [lp for lp in sites[0].path if lp.vector <= 1 and lp.trips > 1 and any(lp.var in f for f in forms[0])]
    if not inner or inner[-1].var in forms[0][pd]:
        return None
    if source.fixed:
        step = sum(f.get(inner[-1].var, 0) * stride for f, stride in zip(forms[0], source.strides)) * inner[-1].step
        if abs(step) * np.dtype(source.dtype.numpy).itemsize < line_bytes:
            return None
    elif isinstance(source.strides[pd], int):
        return None   # (the rows lie a known number of elements apart: no register each)
    return pd, mr, {id(s): Literal(o - base, _I64) for s, o in zip(sites, offsets)}


def _loops_of(sites: list[_Site]) -> list[ConstantLoop]:
    """The distinct loops around the reads."""
    seen: dict[str, ConstantLoop] = {}
    for s in sites:
        for lp in s.path:
            seen.setdefault(lp.var, lp)
    return list(seen.values())


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
