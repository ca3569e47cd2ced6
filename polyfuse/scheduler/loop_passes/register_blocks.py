"""Keep a micro-kernel's accumulators in registers across its reduction: a loop-IR pass.

After unroll-and-jam a register block reads::

    for c12 in 0:8 { for c13 in 0:3 {            # reduction loops
      for c16 in 0:7 step 7 {                    # one-iteration block loop
        for c17 in 0:32 vectorize(16) {          # the block's columns
          T(r, c16, c17) = T(r, c16, c17) + P(...) * W(...)
          T(r, c16 + 1, c17) = T(r, c16 + 1, c17) + ...    # the jammed rows
    } } } }

Each step loads and stores every accumulator unless LLVM proves the stores private to
the block and hoists them, which it gives up on when the reduction loops hold many
memory accesses (a 3x3 window unrolled) or when its own unrolling leaves a short loop
innermost. This pass hoists them itself: the block's elements go to a ``local`` array
``acc`` (one row per jammed statement) before the reduction, the reduction updates
``acc``, and ``acc`` is stored back after it::

    for c16 .. { for c17 .. vectorize(16) { acc(0, c17) = T(r, c16, c17); ... } }
    for c12 .. { for c13 .. { for c16 .. { for c17 .. vectorize(16) {
      acc(0, c17) = acc(0, c17) + P(...) * W(...); ... } } } }
    for c16 .. { for c17 .. vectorize(16) { T(r, c16, c17) = acc(0, c17); ... } }

Once the column loop is vectorized and unrolled, every ``acc`` access has a constant
offset and LLVM's SROA turns the array into vector registers that live across the whole
reduction. The array holds the compute type (float32 for 16-bit floats), so a half
precision sum is rounded once, as the reference interpreter rounds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from polyfuse.ir.comprehension import Binary, BinaryOp, Call, Expr, IndexVar, Literal, Read, map_expr, walk
from polyfuse.ir.affine import affine, constant_loop, linear, linear_sum, max_trips, span
from polyfuse.ir.loops import (Buffer, BufferRole, For, LoopKernel, LoopKind, LoopRewriter, Scope, Stmt, Store,
                               constant_trips, fresh_name, map_body_exprs, perfect_nest, stmt_nodes, walk_scoped,
                               walk_stmts)
from polyfuse.ir.types import DType

MAX_ACCUMULATORS = 32 * 16  # elements of a block (32 vector registers of 16 floats)
# Narrower vector loops are left to LLVM: on an x86 CPU whose registers are wider than the
# loop's vectors, its SLP vectorizer merges the copies in and out of ``acc`` into wider
# vectors than the reduction's, and the shuffles between them keep the multiplies and
# adds from fusing into FMAs.
MIN_VECTOR = 8

_I64 = DType.INT64


def promote_register_blocks(kernel: LoopKernel, zeroed: frozenset[str] = frozenset(),
                            initialized: set[str] | None = None) -> LoopKernel:
    """Hoist the accumulator loads and stores of each register block out of its
    reduction loops into a ``local`` array (``acc``, ``acc2``, ...).

    ``zeroed`` names outputs that start as zeros (a ``+=!``'s, the runtime fills them)
    and that one statement writes: a block summing the whole reduction into one (no
    reduction tile around it, nothing beside it or beside a loop around it storing the
    output) starts its accumulators at zero and stores them. Those outputs whose initial zeros the kernel then never reads go into
    ``initialized``: the runtime need not fill them."""
    taken = {b.name for b in kernel.buffers} | {s.name for s in kernel.scalars}
    buffers: list[Buffer] = []
    from_zero: set[str] = set()   # outputs some block started at zero
    loaded: set[str] = set()      # outputs some block (or plain store) loads from memory

    class Promote(LoopRewriter):
        shared: frozenset[str] = frozenset()

        def body(self, stmts: tuple[Stmt, ...], scope: Scope) -> tuple[Stmt, ...]:
            # outputs that several statements of a body may store in the same elements (a
            # reduction split into full and partial tiles): each block may sum only part of
            # an element, so none starts at zero. Full and partial tiles of an output's rows
            # store apart, and start at zero as before the split.
            stored: dict[str, list[Stmt]] = {}
            for s in stmts:
                for b in {t.buffer for t in walk_stmts((s,)) if isinstance(t, Store)}:
                    stored.setdefault(b, []).append(s)
            outer = self.shared
            self.shared = outer | {b for b, ss in stored.items()
                                   if any(not _apart(x, y, b) and not _split_apart(x, y, b)
                                          for k, x in enumerate(ss) for y in ss[k + 1:])}
            try:
                return super().body(stmts, scope)
            finally:
                self.shared = outer

        def loop(self, s: For, scope: Scope) -> Stmt | tuple[Stmt, ...]:
            block = _block(s, kernel) if s.kind is LoopKind.SERIAL else None
            if block is None:
                pieces = _pieces_outside(s) if s.kind is LoopKind.SERIAL else None
                # (each piece, as a statement of this body: neither a block nor pieces itself)
                return super().loop(s, scope) if pieces is None else super().body(pieces, scope)
            target = block[2][0].buffer
            used = {n.name for st in block[2] for i in st.indices for n in walk(i) if isinstance(n, IndexVar)}
            zero = target in zeroed and target not in self.shared and all(lp.var in used for lp in scope.loops)
            (from_zero if zero else loaded).add(target)
            buf, stmts = _promote(s, block, fresh_name("acc", taken), kernel, zero)
            buffers.append(buf)
            return tuple(stmts)

    body = Promote().body(kernel.body, Scope())
    if not buffers:
        return kernel
    if initialized is not None:
        initialized |= {t for t in from_zero - loaded if not _reads_before_written(body, t)}
    return replace(kernel, buffers=kernel.buffers + tuple(buffers), body=body)


def _apart(x: Stmt, y: Stmt, buffer: str) -> bool:
    """Whether statements ``x`` and ``y`` store ``buffer`` in different elements: along
    some index both store it at the same offset from outside plus ranges, over their own
    loops, that do not meet (the rows of full tiles and of the partial one after them)."""
    rx, ry = _region(x, buffer), _region(y, buffer)
    return rx is not None and ry is not None and any(
        ox == oy and (hx < ly or hy < lx) for (ox, (lx, hx)), (oy, (ly, hy)) in zip(rx, ry))


def _split_apart(x: Stmt, y: Stmt, buffer: str) -> bool:
    """Whether ``x`` and ``y`` are the full and the partial tiles of one loop
    (``separate_full_tiles`` of a symbolic kernel: one variable and step, ``x`` from 0
    to a multiple of the step, ``y`` from there on) whose iterations store ``buffer`` in
    their own rows: along some index, every store under either is the same terms of the
    loops outside, plus the variable, plus offsets over the loops inside, from 0 to
    below the step (under ``x``; at least 0 under ``y``). Then ``x``'s rows end where
    ``y``'s start."""
    if not (isinstance(x, For) and isinstance(y, For) and x.var == y.var and x.step == y.step
            and x.hi == y.lo and x.lo == Literal(0, _I64)):
        return False
    steps = linear(x.hi)
    if steps is None or any(c % x.step for c in steps.values()):
        return False
    full, partial = _rows(x, buffer), _rows(y, buffer)
    if not full or not partial:
        return False

    def along(k: int) -> bool:
        dims = [d[k] for d in full + partial]
        first = dims[0]
        return first is not None and all(d is not None and d[0] == first[0] and d[1] >= 0 for d in dims) and all(
            d[k] is not None and d[k][2] is not None and d[k][2] < x.step for d in full)  # type: ignore[index, operator]
    return any(along(k) for k in range(len(full[0])))


def _rows(top: For, buffer: str) -> list[list[tuple[dict[str, int], int, int | None] | None]]:
    """Per store of ``buffer`` under ``top``, per index whose affine form has ``top``'s
    variable once: the terms of the loops outside ``top``, and the least and greatest
    (None where a loop's trips are unknown) offset over the loops inside (else None)."""
    found = []
    for s, scope in walk_scoped(top.body):
        if isinstance(s, Store) and s.buffer == buffer:
            inner = {lp.var: lp for lp in scope.loops if isinstance(lp, For)}
            if len(inner) != len(scope.loops):
                return []
            least = {v: _least(lp, top) for v, lp in inner.items()}
            dims: list[tuple[dict[str, int], int, int | None] | None] = []
            for index in s.indices:
                f = affine(index)
                if f is None or f.get(top.var) != 1 or any(
                        c < 0 or v in inner and least[v] is None for v, c in f.items() if v):
                    dims.append(None)
                    continue
                lo = f.get("", 0)
                hi: int | None = lo
                for v, c in f.items():
                    if v in inner:
                        lp, first = inner[v], least[v]
                        assert first is not None
                        trips = max_trips(lp.lo, lp.hi, lp.step) if isinstance(lp.lo, Literal) else None
                        lo += c * first
                        hi = None if hi is None or not trips else hi + c * (first + (trips - 1) * lp.step)
                dims.append(({v: c for v, c in f.items() if v and v not in inner and v != top.var}, lo, hi))
            found.append(dims)
    return found


def _least(lp: For, top: For) -> int | None:
    """The least value of ``lp``'s variable, a loop inside ``top``: its literal start, or
    0 for the partial tile of a loop inside ``top``'s rows (``s * floordiv(N - v, s)``,
    ``top`` running ``v`` below ``N``: then ``N - v`` is positive); else None."""
    if isinstance(lp.lo, Literal):
        return int(lp.lo.value)
    start = linear(lp.lo)
    if start is None or len(start) != 1:
        return None
    (atom, c), = start.items()
    if not (c > 0 and isinstance(atom, Call) and atom.fn == "floordiv"):
        return None
    left, end = linear(atom.args[0]), linear(top.hi)
    var: dict[Expr, int] = {IndexVar(top.var): 1}
    return 0 if left is not None and end is not None and left == linear_sum(end, var, -1) else None


def _pieces_outside(top: For) -> tuple[For, ...] | None:
    """A register block with a loop of unknown trips inside its reduction (a symbolic
    kernel's partial block), as pieces of it outside the reduction, each a block of
    constant trips summed in registers:

    * jammed rows, ``for r in 0:min(5, N - x) + 1``: pieces of 4, 2 and 1 rows, each
      piece's rows jammed (:func:`_pieces`);
    * the vector's columns, ``for v in 0:min(63, N - x) + 1 vectorize(16)``: pieces of
      64, 32 and 16 columns (whole vectors), then the last, partial vector
      (:func:`_columns`).

    Each statement accumulates into its own element, indexed by the loop's variable, so
    every element keeps its order of sums."""
    parts = _nest_parts(top)
    if parts is None:
        return None
    loops, stores, inner = parts
    loose = [k for k in inner if constant_trips(loops[k]) is None]
    if not loose:
        return None
    k = loose[0]
    lp, reduction = loops[k], {x.var for x in loops[:inner[0]]}
    most = max_trips(lp.lo, lp.hi, lp.step)
    if lp.kind is not LoopKind.SERIAL or lp.step != 1 or lp.lo != Literal(0, _I64) or not most or any(
            isinstance(n, IndexVar) and n.name in reduction for e in (lp.lo, lp.hi) for n in walk(e)):
        return None
    written = {s.buffer for s in stores}
    if any(isinstance(r, Read) and r.tensor in written and (r.tensor != s.buffer or r.indices != s.indices)
           for s in stores for r in walk(s.value)):
        return None
    if k == inner[0] and lp.vector == 1 and k < len(loops) - 1:
        return _pieces(lp, loops[:k] + loops[k + 1:], most)
    if k == len(loops) - 1 and lp.vector >= MIN_VECTOR and most > lp.vector:
        return _columns(loops, most)
    return None


def _shifted(var: str, by: Expr) -> Callable[[Expr], Expr]:
    value = Binary(BinaryOp.ADD, IndexVar(var), by, _I64)
    return lambda e: value if isinstance(e, IndexVar) and e.name == var else e


def _cut(hi: Expr, start: Expr, size: int) -> Expr:
    """Where the pieces of ``size`` from ``start`` up to ``hi`` end: ``start + size *
    floordiv(hi - start, size)``."""
    left = hi if start == Literal(0, _I64) else Binary(BinaryOp.SUB, hi, start, _I64)
    return Binary(BinaryOp.ADD, start, Binary(BinaryOp.MUL, Literal(size, _I64), Call(
        "floordiv", (left, Literal(size, _I64)), _I64), _I64), _I64)


def _nest(loops: list[For], body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    for lp in reversed(loops):
        body = (replace(lp, body=body),)
    return body


def _pieces(rows: For, inside: list[For], most: int) -> tuple[For, ...]:
    """The loop ``rows`` (``0:T``, at most ``most`` trips) around the loops ``inside``
    (the reduction's, then the block's; statements in the innermost) as pieces of rows
    ``4 * floordiv(T, 4)`` (by steps of 4, the statements jammed), then of 2, then the
    last row: powers of two up to ``most``."""
    out = []
    start: Expr = Literal(0, _I64)
    size = 1 << (most.bit_length() - 1)
    stores = inside[-1].body
    while size > 1:
        end = _cut(rows.hi, start, size)
        jammed = tuple(x for u in range(size)
                       for x in (map_body_exprs(stores, _shifted(rows.var, Literal(u, _I64))) if u else stores))
        out.append(replace(rows, lo=start, hi=end, step=size, body=_nest(inside, jammed)))
        start, size = end, size // 2
    out.append(replace(rows, lo=start, body=_nest(inside, stores)))
    return tuple(out)


def _columns(loops: list[For], most: int) -> tuple[For, ...]:
    """The nest ``loops`` whose last loop, the vector's, runs ``0:T`` (at most ``most``
    trips) as pieces of columns, each a loop ``o`` of whole vectors (``T`` cut at
    multiples of the piece, as :func:`_pieces` cuts rows) outside the reduction around
    the nest with a vector loop of constant trips at ``o + v``; then, where the whole
    vectors end, a piece of the last, partial vector (``0:min(w - 1, T - o - 1) + 1``)."""
    vec = loops[-1]
    offset = f"{vec.var}_o"
    body = map_body_exprs(vec.body, _shifted(vec.var, IndexVar(offset)))
    out = []
    start: Expr = Literal(0, _I64)
    size = 1 << (most.bit_length() - 1)
    while size >= vec.vector:
        end = _cut(vec.hi, start, size)
        inner = replace(vec, hi=Literal(size, _I64), unroll=max(1, size // vec.vector), body=body)
        out.append(For(offset, start, end, _nest(loops[:-1], (inner,)), step=size))
        start, size = end, size // 2
    left = Binary(BinaryOp.SUB, Binary(BinaryOp.SUB, vec.hi, IndexVar(offset), _I64), Literal(1, _I64), _I64)
    lanes = Binary(BinaryOp.ADD, Call("min", (Literal(vec.vector - 1, _I64), left), _I64), Literal(1, _I64), _I64)
    last = replace(vec, hi=lanes, unroll=1, body=body)
    out.append(For(offset, start, vec.hi, _nest(loops[:-1], (last,)), step=vec.vector))
    return tuple(out)


def _region(top: Stmt, buffer: str) -> list[tuple[dict[str, int], tuple[int, int]]] | None:
    """Per index of ``buffer``, where the stores under ``top`` put it: the affine part fixed
    outside ``top`` and the least and greatest value of the rest over ``top``'s loops;
    None when a loop's bounds or an index is not affine and constant enough to say."""
    found: list[list[tuple[dict[str, int], tuple[int, int]]]] = []

    for s, scope in walk_scoped((top,)):
        if isinstance(s, For) and constant_loop(s) is None:
            return None
        if isinstance(s, Store) and s.buffer == buffer:
            loops = tuple(constant_loop(lp) for lp in scope.loops)   # type: ignore[arg-type]
            forms = [affine(index) for index in s.indices]
            if any(f is None for f in forms):
                return None
            mine = {lp.var for lp in loops}   # type: ignore[union-attr]
            found.append([({v: c for v, c in f.items() if v and v not in mine},  # type: ignore[union-attr]
                           span({v: c for v, c in f.items() if v in mine or not v}, loops))  # type: ignore[union-attr, arg-type]
                          for f in forms])
    if not found:
        return None
    if any(d[0] != first[0] for dims in found for d, first in zip(dims, found[0])):
        return None
    return [(found[0][k][0], (min(d[k][1][0] for d in found), max(d[k][1][1] for d in found)))
            for k in range(len(found[0]))]


def _reads_before_written(body: tuple[Stmt, ...], tensor: str) -> bool:
    """Whether a top-level nest of ``body`` reads ``tensor`` while it, or one before it,
    still writes it (the reads of nests after the last writer see only written values)."""
    nests = [s for s in body]
    writers = [k for k, s in enumerate(nests) if any(isinstance(t, Store) and t.buffer == tensor
                                                     for t in walk_stmts((s,)))]
    last = max(writers, default=-1)
    return any(isinstance(r, Read) and r.tensor == tensor
               for s in nests[:last + 1] for t in walk_stmts((s,)) for r in stmt_nodes(t))


def _nest_parts(top: For) -> tuple[list[For], list[Store], list[int]] | None:
    """``top``'s perfect nest, the stores at its bottom and the positions of the loops
    their elements use, or None unless every statement there is a store and those loops
    are the innermost ones, below at least one they do not use (the reduction must run
    outside every loop the block's elements use)."""
    loops = perfect_nest(top)
    stores = [s for s in loops[-1].body if isinstance(s, Store)]
    if not stores or len(stores) != len(loops[-1].body):
        return None
    used = {n.name for s in stores for i in s.indices for n in walk(i) if isinstance(n, IndexVar)}
    inner = [k for k, lp in enumerate(loops) if lp.var in used]
    if not inner or inner[0] == 0 or inner != list(range(inner[0], len(loops))):
        return None
    return loops, stores, inner


def _block(top: For, kernel: LoopKernel) -> tuple[list[For], list[For], tuple[Store, ...]] | None:
    """``top``'s nest split into reduction loops (``top`` first), block loops (the last
    one vectorized) and the accumulating stores, or None if it is not a register block
    whose reduction starts at ``top``."""
    parts = _nest_parts(top)
    if parts is None:
        return None
    loops, stores, inner = parts
    if loops[-1].vector < MIN_VECTOR or any(lp.kind is not LoopKind.SERIAL for lp in loops):
        return None
    reduction, block = loops[:inner[0]], loops[inner[0]:]   # (a reduction of a symbolic size may)
    if any(constant_trips(lp) is None for lp in block[:-1]) or _most(block[-1]) is None:
        return None   # (the vector loop may be one partial vector: a symbolic kernel's last)
    if any(_trips(lp) > 1 and (lp.lo.value != 0 or lp.step != 1) for lp in block):  # type: ignore[attr-defined]
        return None
    buffer = {b.name: b for b in kernel.buffers}
    written = {s.buffer for s in stores}  # type: ignore[union-attr]
    for s in stores:
        if not isinstance(s, Store) or buffer[s.buffer].role is BufferRole.LOCAL:
            return None
        reads = [r for r in walk(s.value) if isinstance(r, Read) and r.tensor in written]
        if not reads or any(r.tensor != s.buffer or r.indices != s.indices for r in reads):
            return None  # each statement accumulates into its own element, reading no other
    if not _disjoint(stores):  # type: ignore[arg-type]
        return None
    elements = len(stores) * _elements(block)
    if elements > MAX_ACCUMULATORS or len({buffer[s.buffer].dtype.compute for s in stores}) != 1:  # type: ignore[union-attr]
        return None
    return reduction, block, stores  # type: ignore[return-value]


def _disjoint(stores: tuple[Store, ...]) -> bool:
    """Whether the stores write different elements at every step: each pair differs by a
    nonzero constant in some index (the rows unroll-and-jam made)."""
    forms = [[affine(i) for i in s.indices] for s in stores]

    def apart(a: list, b: list) -> bool:  # type: ignore[type-arg]
        return any(x is not None and y is not None and
                   {k: v for k, v in x.items() if k} == {k: v for k, v in y.items() if k}
                   and x.get("", 0) != y.get("", 0) for x, y in zip(a, b))
    return all(apart(forms[i], forms[j]) for i in range(len(forms)) for j in range(i)
               if stores[i].buffer == stores[j].buffer)


def _trips(lp: For) -> int:
    trips = _most(lp)
    assert trips is not None
    return trips


def _most(lp: For) -> int | None:
    """The trips of a block loop: constant, or (a vector loop ``0:min(w - 1, N - x) + 1``
    of at most one vector: the last, partial one of a symbolic number of columns) at most
    ``w``; None for any other."""
    trips = constant_trips(lp)
    if trips is not None or lp.lo != Literal(0, _I64) or lp.step != 1 or lp.vector < MIN_VECTOR:
        return trips
    most = max_trips(lp.lo, lp.hi, lp.step)
    return most if most and most <= lp.vector else None


def _elements(block: list[For]) -> int:
    n = 1
    for lp in block:
        n *= _trips(lp)
    return n


def _promote(top: For, parts: tuple[list[For], list[For], tuple[Store, ...]], name: str,
             kernel: LoopKernel, zero: bool) -> tuple[Buffer, tuple[Stmt, Stmt, Stmt]]:
    reduction, block, stores = parts
    dtype = kernel.buffer(stores[0].buffer).dtype.compute
    wide = [lp for lp in block if _trips(lp) > 1]
    buf = Buffer(name, dtype, (len(stores), *(_trips(lp) for lp in wide)), BufferRole.LOCAL)

    def acc(j: int) -> Read:
        return Read(name, (Literal(j, _I64), *(IndexVar(lp.var) for lp in wide)), dtype)

    def element(s: Store) -> Read:
        return Read(s.buffer, s.indices, kernel.buffer(s.buffer).dtype)

    def nest(body: tuple[Stmt, ...], loops: list[For]) -> Stmt:
        stmt: tuple[Stmt, ...] = body
        for lp in reversed(loops):
            stmt = (replace(lp, body=stmt),)
        return stmt[0]

    def swap(j: int, s: Store):  # type: ignore[no-untyped-def]
        return lambda e: acc(j) if isinstance(e, Read) and e.tensor == s.buffer and e.indices == s.indices else e

    # a sum starts at zero and adds the element once, after the reduction: the block's
    # loads of T then overlap the next block's products instead of holding up its own
    # (a 2048 matmul's T is out of cache on every reduction tile)
    summed = not zero and all(_sum(s) for s in stores)
    start = zero or summed
    load = nest(tuple(Store(name, acc(j).indices, Literal(0.0 if dtype.is_float else 0, dtype) if start
                            else element(s)) for j, s in enumerate(stores)), block)
    update = nest(tuple(Store(name, acc(j).indices, map_expr(s.value, swap(j, s)))
                        for j, s in enumerate(stores)), reduction + block)
    store = nest(tuple(Store(s.buffer, s.indices, Binary(BinaryOp.ADD, element(s), acc(j), dtype) if summed
                             else acc(j)) for j, s in enumerate(stores)), block)
    return buf, (load, update, store)


def _sum(s: Store) -> bool:
    """Whether ``s`` adds to its element: ``T(i) = T(i) + e`` (or ``e + T(i)``), ``e`` not
    reading ``T``."""
    v = s.value
    if not isinstance(v, Binary) or v.op is not BinaryOp.ADD:
        return False
    own = [x for x in (v.lhs, v.rhs) if isinstance(x, Read) and x.tensor == s.buffer and x.indices == s.indices]
    rest = v.rhs if own and own[0] is v.lhs else v.lhs
    return bool(own) and not any(isinstance(r, Read) and r.tensor == s.buffer for r in walk(rest))
