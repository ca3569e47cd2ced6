"""Reverse mode over the statements of one definition, for one input.

The gradient definition walks the forward statements backwards. The adjoint of each
version of a tensor collects *terms* (one statement each, over the whole tensor) from
the statements that read that version and from the next write of the tensor (what it
leaves of the old version); when its own statement is reached, the terms become
statements writing one tensor (``=`` or ``+=!``, then ``+=``) and the statement's reads
get their terms in turn. An adjoint with one whole term is that term's tensor (the
incoming gradient of an output is read where it is). Forward values the chain rule needs
are the definition's inputs, its outputs' final values (given to the gradient), or
recomputed by a copy of the statement that made them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from polyfuse.ir.comprehension import (Binary, BinaryOp, Cast, Definition, Expr, IndexVar, Literal,
                                       Range, Read, ReduceOp, ScalarDecl, ScalarRef, Select, SizeVar,
                                       Statement, TensorDecl, map_expr, walk)
from polyfuse.ir.types import DType
from polyfuse.lowering.autodiff.algebra import (Maybe, add, both, compare, div, lit, mul, select,
                                                substitute)
from polyfuse.lowering.autodiff.derivatives import NotDifferentiable, derivative
from polyfuse.lowering.autodiff.forward import Forward, Version, value_reads
from polyfuse.lowering.autodiff.scatter import Fresh, scatter


@dataclass(frozen=True)
class Term:
    """One contribution to an adjoint: ``A(indices) (+)= rhs where ranges``; ``alias``
    names the tensor when the term is a whole tensor, unchanged."""

    indices: tuple[str, ...]
    rhs: Expr
    ranges: tuple[Range, ...]
    alias: str | None = None


@dataclass(frozen=True)
class Param:
    """A parameter of a gradient definition: ``role`` is ``input`` (a forward input or
    scalar), ``output`` (a forward output's final value) or ``grad`` (the gradient of a
    forward output); ``of`` names the forward tensor or scalar."""

    role: str
    of: str
    name: str


class Backward:
    """Builds the gradient definition of one input of a forward definition."""

    def __init__(self, fwd: Forward, wrt: str) -> None:
        d = fwd.definition
        self.fwd, self.wrt = fwd, wrt
        names = {p.name for p in d.params} | {t.name for t in d.outputs} | set(d.sizes)
        names |= {r.index for s in d.statements for r in s.ranges}
        self.fresh = Fresh(names)
        self.statements: list[Statement] = []
        self.temps: dict[str, TensorDecl] = {}
        self.terms: dict[Version, list[Term]] = {}
        self.values: dict[Version, str] = {}
        self.used: dict[tuple[str, str], str] = {}        # (role, forward name) -> name here
        self.active = fwd.active(wrt)

    # --- the walk ---
    def build(self) -> tuple[Definition, tuple[Param, ...]]:
        fwd = self.fwd
        for t in fwd.definition.outputs:
            version = (t.name, fwd.final[t.name])
            if t.dtype.is_float and version in self.active:
                self.add_term(version, self.whole(t, self.grad_name(t.name)))
        for k in reversed(range(len(fwd.statements))):
            version = (fwd.statements[k].tensor, k)
            if version in self.active:
                adjoint = self.materialize(version)
                if adjoint is not None:
                    self.reverse(k, adjoint)
        x = fwd.tensor(self.wrt)
        out = replace(x, name=self.fresh.name(f"d{x.name}"), loc=None)
        self.materialize((x.name, None), into=out)
        return self.definition(out)

    def reverse(self, k: int, adjoint: str) -> None:
        """The terms statement ``k`` gives the versions it reads, its adjoint known."""
        fwd = self.fwd
        s = fwd.statements[k]
        t = fwd.tensor(s.tensor)
        g = Read(adjoint, tuple(IndexVar(i) for i in s.indices), t.dtype)
        seed, keep = self.seed(k, g)
        for r in dict.fromkeys(value_reads(s.rhs)):
            version = fwd.version_at(k, r.tensor)
            if not r.dtype.is_float or version not in self.active:
                continue
            try:
                partial = derivative(s.rhs, r)
            except NotDifferentiable as err:
                raise fwd.error(f"{err.fn}() {err.reason}", s, err.node) from None
            contribution = mul(seed, self.forward_values(k, partial))
            if contribution is not None:
                self.add_term(version, self.scatter_term(k, r, contribution))
        old = (s.tensor, fwd.old[k])
        if fwd.old[k] is None or old not in self.active:
            return
        inside = None if keep is None else mul(keep, g)
        if fwd.covers(k):
            if inside is not None:
                whole = inside == g
                self.add_term(old, Term(s.indices, inside, tuple(s.range_of(i) for i in s.indices),
                                        adjoint if whole else None))
            return
        written = None
        for i in s.indices:
            r = s.range_of(i)
            written = both(written, both(compare(BinaryOp.LE, r.lo, IndexVar(i)),
                                         compare(BinaryOp.LT, IndexVar(i), r.hi)))
        self.add_term(old, Term(s.indices, select(written, inside, g),  # type: ignore[arg-type]
                                _full(s.indices, t.shape)))

    def seed(self, k: int, g: Read) -> tuple[Expr, Maybe]:
        """The adjoint of one instance of statement ``k``'s right side, and the factor the
        old version's adjoint gets inside the written range (None: 0)."""
        s = self.fwd.statements[k]
        accumulates = not s.init and s.op is not ReduceOp.ASSIGN
        one = lit(1, g.dtype)
        lhs = tuple(IndexVar(i) for i in s.indices)
        if s.op in (ReduceOp.ASSIGN, ReduceOp.ADD):
            return g, one if accumulates else None
        rhs = self.forward_values(k, s.rhs)
        if s.op is ReduceOp.MUL:
            seed = mul(g, self.product_excluding(k, rhs)) if s.reduction_indices else g
            if not accumulates:
                return seed, None  # type: ignore[return-value]
            old = Read(self.value((s.tensor, self.fwd.old[k])), lhs, g.dtype)
            return mul(seed, old), self.product(k, rhs)  # type: ignore[return-value]
        new = Read(self.value((s.tensor, k)), lhs, g.dtype)
        hit = compare(BinaryOp.EQ, rhs, new)
        count = self.count(k, hit, new)
        keep = None
        if accumulates:
            old = Read(self.value((s.tensor, self.fwd.old[k])), lhs, g.dtype)
            keep = select(compare(BinaryOp.EQ, old, new), div(one, count), None)
        return select(hit, div(g, count), None), keep  # type: ignore[return-value]

    # --- helper tensors of *=, max= and min= ---
    def product_excluding(self, k: int, rhs: Expr) -> Read:
        """``E(lhs, red) = prod over red' != red of rhs(red')``: the other factors of a
        product, exact where a factor is 0."""
        s = self.fwd.statements[k]
        red = s.reduction_indices
        taken = Fresh(self.fresh.taken | {r.index for r in s.ranges})
        primes = {i: taken.name(f"{i}_") for i in red}
        same = None
        for i, p in primes.items():
            same = both(same, compare(BinaryOp.EQ, IndexVar(p), IndexVar(i)))
        body = Select(same, lit(1, rhs.dtype), substitute(rhs, {i: IndexVar(p) for i, p in primes.items()}),
                      rhs.dtype)
        ranges = s.ranges + tuple(Range(p, s.range_of(i).lo, s.range_of(i).hi) for i, p in primes.items())
        name = self.temp(f"{s.tensor}_others", rhs.dtype, tuple(s.range_of(i).hi for i in s.indices + red))
        self.emit(Statement(name, s.indices + red, ReduceOp.MUL, True, body, ranges))
        return Read(name, tuple(IndexVar(i) for i in s.indices + red), rhs.dtype)

    def product(self, k: int, rhs: Expr) -> Read:
        s = self.fwd.statements[k]
        name = self.temp(f"{s.tensor}_product", rhs.dtype, tuple(s.range_of(i).hi for i in s.indices))
        self.emit(Statement(name, s.indices, ReduceOp.MUL, True, rhs, s.ranges))
        return Read(name, tuple(IndexVar(i) for i in s.indices), rhs.dtype)

    def count(self, k: int, hit: Expr, new: Read) -> Read:
        """How many instances reach the max (min) of statement ``k``: ties share it."""
        s = self.fwd.statements[k]
        dt = new.dtype
        name = self.temp(f"{s.tensor}_ties", dt, tuple(s.range_of(i).hi for i in s.indices))
        self.emit(Statement(name, s.indices, ReduceOp.ADD, True, Select(hit, lit(1, dt), lit(0, dt), dt),
                            s.ranges))
        lhs = tuple(IndexVar(i) for i in s.indices)
        if not s.init:
            old = Read(self.value((s.tensor, self.fwd.old[k])), lhs, dt)
            self.emit(Statement(name, s.indices, ReduceOp.ADD, False,
                                Select(compare(BinaryOp.EQ, old, new), lit(1, dt), lit(0, dt), dt),
                                tuple(s.range_of(i) for i in s.indices)))
        return Read(name, lhs, dt)

    # --- terms and adjoints ---
    def scatter_term(self, k: int, r: Read, contribution: Expr) -> Term:
        s = self.fwd.statements[k]
        shape = self.fwd.tensor(r.tensor).shape
        sc = scatter(r, s.ranges, s.indices, shape, Fresh(self.fresh.taken | {x.index for x in s.ranges}))
        body = substitute(contribution, sc.values)
        used = {n.name for n in walk(body) if isinstance(n, IndexVar)}
        used |= {n.name for n in walk(sc.guard) if isinstance(n, IndexVar)} if sc.guard is not None else set()
        free = []
        for i in sc.free:
            if i in used:
                free.append(s.range_of(i))
            else:   # a sum of a value that does not depend on i: times the range's length
                r_i = s.range_of(i)
                body = mul(body, Cast(body.dtype, Binary(BinaryOp.SUB, r_i.hi, r_i.lo, r_i.hi.dtype)))  # type: ignore[arg-type]
        guard = self.forward_values(k, sc.guard)   # indirect indices read forward tensors
        rhs = body if guard is None else select(guard, body, None)
        return Term(sc.lhs, rhs, _full(sc.lhs, shape) + tuple(free))  # type: ignore[arg-type]

    def whole(self, t: TensorDecl, name: str) -> Term:
        indices = tuple(self.fresh.name(("i", "j", "k", "l", "m", "n")) for _ in t.shape)
        self.fresh.taken.difference_update(indices)  # index names are local to a statement
        return Term(indices, Read(name, tuple(IndexVar(i) for i in indices), t.dtype),
                    _full(indices, t.shape), alias=name)

    def add_term(self, version: Version, term: Term) -> None:
        self.terms.setdefault(version, []).append(term)

    def materialize(self, version: Version, into: TensorDecl | None = None) -> str | None:
        """The tensor holding the adjoint of ``version`` (None: it is 0), its terms emitted;
        ``into`` is the tensor it must be (the definition's result)."""
        terms = self.terms.pop(version, [])
        if into is None:
            if not terms:
                return None
            if len(terms) == 1 and terms[0].alias is not None:
                return terms[0].alias
            t = self.fwd.tensor(version[0])
            name = self.temp(f"d{version[0]}", t.dtype, t.shape)
        else:
            name = into.name
            if not terms:
                terms = [replace(self.whole(into, into.name), rhs=lit(0, into.dtype), alias=None)]
        for n, term in enumerate(_merged(terms)):
            reduces = len(term.ranges) > len(term.indices)
            op = ReduceOp.ADD if reduces or n else ReduceOp.ASSIGN
            self.emit(Statement(name, term.indices, op, n == 0 and reduces, term.rhs, term.ranges))
        return name

    # --- forward values ---
    def forward_values(self, k: int, e: Maybe) -> Maybe:
        """``e`` (of statement ``k``) reading the tensors that hold the values it read."""
        if e is None:
            return None

        def rename(n: Expr) -> Expr:
            if isinstance(n, Read):
                return replace(n, tensor=self.value(self.fwd.version_at(k, n.tensor)), loc=None)
            return n
        return map_expr(e, rename)

    def value(self, version: Version) -> str:
        fwd = self.fwd
        tensor, k = version
        if k is None:
            return self.use("input", tensor)
        if fwd.is_final(version):
            return self.use("output", tensor)
        if version in self.values:
            return self.values[version]
        t = fwd.tensor(tensor)
        s = fwd.statements[k]
        name = self.values[version] = self.temp(f"{tensor}_{k}", t.dtype, t.shape)
        if fwd.old[k] is not None and not fwd.replaces(k):
            copy = self.whole(t, self.value((tensor, fwd.old[k])))
            self.emit(Statement(name, copy.indices, ReduceOp.ASSIGN, False, copy.rhs, copy.ranges))
        self.emit(Statement(name, s.indices, s.op, s.init, self.forward_values(k, s.rhs), s.ranges))  # type: ignore[arg-type]
        return name

    # --- names and the definition ---
    def grad_name(self, output: str) -> str:
        return self.use("grad", output)

    def use(self, role: str, of: str) -> str:
        key = (role, of)
        if key not in self.used:
            self.used[key] = of if role != "grad" else self.fresh.name(f"d{of}")
        return self.used[key]

    def temp(self, stem: str, dtype, shape: tuple[Expr, ...]) -> str:  # type: ignore[no-untyped-def]
        name = self.fresh.name(stem)
        self.temps[name] = TensorDecl(name, dtype, shape)
        return name

    def emit(self, s: Statement) -> None:
        self.statements.append(s)

    def definition(self, out: TensorDecl) -> tuple[Definition, tuple[Param, ...]]:
        d = self.fwd.definition
        body = tuple(self.statements)
        scalars = {n.name for s in body for n in walk(s.rhs) if isinstance(n, ScalarRef)}
        params: list[Param] = []
        decls: list[TensorDecl | ScalarDecl] = []
        for p in d.params:
            if ("input", p.name) in self.used or p.name in scalars:
                params.append(Param("input", p.name, p.name))
                decls.append(p)
        for role in ("output", "grad"):
            for t in d.outputs:
                name = self.used.get((role, t.name))
                if name is not None:
                    params.append(Param(role, t.name, name))
                    decls.append(TensorDecl(name, t.dtype, tuple(self.size_of(t, j) for j in range(t.rank))))
        outputs = (out, *self.temps.values())
        bound = {n.name for p in decls if isinstance(p, TensorDecl) for n in p.shape if isinstance(n, SizeVar)}
        needed = _sizes(body, outputs)
        for p in d.inputs:
            shape_names = {n.name for n in p.shape if isinstance(n, SizeVar)}
            if (needed - bound) & shape_names and p.name not in {q.of for q in params if q.role == "input"}:
                params.append(Param("input", p.name, p.name))
                decls.append(p)
                bound |= shape_names
        order = {p.name: n for n, p in enumerate(d.params)}
        pairs = sorted(zip(params, decls), key=lambda pd: (pd[0].role != "input", order.get(pd[0].of, 0)))
        params = [p for p, _ in pairs]
        decls = [q for _, q in pairs]
        name = f"{d.name}_grad_{self.wrt}"
        return Definition(name, tuple(decls), outputs, body), tuple(params)

    def size_of(self, t: TensorDecl, j: int) -> Expr:
        """Dimension ``j`` of a parameter holding output ``t`` (or its gradient): a size
        name, a fresh one where ``t``'s size is an expression."""
        e = t.shape[j]
        if isinstance(e, SizeVar | Literal):
            return e
        key = ("size", f"{t.name}.{j}")
        if key not in self.used:
            self.used[key] = self.fresh.name(f"{t.name}_{j}")
        return SizeVar(self.used[key])


def _merged(terms: list[Term]) -> list[Term]:
    """The terms without a reduction summed into one statement (first), then the others."""
    pointwise = [t for t in terms if len(t.ranges) == len(t.indices)]
    if len(pointwise) < 2:
        return pointwise + [t for t in terms if t not in pointwise]
    first = pointwise[0]
    rhs = first.rhs
    for t in pointwise[1:]:
        rhs = add(rhs, substitute(t.rhs, {i: IndexVar(j) for i, j in zip(t.indices, first.indices)}))  # type: ignore[assignment]
    return [replace(first, rhs=rhs, alias=None)] + [t for t in terms if len(t.ranges) > len(t.indices)]


def _full(indices: tuple[str, ...], shape: tuple[Expr, ...]) -> tuple[Range, ...]:
    return tuple(Range(i, Literal(0, DType.INT32), e) for i, e in zip(indices, shape))


def _sizes(body: tuple[Statement, ...], outputs: tuple[TensorDecl, ...]) -> set[str]:
    exprs = [e for t in outputs for e in t.shape]
    exprs += [e for s in body for e in (s.rhs, *(b for r in s.ranges for b in (r.lo, r.hi)))]
    return {n.name for e in exprs for n in walk(e) if isinstance(n, SizeVar)}

