"""Epilogues in the register tile's stores: a contraction's pointwise consumers, fused.

A TC ``fc_relu`` (``O(b,n) +=! I(b,m) * W(n,m)``, then ``O(b,n) = O(b,n) + B(n)``, then
``O(b,n) = fmax(O(b,n), 0)``) maps onto three launches over the same blocks: the
contraction's register tile stores ``O``, and two elementwise launches read it back,
each a pass over the whole result through memory. cuBLAS and CUTLASS apply such
epilogues to the accumulators before they leave the registers; so does this pass, for a
launch that directly follows one whose blocks end in a register tile's stores::

    launch 0: blocks c0, c1 { threads c3, c4 registers acc { ... ; if <inside> { O(c0 + c3 + c3r, c1 + c4 + c4r) = acc(c3r, c4r) } } }
    launch 1: blocks c0, c1 { thread.y for c2 in 0:H0 { thread.x for c3 in 0:H1 { O(c0 + c2, c1 + c3) = O(c0 + c2, c1 + c3) + B(c1 + c3) } } }

becomes one launch whose store is ``O(c0 + c3 + c3r, c1 + c4 + c4r) = acc(c3r, c4r) +
B(c1 + c4 + c4r)``. It applies when the second launch has the same block loops and one
statement ``Y(E) = f(T(E), ...)`` in a chain of thread loops from 0, where ``T`` is a
buffer the tile stores (or ``Y`` is new and stored beside it), each index of ``E`` is
``block part + one thread loop's variable``, the tile stores at ``block part + its own
point`` along each, and the thread loops run exactly over the points the tile stores
(a loop's bound is the tile's guard on that index, or the tile's whole span without a
guard). ``f`` may read other buffers anywhere its indices say (a bias, a residual) but
``T`` and ``Y`` only at ``E``. ``T`` keeps its value before the epilogue only if ``Y``
is another buffer; in place, ``T`` is stored once, with the epilogue applied.
"""

from __future__ import annotations

from dataclasses import replace

from polyfuse.ir.affine import affine, combine, normal_form, to_expr
from polyfuse.ir.comprehension import Binary, BinaryOp, Expr, IndexVar, Literal, Read, map_expr, walk
from polyfuse.ir.gpu import BlockLoops, GpuKernel, Launch, ThreadFor, Threads
from polyfuse.ir.loops import For, If, Stmt, Store, rewrite, walk_stmts
from polyfuse.scheduler.gpu_launches import join_consecutive


def fuse_epilogues(kernel: GpuKernel) -> GpuKernel:
    """``kernel`` with each elementwise launch after a register-tiled one applied in its
    stores (see above); the launches renumbered."""
    return join_consecutive(kernel, _fuse)


def _fuse(first: Launch, second: Launch) -> Launch | None:
    tiled, pointwise = _single_block_loops(first), _single_block_loops(second)
    if tiled is None or pointwise is None or tiled.loops != pointwise.loops \
            or len(tiled.body) != 1 or not isinstance(tiled.body[0], Threads):
        return None
    region = tiled.body[0]
    chain = _thread_chain(pointwise.body)
    if chain is None or not region.body:
        return None
    loops, store = chain
    tail = region.body[-1]
    stores = _final_stores(tail)
    if stores is None:
        return None
    fused_tail = _apply(tail, stores, loops, store, region)
    if fused_tail is None:
        return None
    new_region = replace(region, body=(*region.body[:-1], fused_tail))
    return replace(first, body=(replace(tiled, body=(new_region,)),))


def _single_block_loops(launch: Launch) -> BlockLoops | None:
    body = launch.body
    return body[0] if len(body) == 1 and isinstance(body[0], BlockLoops) else None


def _thread_chain(body: tuple[Stmt, ...]) -> tuple[list[ThreadFor], Store] | None:
    """The thread loops (from 0, step 1, none idle) around one store, outermost first."""
    loops: list[ThreadFor] = []
    while len(body) == 1 and isinstance(body[0], ThreadFor):
        f = body[0]
        if not (isinstance(f.lo, Literal) and f.lo.value == 0 and f.step == 1 and not f.idle):
            return None
        loops.append(f)
        body = f.body
    if not loops or len(body) != 1 or not isinstance(body[0], Store):
        return None
    return loops, body[0]


