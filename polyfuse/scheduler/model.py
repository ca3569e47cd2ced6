"""The polyhedral model of a definition: iteration domains, accesses, dependences.

Every TC statement becomes an isl statement ``S<k>`` over all its indices (left-hand
side first, then reduction indices); a statement with ``op=!`` also gets an init
statement ``I<k>`` over the left-hand side indices. Sizes stay isl parameters
(``s_<name>``) so scheduling is fast and independent of their values (see
ISL_NOTES.md); iterators are renamed ``t<j>`` so no user name clashes with isl syntax.
Accesses that are not affine (indirect reads, products of indices) are modelled
conservatively as touching the whole tensor.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import islpy as isl
import sympy

from polyfuse.errors import ScheduleError
from polyfuse.ir.comprehension import (Binary, BinaryOp, Call, Cast, Definition, Expr, IndexVar,
                                       Literal, Read, ReduceOp, ScalarRef, SizeVar, Statement, Unary,
                                       UnaryOp, walk)
from polyfuse.ir.symbolic import evaluate_int, to_sympy
from polyfuse.scheduler.loop_nest import loop_indices


class _NotAffine(Exception):
    pass


def isl_expr(e: Expr, names: dict[str, str]) -> str:
    """``e`` in isl's syntax, with indices and sizes renamed by ``names`` (and int scalars
    named there: a symbolic kernel's sizes)."""
    match e:
        case Literal(value=v) if e.dtype.is_int:
            return str(int(v))
        case IndexVar(name=n) | SizeVar(name=n):
            return names[n]
        case ScalarRef(name=n) if e.dtype.is_int and n in names:
            return names[n]
        case Cast(operand=a) if e.dtype.is_int and a.dtype.is_int:
            return isl_expr(a, names)
        case Unary(op=UnaryOp.NEG, operand=a):
            return f"(-{isl_expr(a, names)})"
        case Binary(op=BinaryOp.ADD | BinaryOp.SUB, lhs=a, rhs=b):
            return f"({isl_expr(a, names)} {e.op.value} {isl_expr(b, names)})"
        case Binary(op=BinaryOp.MUL, lhs=a, rhs=b) if isinstance(a, Literal) or isinstance(b, Literal):
            return f"({isl_expr(a, names)} * {isl_expr(b, names)})"
        case Binary(op=BinaryOp.DIV | BinaryOp.MOD, lhs=a, rhs=Literal(value=d)) if int(d) > 0:
            # C's `/` truncates: floor(a/d) where a >= 0, ceil(a/d) where a < 0, exactly
            x = isl_expr(a, names)
            q = f"max(floor({x} / {int(d)}), min(ceil({x} / {int(d)}), 0))"
            return q if e.op is BinaryOp.DIV else f"({x} - {int(d)} * {q})"
        case Call(fn="min" | "max", args=(a, b)) if e.dtype.is_int:
            return f"{e.fn}({isl_expr(a, names)}, {isl_expr(b, names)})"
        case Call(fn="floordiv", args=(a, Literal(value=d))) if int(d) > 0:
            return f"floor({isl_expr(a, names)} / {int(d)})"
        case Call(fn="floormod", args=(a, Literal(value=d))) if int(d) > 0:
            return f"({isl_expr(a, names)} mod {int(d)})"
    raise _NotAffine(str(e))


def _bound_constraints(var: str, lo: Expr, hi: Expr, names: dict[str, str]) -> list[str]:
    """``lo <= var < hi`` where the bounds may be max(...) and min(...) respectively."""
    def parts(e: Expr, fn: str) -> list[Expr]:
        if isinstance(e, Call) and e.fn == fn:
            return [p for a in e.args for p in parts(a, fn)]
        return [e]
    try:
        return ([f"{var} >= {isl_expr(e, names)}" for e in parts(lo, "max")]
                + [f"{var} < {isl_expr(e, names)}" for e in parts(hi, "min")])
    except _NotAffine as err:
        raise ScheduleError(f"range bound {err} is not affine") from None


@dataclass
class StatementInfo:
    """One isl statement: which TC statement it comes from and whether it is the init."""

    name: str
    index: int            # position of the TC statement
    statement: Statement
    init: bool
    iterators: tuple[str, ...]   # TC index names, in isl dimension order


