"""Full tiles apart from partial ones: a loop-IR pass (index-set splitting).

Tiling a loop whose extent the tile does not divide leaves ``min`` in the bounds of the
loops inside the tile: ``for c3 in 0:min(63, 1039 - c0) + 1``. Such a loop has a trip count
known only at run time, so LLVM can neither unroll it into a register block nor keep its
accumulators in registers, and every tile pays for the last one. TVM partitions loops
(``LoopPartition``) and isl separates full tiles for the same reason.

A loop ``for v in lo:hi step s`` is split at the first value of ``v`` from which a ``min``
or ``max`` in the bounds of the loops it holds no longer has the same side for every value
before it: the first part runs the full tiles, where each such bound is a constant, the
second the rest, where the bounds are often constant too (the last tile's size). The
split happens only where the loops' bounds are known numbers (kernels are specialized to
their sizes) and at most :data:`MAX_COPIES` copies of a loop body are made. A parallel
loop keeps all its iterations on the thread pool: its body chooses between the two
versions (``if v < cut``), since two parallel loops would run one after the other, the
shorter leaving threads idle.

In a kernel compiled for symbolic sizes the bounds read the sizes (``for c0 in 0:N step
256``, ``min(255, N - c0 - 1)``): there what the loops around a statement imply is a set
of affine constraints, and :class:`~polyfuse.ir.cuts.Knowledge` the scheduler gives
(isl's) decides each ``min`` and ``max``, and :mod:`polyfuse.ir.cuts` finds the cut as an
expression of the sizes (``256 * floordiv(N, 256)``), the
first tile whose ``min`` may take the other side.
"""

from __future__ import annotations

from dataclasses import replace

from polyfuse.ir.comprehension import (Binary, BinaryOp, Call, Expr, IndexVar, Literal, ScalarRef, index_names,
                                       map_expr, walk)
from polyfuse.ir.loops import (For, If, Interval, LoopKernel, LoopKind, LoopRewriter, Scope, Stmt, interval,
                               loop_range, walk_stmts)
from polyfuse.ir.types import DType
from polyfuse.ir.cuts import Knowledge, NotAffine, aligned, prefix_cut, smallest

_I64 = DType.INT64

MAX_COPIES = 16     # copies of one loop body at most (each split doubles what it holds)



def separate_full_tiles(kernel: LoopKernel, knowledge: Knowledge | None = None) -> LoopKernel:
    """Split the tile loops of ``kernel`` so that full tiles have constant bounds.
    ``knowledge``: what holds at the kernel's top (the scheduler's
    :class:`~polyfuse.scheduler.symbolic_facts.Facts`), with which bounds that read sizes
    are decided and split; without it they stay as they are."""
    symbolic = knowledge is not None and any(
        isinstance(n, ScalarRef) for s in walk_stmts(kernel.body) if isinstance(s, For)
        for e in (s.lo, s.hi) for n in walk(e))
    return _Separate(knowledge if symbolic else None)(kernel)