def _final_stores(tail: Stmt) -> dict[str, Store] | None:
    """The stores of the tile's last statement (its micro loops, maybe a guard, stores of
    registers), by buffer; None where it is something else."""
    leaves = [s for s in walk_stmts((tail,)) if not isinstance(s, (For, If))]
    stores = {s.buffer: s for s in leaves if isinstance(s, Store)}
    return stores if leaves and len(stores) == len(leaves) else None


def _apply(tail: Stmt, stores: dict[str, Store], loops: list[ThreadFor], epilogue: Store,
           region: Threads) -> Stmt | None:
    """``tail`` with ``epilogue`` applied at each of its points, or None where it does not fit."""
    guard = _guard(tail)
    index = _point_map(epilogue.indices, loops, stores, guard, region)
    if index is None:
        return None
    reads = [r for r in walk(epilogue.value) if isinstance(r, Read)]
    written = set(stores) | {epilogue.buffer}
    if any(r.tensor in written and r.indices != epilogue.indices for r in reads):
        return None
    if any(r.tensor in written and r.tensor not in stores for r in reads):
        return None   # reads a value the tile does not hold

    def at_point(e: Expr) -> Expr:
        if isinstance(e, Read) and e.tensor in stores:
            return stores[e.tensor].value
        if isinstance(e, IndexVar) and e.name in index:
            return index[e.name]
        return e
    value = map_expr(epilogue.value, at_point)
    target = epilogue.buffer
    if target in stores:
        new = replace(stores[target], value=value)
        return _replace_store(tail, stores[target], (new,))
    anchor = next(iter(stores.values()))
    indices = tuple(normal_form(map_expr(i, at_point)) for i in epilogue.indices)
    return _replace_store(tail, anchor, (anchor, Store(target, indices, value)))


def _guard(tail: Stmt) -> dict[str, Expr]:
    """The tile's guard as ``point expression -> bound`` (``c3 + c3r < H``)."""
    out: dict[str, Expr] = {}
    for s in walk_stmts((tail,)):
        if isinstance(s, If):
            for c in _conjuncts(s.cond):
                if isinstance(c, Binary) and c.op is BinaryOp.LT:
                    form = affine(c.lhs)
                    if form is not None:
                        out[str(to_expr(form))] = c.rhs
    return out


def _conjuncts(e: Expr) -> list[Expr]:
    if isinstance(e, Binary) and e.op is BinaryOp.AND:
        return _conjuncts(e.lhs) + _conjuncts(e.rhs)
    return [e]


def _point_map(indices: tuple[Expr, ...], loops: list[ThreadFor], stores: dict[str, Store],
               guard: dict[str, Expr], region: Threads) -> dict[str, Expr] | None:
    """Each thread loop's variable as the tile's point along the index it moves: where
    ``E = base + t`` and the tile stores at ``base + point``, ``t -> point``; None where
    the loops do not run over exactly the points the tile stores."""
    anchor = next(iter(stores.values()))
    if len(anchor.indices) != len(indices) or any(s.indices != anchor.indices for s in stores.values()):
        return None
    spans = {r.var: r.step * r.threads for r in region.ranges}
    own = _region_vars(region)
    out: dict[str, Expr] = {}
    for loop in loops:
        positions = [k for k, i in enumerate(indices) if (f := affine(i)) is not None and f.get(loop.var) == 1]
        if len(positions) != 1:
            return None
        k = positions[0]
        e, t = affine(indices[k]), affine(anchor.indices[k])
        if e is None or t is None:
            return None
        base = {v: c for v, c in e.items() if v != loop.var}
        point = combine(t, base, -1)   # the tile's index less the same base
        if any(v not in own for v in point if v):
            return None
        key = str(to_expr(point))
        bound = guard.get(key)
        if bound is not None:
            if bound != loop.hi:
                return None
        else:   # no guard: the loop covers the tile's whole span along this index
            ranged = [v for v in point if v in spans]
            if len(ranged) != 1 or not (isinstance(loop.hi, Literal) and loop.hi.value == spans[ranged[0]]):
                return None
        out[loop.var] = to_expr(point)
    return out


def _region_vars(region: Threads) -> set[str]:
    """The tile's own variables: its ranges' and its micro loops'."""
    return {r.var for r in region.ranges} | {s.var for s in walk_stmts(region.body) if isinstance(s, For)}


def _replace_store(tail: Stmt, old: Store, new: tuple[Stmt, ...]) -> Stmt:
    (out,) = rewrite((tail,), pre=lambda s: new if s is old else None)
    return out