@dataclass
class Model:
    ctx: isl.Context
    definition: Definition
    params: tuple[str, ...]              # TC size names
    statements: dict[str, StatementInfo]
    domain: isl.UnionSet
    reads: isl.UnionMap
    writes: isl.UnionMap
    order: isl.UnionMap                  # the original, sequential schedule
    # every pair of instances touching one element, one of them writing (no write kills
    # another): what parallel loops must not separate
    dependences: isl.UnionMap = field(init=False)
    # what a schedule that reorders reductions must respect: ``dependences`` less those
    # between two instances of one reduction statement, which only fix an order that
    # associativity lets us change (as TC does)
    relaxed: isl.UnionMap = field(init=False)

    @functools.cached_property
    def exact(self) -> isl.UnionMap:
        """What a schedule in the original reduction order must respect (exact, with
        kills); computed where one is asked for (``reorder_reductions`` off): its two
        dataflow analyses were half of a model's."""
        return dependences(self, kills=True)

    def param_space(self) -> str:
        return "[" + ", ".join(f"s_{p}" for p in self.params) + "]"

    def context(self, sizes: dict[str, int] | None = None, symbolic: frozenset[str] = frozenset()) -> isl.Set:
        """Every size >= 1, or fixed to ``sizes`` but for those in ``symbolic``, which
        range over 1 to :data:`SYMBOLIC_MAX`."""
        cons = [f"s_{p} = {sizes[p]}" if sizes and p not in symbolic else
                f"1 <= s_{p} <= {SYMBOLIC_MAX}" if p in symbolic else f"s_{p} >= 1" for p in self.params]
        return isl.Set.read_from_str(self.ctx, f"{self.param_space()} -> {{ : {' and '.join(cons) or '1 = 1'} }}")


SYMBOLIC_MAX = (1 << 30) - 1
"""The largest value a kernel compiled for symbolic sizes takes a size to have (a tile
of 1 << 30, the schedule's "not tiled", then covers a whole dimension); calls outside
1 to SYMBOLIC_MAX get a kernel specialized to their sizes."""


def skipped_inits(d: Definition) -> set[int]:
    """Statements whose ``+=!`` needs no init statement: the first writers of a tensor
    that provably cover all of it, which the runtime hands over zero-filled (and zeroes
    when the caller gives the output with ``out=``; a partial writer keeps its init, so
    the elements it does not write keep the caller's contents)."""
    first: dict[str, int] = {}
    for k, st in enumerate(d.statements):
        first.setdefault(st.tensor, k)
    return {k for t, k in first.items() if d.statements[k].op is ReduceOp.ADD
            and d.statements[k].init and covers(d.statements[k], d.tensor(t).shape)}


def covers(st: Statement, shape: tuple[Expr, ...]) -> bool:
    """Whether ``st``'s left-hand side ranges are ``0:extent`` for every size (symbolically)."""
    try:
        return all(to_sympy(st.range_of(i).lo) == 0 and sympy.expand(to_sympy(st.range_of(i).hi)
                                                                      - to_sympy(dim)) == 0
                   for i, dim in zip(st.indices, shape))
    except (ValueError, KeyError, TypeError):
        return False


def initial_outputs(d: Definition) -> tuple[str, ...]:
    """Outputs whose initial contents the definition reads, in declared order: those whose
    first writer reduces without ``!`` (TC's ``C(m,n) += ...``), accumulating into what
    the caller passed. A call must give them (``out=``); nothing zeroes them."""
    first: dict[str, Statement] = {}
    for st in d.statements:
        first.setdefault(st.tensor, st)
    return tuple(t.name for t in d.outputs if t.name in first
                 and first[t.name].op is not ReduceOp.ASSIGN and not first[t.name].init)


def zero_filled_outputs(d: Definition, sizes: dict[str, int]) -> set[str]:
    """Outputs the runtime must zero before the kernel runs: those whose first writer
    relies on it (a ``+=!`` without its init) or does not cover the whole tensor. Never
    those whose initial contents the definition reads (:func:`initial_outputs`)."""
    return {st.tensor for st, relies in first_writers(d)
            if relies or not all(evaluate_int(st.range_of(i).lo, sizes) <= 0
                                 and evaluate_int(st.range_of(i).hi, sizes) >= evaluate_int(dim, sizes)
                                 for i, dim in zip(st.indices, d.tensor(st.tensor).shape))}


def first_writers(d: Definition) -> list[tuple[Statement, bool]]:
    """The first statement writing each output whose initial contents the definition
    does not read, and whether it relies on zeros (a ``+=!`` without its init): the
    rest needs zeros where its ranges do not cover the output."""
    skipped = skipped_inits(d)
    seen: set[str] = set(initial_outputs(d))
    out = []
    for k, st in enumerate(d.statements):
        if st.tensor not in seen:
            seen.add(st.tensor)
            out.append((st, k in skipped))
    return out