class _Separate(LoopRewriter):
    def __init__(self, knowledge: Knowledge | None) -> None:
        self.budget = MAX_COPIES    # the copies of the body being walked that splits may make
        self.symbolic = knowledge is not None   # bounds read sizes (a kernel for symbolic sizes)
        self.facts: Knowledge = knowledge  # type: ignore[assignment]   # what holds where the walk is

    def loop(self, loop: For, scope: Scope) -> tuple[Stmt, ...]:
        env = scope.env
        if self.symbolic:   # (a bound the size's side wins keeps its min: the tile bounds the trips)
            loop = replace(loop, lo=self.facts.decide(loop.lo, True), hi=self.facts.decide(loop.hi, True))
        lo, hi = simplify(loop.lo, env), simplify(loop.hi, env)
        loop = replace(loop, lo=lo, hi=hi)
        if not (isinstance(lo, Literal) and isinstance(hi, Literal)) or lo.value >= hi.value:
            split = self._symbolic(loop, scope) if self.symbolic else None
            return split or (replace(loop, body=self._inside(loop, scope, loop.body)),)
        first, count = int(lo.value), _trips(int(lo.value), int(hi.value), loop.step)
        undecided = _undecided(loop, env)
        k = _full_prefix(loop, env, undecided, count) if undecided else count
        if 0 < k < count and self.budget > 1:
            cut = first + k * loop.step
            full = self._part(loop, scope, first, cut, self.budget // 2)
            rest = self._part(loop, scope, cut, int(hi.value), self.budget // 2)
            if loop.kind is LoopKind.PARALLEL:   # one loop, all its iterations on the threads
                below = Binary(BinaryOp.LT, IndexVar(loop.var), _int(cut), DType.BOOL)
                return (replace(loop, body=(If(below, full, rest),)),)
            return (replace(loop, hi=_int(cut), body=full), replace(loop, lo=_int(cut), body=rest))
        return (replace(loop, body=self._part(loop, scope, first, int(hi.value), self.budget)),)

    def _part(self, loop: For, scope: Scope, lo: int, hi: int, budget: int) -> tuple[Stmt, ...]:
        """The body of ``loop`` where its variable runs ``lo:hi``, splits in it making at
        most ``budget`` copies."""
        outer, self.budget = self.budget, budget
        try:
            part = replace(loop, lo=_int(lo), hi=_int(hi))
            return self._inside(part, scope, loop.body, scope.inside(loop).knowing(_values(lo, hi, loop.step)))
        finally:
            self.budget = outer

    def _inside(self, loop: For, scope: Scope, body: tuple[Stmt, ...], inner: Scope | None = None,
                facts: Knowledge | None = None) -> tuple[Stmt, ...]:
        """``body`` rewritten as the body of ``loop`` (``facts``: what holds there, if more
        than its bounds say)."""
        if not self.symbolic:
            return self.body(body, inner or scope.inside(loop))
        outer = self.facts
        self.facts = facts or outer.inside(loop)
        try:
            return self.body(body, inner or scope.inside(loop))
        finally:
            self.facts = outer

    def _symbolic(self, loop: For, scope: Scope) -> tuple[Stmt, ...] | None:
        """``loop``, whose bounds read sizes, split where the ``min`` and ``max`` in the
        bounds of the loops it holds are decided before the cut (full tiles) and not
        after (the last, partial one); None where no cut is found."""
        facts = self.facts.inside(loop)
        calls = [c for inner in walk_stmts(loop.body) if isinstance(inner, For) for e in (inner.lo, inner.hi)
                 for c in walk(e) if isinstance(c, Call) and c.fn in ("min", "max") and len(c.args) == 2
                 and loop.var in index_names(c) and index_names(c) <= facts.variables]
        cuts = [cut for c in calls if facts.decide(c) == c for cut in [prefix_cut(c, loop.var)] if cut is not None]
        if not cuts or self.budget <= 1:
            return None
        try:
            at = aligned(loop.lo, loop.step, smallest(cuts))
        except NotAffine:
            return None
        at = self.facts.decide(Call("max", (loop.lo, Call("min", (loop.hi, at), _I64)), _I64))
        if self.facts.always(at, "<=", loop.lo) or self.facts.always(loop.hi, "<=", at):
            return None
        budget, outer = self.budget // 2, self.budget
        self.budget = budget
        try:
            if loop.kind is LoopKind.PARALLEL:   # one loop, all its iterations on the threads
                full = self._inside(loop, scope, loop.body, facts=facts.below(loop.var, at))
                self.budget = budget
                rest = self._inside(loop, scope, loop.body, facts=facts.at_least(loop.var, at))
                below = Binary(BinaryOp.LT, IndexVar(loop.var), at, DType.BOOL)
                return (replace(loop, body=(If(below, full, rest),)),)
            first, second = replace(loop, hi=at), replace(loop, lo=at)
            full = self._inside(first, scope, loop.body)
            self.budget = budget
            return (replace(first, body=full), replace(second, body=self._inside(second, scope, loop.body)))
        finally:
            self.budget = outer


def _trips(lo: int, hi: int, step: int) -> int:
    return -(-(hi - lo) // step)


def _values(lo: int, hi: int, step: int) -> Interval:
    """The first and last value of ``for v in lo:hi step s`` (at least one iteration)."""
    return (lo, lo + (_trips(lo, hi, step) - 1) * step)


def _undecided(loop: For, env: dict[str, Interval]) -> list[Call]:
    """The min/max in the bounds of the loops under ``loop`` that read its iterator and
    otherwise only iterators of enclosing loops, and are not decided over its range."""
    known = set(env) | {loop.var}
    found = []
    for inner in (s for s in walk_stmts(loop.body) if isinstance(s, For)):
        for e in (inner.lo, inner.hi):
            for c in walk(e):
                if isinstance(c, Call) and c.fn in ("min", "max") and len(c.args) == 2:
                    names = {n.name for n in walk(c) if isinstance(n, IndexVar)}
                    if loop.var in names and names <= known:
                        found.append(c)
    whole = env | dict(loop_range(loop, env))
    return [c for c in found if _decided(c, whole) is None]


def _full_prefix(loop: For, env: dict[str, Interval], calls: list[Call], count: int) -> int:
    """The most iterations from the first for which every call in ``calls`` is decided."""
    first = int(loop.lo.value)   # type: ignore[attr-defined]

    def decided(k: int) -> bool:
        scope = env | {loop.var: (first, first + (k - 1) * loop.step)}
        return all(_decided(c, scope) is not None for c in calls)
    lo, hi = 0, count          # decided(lo) holds (no iterations), find the largest k
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if decided(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _decided(c: Call, env: dict[str, Interval]) -> Expr | None:
    """The argument of a two-argument min/max that it always takes over ``env``, or None."""
    a, b = (interval(x, env) for x in c.args)
    if a is None or b is None:
        return None
    if c.fn == "min":
        return c.args[0] if a[1] <= b[0] else c.args[1] if b[1] <= a[0] else None
    return c.args[0] if a[0] >= b[1] else c.args[1] if b[0] >= a[1] else None


def simplify(e: Expr, env: dict[str, Interval]) -> Expr:
    """``e`` with each min/max decided over ``env`` replaced by its side, and integer
    expressions that take one value over ``env`` folded to a literal."""
    def step(x: Expr) -> Expr:
        if isinstance(x, Call) and x.fn in ("min", "max") and len(x.args) == 2:
            side = _decided(x, env)
            if side is not None:
                x = side
        if x.dtype.is_int and not isinstance(x, Literal):
            r = interval(x, env)
            if r is not None and r[0] == r[1]:
                return Literal(r[0], x.dtype)
        return x
    return map_expr(e, step)


def _int(v: int) -> Literal:
    return Literal(v, DType.INT64)
