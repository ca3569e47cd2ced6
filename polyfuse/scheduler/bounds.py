"""Every access of a definition inside its tensor, proven for the sizes of a call.

Range inference gives an index the largest range that keeps the accesses it *solved*
in bounds, but an access whose indices all got their ranges elsewhere is not covered:
in ``O(i, j) = I(i, i + j, j)`` the ranges of ``i`` and ``j`` come from dimensions 0 and
2 of ``I``, and nothing keeps ``i + j`` inside dimension 1; ``where`` clauses can reach
past a tensor too. So before any code is generated, every access of every statement is
checked here, with isl, for concrete sizes:

* An affine index under selects whose conditions are affine (``h - 1 >= 0 ? I(h - 1) :
  0``): the instances that would touch an element outside the tensor form an exact set.
  Empty, the access is proven. Not empty, those instances would run, so the definition
  is refused with an :class:`~polyfuse.errors.AccessRangeError` that names the
  statement, the tensor, the dimension, the range of the index and one instance.
* An index or a condition isl cannot model (products of indices, scalar parameters,
  values read from tensors): numeric interval arithmetic over the index ranges tries to
  prove the index in bounds; where it cannot, the read keeps the dimension in
  :attr:`Read.checked <polyfuse.ir.comprehension.Read.checked>`, and the targets check
  it when it runs (out of range sets the error buffer and reads element 0; the runtime
  raises :class:`~polyfuse.errors.BoundsError`), as they do for indirect indices.

Writes go to the left-hand side indices over their ranges, which are checked as
unconditional affine accesses. Indices read from tensors stay checked at run time.

A kernel compiled for symbolic sizes runs at sizes where these checks come out the same.
:func:`in_bounds` gives the affine conditions on the sizes under which interval
arithmetic alone proves every access (most definitions' accesses, at most sizes): a new
size that meets them needs no check at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property

import islpy as isl

from polyfuse.errors import AccessRangeError, ScheduleError, SourceLocation
from polyfuse.ir.affine import Affine, combine, scale, size_form
from polyfuse.ir.comprehension import (Binary, BinaryOp, Call, Cast, Definition, Expr, IndexVar,
                                       Literal, Read, Select, SizeVar, Statement, Unary, UnaryOp,
                                       children, walk, with_children)
from polyfuse.ir.symbolic import evaluate_int
from polyfuse.scheduler.model import _bound_constraints, _NotAffine, isl_expr

Interval = tuple[int, int]  # inclusive


@dataclass(frozen=True, slots=True)
class _Path:
    """The select conditions a read sits under: isl constraints for those isl can model,
    and whether any could not be modelled (then the read may not run where isl says)."""

    constraints: tuple[str, ...] = ()
    opaque: bool = False

    def under(self, cond: Expr, holds: bool, names: dict[str, str]) -> _Path:
        try:
            text = isl_condition(cond, names)
        except _NotAffine:
            return _Path(self.constraints, True)
        return _Path(self.constraints + (text if holds else f"not ({text})",), self.opaque)


def isl_condition(e: Expr, names: dict[str, str]) -> str:
    """A boolean index expression as an isl constraint; raises ``_NotAffine`` otherwise."""
    match e:
        case Literal(value=v) if e.dtype.is_bool:
            return "1 = 1" if v else "1 = 0"
        case Unary(op=UnaryOp.NOT, operand=a):
            return f"not ({isl_condition(a, names)})"
        case Binary(op=BinaryOp.AND | BinaryOp.OR, lhs=a, rhs=b):
            word = "and" if e.op is BinaryOp.AND else "or"
            return f"(({isl_condition(a, names)}) {word} ({isl_condition(b, names)}))"
        case Binary(op=op, lhs=a, rhs=b) if op.is_comparison and a.dtype.is_int and b.dtype.is_int:
            symbol = "=" if op is BinaryOp.EQ else op.value
            return f"{isl_expr(a, names)} {symbol} {isl_expr(b, names)}"
    raise _NotAffine(str(e))


def check_accesses(d: Definition, sizes: Mapping[str, int]) -> Definition:
    """``d`` with the read dimensions that need a run-time check marked ``checked``.

    Raises :class:`AccessRangeError` when some statement instance would certainly read
    or write outside a tensor for these ``sizes``.
    """
    checker = _Checker(d, dict(sizes))
    statements = tuple(checker.statement(st) for st in d.statements)
    return d if statements == d.statements else replace(d, statements=statements)


class _Checker:
    def __init__(self, d: Definition, sizes: dict[str, int]) -> None:
        self.d = d
        self.sizes = sizes
        self.ctx = isl.Context()
        self.proofs: dict[tuple[str, str, int, tuple[str, ...], bool], bool] = {}   # one statement's

    def statement(self, st: Statement) -> Statement:
        its = st.indices + st.reduction_indices
        names = {s: str(v) for s, v in self.sizes.items()} | {n: f"t{j}" for j, n in enumerate(its)}
        tup = f"S[{', '.join(f't{j}' for j in range(len(its)))}]"
        try:
            cons = [c for n in its for c in _bound_constraints(names[n], st.range_of(n).lo,
                                                               st.range_of(n).hi, names)]
        except ScheduleError:  # a range isl cannot model: the scheduler reports it
            return st
        domain = _Domain(self.ctx, f"{{ {tup} : {' and '.join(cons) or '1 = 1'} }}")
        box = {n: (evaluate_int(st.range_of(n).lo, self.sizes),
                   evaluate_int(st.range_of(n).hi, self.sizes) - 1) for n in its}
        if any(lo > hi for lo, hi in box.values()):   # (the ranges are boxes: of sizes only)
            return st
        self.writes(st, domain, tup, names, box)
        self.proofs = {}
        return replace(st, rhs=_Rewrite(self, st, domain, tup, names, box).expr(st.rhs, _Path()))

    def writes(self, st: Statement, domain: _Domain, tup: str, names: dict[str, str],
               box: dict[str, Interval]) -> None:
        shape = tuple(evaluate_int(s, self.sizes) for s in self.d.tensor(st.tensor).shape)
        for dim, (index, extent) in enumerate(zip(st.indices, shape)):
            if _within(box[index], extent):
                continue
            self.affine(st, f"{st.tensor}({', '.join(st.indices)})", st.tensor, dim, names[index],
                        extent, domain.set, tup, names, "writes")

    def proven(self, st: Statement, r: Read, dim: int, extent: int, path: _Path, domain: _Domain,
               tup: str, names: dict[str, str], box: dict[str, Interval]) -> bool:
        """Whether dimension ``dim`` of ``r`` stays in bounds wherever ``r`` runs; raises
        when it certainly does not. An index inside the dimension over the statement's
        whole box needs no isl (most do; the isl proofs were an eighth of DenseNet-121's scheduling)."""
        if _within(_interval(r.indices[dim], box, self.sizes), extent):
            return True
        try:
            index = isl_expr(r.indices[dim], names)
        except _NotAffine:
            return False
        # reads of a statement often repeat an index under the same conditions (a
        # Winograd transform's tiles: 36 reads, one tile index): proven once
        key = (r.tensor, index, extent, path.constraints, path.opaque)
        if key not in self.proofs:
            self.proofs[key] = self._proven(st, r, dim, extent, path, domain, tup, names, index)
        return self.proofs[key]

    def _proven(self, st: Statement, r: Read, dim: int, extent: int, path: _Path, domain: _Domain,
                tup: str, names: dict[str, str], index: str) -> bool:
        runs = domain.set
        if path.constraints:
            where = isl.Set.read_from_str(self.ctx, f"{{ {tup} : {' and '.join(path.constraints)} }}")
            runs = runs.intersect(where)
        return self.affine(st, str(r), r.tensor, dim, index, extent, runs, tup, names, "reads",
                           certain=not path.opaque, loc=r.loc)

    def affine(self, st: Statement, access: str, tensor: str, dim: int, index: str, extent: int,
               runs: isl.Set, tup: str, names: dict[str, str], verb: str,
               certain: bool = True, loc: SourceLocation | None = None) -> bool:
        outside = isl.Set.read_from_str(self.ctx, f"{{ {tup} : {index} < 0 or {index} >= {extent} }}")
        bad = runs.intersect(outside)
        if bad.is_empty():
            return True
        if not certain:
            return False
        values = isl.Map.read_from_str(self.ctx, f"{{ {tup} -> [{index}] }}").intersect_domain(runs).range()
        lo, hi = values.dim_min_val(0).to_python(), values.dim_max_val(0).to_python()
        point = bad.sample_point()
        its = st.indices + st.reduction_indices
        at = ", ".join(f"{n}={point.get_coordinate_val(isl.dim_type.set, j).to_python()}"
                       for j, n in enumerate(its))
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        head = f"{st.tensor}({', '.join(st.indices)}) {st.op.token(st.init)} ..."
        raise AccessRangeError(
            f"statement '{head}' {verb} '{tensor}' out of bounds in {access} for "
            f"{sizes or 'these sizes'}: the index of dimension {dim} runs over {lo}:{hi + 1} "
            f"but the dimension has size {extent} (e.g. at {at})", loc or st.loc,
            hint="shrink the index ranges with a where clause, or pass inputs whose sizes "
                 "keep the access inside the tensor")


class _Domain:
    """A statement's instances as an isl set, read when a proof first needs isl (most
    accesses are proven inside their tensors over the statement's box alone)."""

    def __init__(self, ctx: isl.Context, text: str) -> None:
        self.ctx = ctx
        self.text = text

    @cached_property
    def set(self) -> isl.Set:
        return isl.Set.read_from_str(self.ctx, self.text)


@dataclass
class _Rewrite:
    """One statement's right-hand side with each read's unproven dimensions marked."""

    checker: _Checker
    st: Statement
    domain: _Domain
    tup: str
    names: dict[str, str]
    box: dict[str, Interval]

    def expr(self, e: Expr, path: _Path) -> Expr:
        match e:
            case Select(cond=c, then=a, other=b):  # only the chosen side runs
                return replace(e, cond=self.expr(c, path),
                               then=self.expr(a, path.under(c, True, self.names)),
                               other=self.expr(b, path.under(c, False, self.names)))
            case Read():
                r = replace(e, indices=tuple(self.expr(i, path) for i in e.indices))
                return replace(r, checked=self.checked(r, path))
        kids = children(e)
        return with_children(e, tuple(self.expr(c, path) for c in kids)) if kids else e

    def checked(self, r: Read, path: _Path) -> tuple[int, ...]:
        shape = tuple(evaluate_int(s, self.checker.sizes) for s in self.checker.d.tensor(r.tensor).shape)
        return tuple(dim for dim, (index, extent) in enumerate(zip(r.indices, shape))
                     if not any(isinstance(n, Read) for n in walk(index))
                     and not self.checker.proven(self.st, r, dim, extent, path, self.domain,
                                                 self.tup, self.names, self.box))


def _within(reach: Interval | None, extent: int) -> bool:
    """Whether the values ``reach`` (None: unknown) all index a dimension of ``extent``."""
    return reach is not None and 0 <= reach[0] and reach[1] < extent


def _interval(e: Expr, box: Mapping[str, Interval], sizes: Mapping[str, int]) -> Interval | None:
    """Bounds of an integer index expression over the index box, or None when unknown.
    Division and modulo are bounded so that both flooring and truncating hold."""
    def sub(x: Expr) -> Interval | None:
        return _interval(x, box, sizes)

    e = _through(e)
    match e:
        case Literal(value=v) if e.dtype.is_int:
            return int(v), int(v)
        case SizeVar(name=n) if n in sizes:
            return sizes[n], sizes[n]
        case IndexVar(name=n) if n in box:
            return box[n]
        case Unary(op=UnaryOp.NEG, operand=a):
            r = sub(a)
            return None if r is None else (-r[1], -r[0])
        case Select(then=a, other=b):
            ra, rb = sub(a), sub(b)
            return None if ra is None or rb is None else (min(ra[0], rb[0]), max(ra[1], rb[1]))
        case Call(fn="min" | "max", args=args):
            parts = [sub(a) for a in args]
            if any(p is None for p in parts):
                return None
            pick = min if e.fn == "min" else max
            return pick(p[0] for p in parts), pick(p[1] for p in parts)  # type: ignore[index]
        case Binary(op=op, lhs=a, rhs=b) if e.dtype.is_int:
            ra, rb = sub(a), sub(b)
            if ra is None or rb is None:
                return None
            return _arith(op, ra, rb)
    return None


def _arith(op: BinaryOp, a: Interval, b: Interval) -> Interval | None:
    if op is BinaryOp.ADD:
        return a[0] + b[0], a[1] + b[1]
    if op is BinaryOp.SUB:
        return a[0] - b[1], a[1] - b[0]
    if op is BinaryOp.MUL:
        products = [x * y for x in a for y in b]
        return min(products), max(products)
    if b[0] <= 0:  # a divisor that may be zero or negative: leave it to the run-time check
        return None
    if op is BinaryOp.DIV:
        quotients = [q for x in a for y in b for q in (x // y, -(-x // y))]
        return min(quotients), max(quotients)
    if op is BinaryOp.MOD:
        reach = b[1] - 1
        return (0 if a[0] >= 0 else -reach), (min(reach, a[1]) if a[0] >= 0 else reach)
    return None


def affine_in(e: Expr, sizes: Mapping[str, int], symbolic: frozenset[str]) -> Affine | None:
    """``e`` as an affine form of the ``symbolic`` sizes (the others at their values in
    ``sizes``), or None where it is not one."""
    f = size_form(e)
    if f is None or any(n and n not in symbolic and n not in sizes for n in f):
        return None
    out = {n: c for n, c in f.items() if n in symbolic}
    out[""] = f.get("", 0) + sum(c * sizes[n] for n, c in f.items() if n and n not in symbolic)
    return out


def value(f: Affine, sizes: Mapping[str, int]) -> int:
    """An affine form's value at ``sizes``."""
    return f.get("", 0) + sum(c * sizes[n] for n, c in f.items() if n)


Reach = tuple[list[Affine], list[Affine]]   # forms whose least is at most / greatest at least a value
_MOST_FORMS = 16


def in_bounds(d: Definition, sizes: Mapping[str, int], symbolic: frozenset[str]) -> tuple[Affine, ...] | None:
    """Conditions on ``d``'s ``symbolic`` sizes (its other sizes at their values in
    ``sizes``), each an affine form of them that must be at least 0, under which the
    intervals of every write's and every read's indices over their statement's box lie
    inside their tensors (indices read from tensors aside, which are checked anyway).
    Where they hold, :func:`check_accesses` proves every access without isl and marks no
    dimension: every such size runs the same code. None where some range, shape or index
    is not affine in the sizes (a division, a product of two sizes): then only
    :func:`check_accesses` can tell."""
    def form(e: Expr) -> Affine | None:
        return affine_in(e, sizes, symbolic)

    def ends(e: Expr, fn: str) -> list[Affine] | None:
        """Forms of ``e`` or, for ``fn`` (max of a range's start, min of its end), of
        each argument: any one bounds the range from its side."""
        parts = e.args if isinstance(e, Call) and e.fn == fn else (e,)
        forms = [form(p) for p in parts]
        return None if any(f is None for f in forms) else forms  # type: ignore[return-value]

    conditions: dict[tuple[tuple[str, int], ...], Affine] = {}

    def inside(reach: Reach, extent: Affine) -> None:
        """The least index at least 0, the greatest at most extent - 1."""
        lows, highs = reach
        for f in lows + [combine(combine(extent, h, -1), {"": -1}) for h in highs]:
            conditions.setdefault(tuple(sorted(f.items())), f)

    for st in d.statements:
        box: dict[str, Reach] = {}
        for n in st.indices + st.reduction_indices:
            lows, highs = ends(st.range_of(n).lo, "max"), ends(st.range_of(n).hi, "min")
            if lows is None or highs is None:
                return None
            box[n] = (lows, [combine(h, {"": -1}) for h in highs])
        shapes = {}
        for t in {st.tensor} | {r.tensor for r in walk(st.rhs) if isinstance(r, Read)}:
            shape = [form(e) for e in d.tensor(t).shape]
            if any(f is None for f in shape):
                return None
            shapes[t] = shape
        for index, extent in zip(st.indices, shapes[st.tensor]):
            inside(box[index], extent)  # type: ignore[arg-type]
        for r in walk(st.rhs):
            if not isinstance(r, Read):
                continue
            for e, extent in zip(r.indices, shapes[r.tensor]):
                if any(isinstance(n, Read) for n in walk(e)):
                    continue
                reach = _reach(e, box, form)
                if reach is None:
                    return None
                inside(reach, extent)  # type: ignore[arg-type]
    # (a condition of no size that holds holds at every size)
    return tuple(f for f in conditions.values() if set(f) - {""} or f.get("", 0) < 0)


def _reach(e: Expr, box: Mapping[str, Reach], form: Callable[[Expr], Affine | None]) -> Reach | None:
    """Bounds of an index expression over the box as forms of the sizes: its value is at
    least the least of the first list and at most the greatest of the second (as
    :func:`_interval` bounds it, or looser); None where it is not affine."""
    def sub(x: Expr) -> Reach | None:
        return _reach(x, box, form)

    def pairs(a: list[Affine], b: list[Affine], k: int) -> list[Affine] | None:
        out = [combine(x, y, k) for x in a for y in b]
        return out if len(out) <= _MOST_FORMS else None

    e = _through(e)   # (as _interval)
    match e:
        case IndexVar(name=n) if n in box:
            return box[n]
        case Unary(op=UnaryOp.NEG, operand=a):
            r = sub(a)
            return None if r is None else ([scale(h, -1) for h in r[1]], [scale(lo, -1) for lo in r[0]])
        case Select(then=a, other=b) | Call(fn="min" | "max", args=(a, b)):
            ra, rb = sub(a), sub(b)
            if ra is None or rb is None:
                return None
            lows, highs = ra[0] + rb[0], ra[1] + rb[1]
            if isinstance(e, Call):   # max(a, b) is at least a, and at least b: a constant's side
                side = 0 if e.fn == "max" else 1
                ends = [r[side] for r in (ra, rb) if all(set(f) <= {""} for f in r[side])]
                if ends:   # the list whose bound (its least low, greatest high) is tightest
                    bound = min if side == 0 else max
                    best = (max if side == 0 else min)(ends, key=lambda fs: bound(f.get("", 0) for f in fs))
                    lows, highs = (best, highs) if side == 0 else (lows, best)
            return lows, highs
        case Binary(op=BinaryOp.ADD | BinaryOp.SUB, lhs=a, rhs=b) if e.dtype.is_int:
            ra, rb = sub(a), sub(b)
            if ra is None or rb is None:
                return None
            k = 1 if e.op is BinaryOp.ADD else -1
            least, most = pairs(ra[0], rb[0 if k == 1 else 1], k), pairs(ra[1], rb[1 if k == 1 else 0], k)
            return None if least is None or most is None else (least, most)
        case Binary(op=BinaryOp.MUL, lhs=a, rhs=b) if e.dtype.is_int:
            for x, y in ((a, b), (b, a)):
                f = form(x)
                if f is not None and set(f) <= {""}:
                    r = sub(y)
                    if r is None:
                        return None
                    times = f.get("", 0)
                    lows, highs = (r[0], r[1]) if times >= 0 else (r[1], r[0])
                    return [scale(lo, times) for lo in lows], [scale(h, times) for h in highs]
            return None
    f = form(e) if isinstance(e, Literal | SizeVar) else None
    return None if f is None else ([f], [f])


_COMPARE = {BinaryOp.LT: int.__lt__, BinaryOp.LE: int.__le__, BinaryOp.GT: int.__gt__,
            BinaryOp.GE: int.__ge__, BinaryOp.EQ: int.__eq__, BinaryOp.NE: int.__ne__}


def _through(e: Expr) -> Expr:
    """``e`` past what leaves an index's value as it is: a cast between integers, and a
    select whose condition compares numbers (one side runs: a Gather's wrap of a constant
    index, ``0 < 0 ? 0 + 12 : 0``)."""
    while True:
        match e:
            case Cast(operand=a) if e.dtype.is_int and a.dtype.is_int:
                e = a
            case Select(cond=Literal(value=bool() as known), then=yes, other=no):
                e = yes if known else no
            case Select(cond=Binary(op=op, lhs=a, rhs=b), then=yes, other=no) if op in _COMPARE:
                x, y = _interval(a, {}, {}), _interval(b, {}, {})
                if x is None or y is None or x[0] != x[1] or y[0] != y[1]:
                    return e
                e = yes if _COMPARE[op](x[0], y[0]) else no
            case _:
                return e