def build_model(d: Definition, ctx: isl.Context | None = None) -> Model:
    ctx = ctx or isl.Context()
    params = d.sizes
    sizes = {p: f"s_{p}" for p in params}
    statements: dict[str, StatementInfo] = {}
    domains, reads, writes, order = [], [], [], []
    depth = max((len(s.ranges) for s in d.statements), default=0)
    skipped = skipped_inits(d)
    for k, st in enumerate(d.statements):
        full = loop_indices(st)   # the order the options' band members take
        # outputs start zero-filled, so a sum's first writer needs no init statement
        variants = ([(f"I{k}", st.indices, True)] if st.init and k not in skipped else []) + \
            [(f"S{k}", full, False)]
        for name, its, init in variants:
            statements[name] = StatementInfo(name, k, st, init, its)
            names = dict(sizes) | {n: f"t{j}" for j, n in enumerate(its)}
            tup = f"{name}[{', '.join(names[n] for n in its)}]"
            cons = [c for n in its for c in _bound_constraints(names[n], st.range_of(n).lo,
                                                               st.range_of(n).hi, names)]
            domains.append(f"{tup} : {' and '.join(cons) or '1 = 1'}")
            lhs = ", ".join(names[n] for n in st.indices)
            writes.append(f"{tup} -> {st.tensor}[{lhs}]")
            if not init:
                if st.op.value:  # a reduction also reads what it accumulates into
                    reads.append(f"{tup} -> {st.tensor}[{lhs}]")
                reads += [_access(r, tup, names, d) for r in walk(st.rhs) if isinstance(r, Read)]
            position = 2 * k + (0 if init else 1)
            order.append(f"{tup} -> [{', '.join([str(position)] + [names[n] for n in its] + ['0'] * (depth - len(its)))}]")
    space = "[" + ", ".join(sizes.values()) + "]"

    def union_set(parts: list[str]) -> isl.UnionSet:
        return isl.UnionSet.read_from_str(ctx, f"{space} -> {{ {'; '.join(parts)} }}")

    def union_map(parts: list[str]) -> isl.UnionMap:
        text = f"{space} -> {{ {'; '.join(parts)} }}" if parts else f"{space} -> {{ }}"
        return isl.UnionMap.read_from_str(ctx, text)

    domain = union_set(domains)
    model = Model(ctx, d, params, statements, domain,
                  union_map(reads).intersect_domain(domain),
                  union_map(writes).intersect_domain(domain),
                  union_map(order).intersect_domain(domain))
    model.dependences = dependences(model, kills=False)
    model.relaxed = model.dependences
    for name, info in statements.items():
        if not info.init and info.statement.op is not ReduceOp.ASSIGN:
            dims = ", ".join(f"t{j}" for j in range(len(info.iterators)))
            instances = isl.UnionSet.read_from_str(ctx, f"{space} -> {{ {name}[{dims}] }}")
            own = model.dependences.intersect_domain(instances).intersect_range(instances)
            model.relaxed = model.relaxed.subtract(own)
    return model


def _access(r: Read, tup: str, names: dict[str, str], d: Definition) -> str:
    try:
        return f"{tup} -> {r.tensor}[{', '.join(isl_expr(i, names) for i in r.indices)}]"
    except _NotAffine:
        shape = d.tensor(r.tensor).shape
        outs = [f"o{j}" for j in range(len(shape))]
        try:
            cons = [f"0 <= o{j} < {isl_expr(s, names)}" for j, s in enumerate(shape)]
        except _NotAffine:
            cons = []
        return f"{tup} -> {r.tensor}[{', '.join(outs)}] : {' and '.join(cons) or '1 = 1'}"


def dependences(m: Model, kills: bool) -> isl.UnionMap:
    """Flow, anti and output dependences under the original order.

    With ``kills`` a write hides the writes before it (exact dataflow). Without, every
    write is only a *may* source: a statement reading a sum then depends on every step
    of the sum, not just the last in the original order, which stays right once the
    scheduler reorders the steps of a reduction.
    """
    def flow(sink: isl.UnionMap, sources: isl.UnionMap, must: isl.UnionMap | None) -> isl.UnionMap:
        info = isl.UnionAccessInfo.from_sink(sink).set_may_source(sources)
        if must is not None:
            info = info.set_must_source(must)
        return info.set_schedule_map(m.order).compute_flow().get_may_dependence()

    if kills:
        return flow(m.reads, m.writes.subtract(m.writes), m.writes).union(
            flow(m.writes, m.reads, m.writes))
    return flow(m.reads, m.writes, None).union(flow(m.writes, m.reads.union(m.writes), None))
