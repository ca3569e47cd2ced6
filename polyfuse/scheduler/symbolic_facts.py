"""Loop bounds of a kernel compiled for symbolic sizes, reasoned about with isl.

Where sizes are numbers, a loop's range is an interval and a ``min`` in a bound is
decided by comparing intervals (:func:`polyfuse.ir.loops.interval`). In a kernel whose
sizes are its scalars (``for c3 in 0:min(255, N - c0 - 1) + 1`` inside ``for c0 in 0:N
step 256``), what is known is a set of affine constraints over the sizes and the loop
variables: the bounds of the loops around a statement, the stride of each, and the
conditions of the splits around it. :class:`Facts` holds them as an isl set and decides
a ``min`` or ``max`` when one side holds for every point of the set (isl's emptiness
test); the loop passes get it as a :class:`~polyfuse.ir.cuts.Knowledge`, and
:func:`~polyfuse.ir.cuts.prefix_cut` says where a loop must be split for a ``min``
inside it to be decided before the cut (the full tiles; :mod:`polyfuse.ir.cuts`).

Expressions isl cannot model (a product of variables, a truncating division, a value
read from memory) are not affine here: whatever holds them stays undecided.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import islpy as isl

from polyfuse.ir.comprehension import Binary, Call, Expr, IndexVar, Literal, ScalarRef, Unary, walk
from polyfuse.ir.cuts import NotAffine
from polyfuse.ir.loops import For
from polyfuse.scheduler.model import _NotAffine, isl_expr


def isl_text(e: Expr) -> str:
    """``e`` in isl's syntax (:func:`~polyfuse.scheduler.model.isl_expr`): loop variables
    ``v_<name>``, sizes ``p_<name>``; raises :class:`NotAffine` for what isl cannot model."""
    variables, sizes = _names(e)
    names = {n: f"v_{n}" for n in variables} | {n: f"p_{n}" for n in sizes}
    if len(names) < len(variables) + len(sizes):
        raise NotAffine(f"{e}: a loop variable and a size of one name")
    try:
        return isl_expr(e, names)
    except _NotAffine:
        raise NotAffine(str(e)) from None


def _names(e: Expr) -> tuple[set[str], set[str]]:
    """The loop variables and the int scalars ``e`` reads."""
    return ({n.name for n in walk(e) if isinstance(n, IndexVar)},
            {n.name for n in walk(e) if isinstance(n, ScalarRef) and n.dtype.is_int})


@dataclass(frozen=True)
class Facts:
    """Affine constraints known to hold (isl syntax), over loop variables and sizes."""

    constraints: tuple[str, ...] = ()
    variables: frozenset[str] = frozenset()
    sizes: frozenset[str] = frozenset()

    def adding(self, *exprs: Expr, constraint: str) -> Facts:
        """These facts and ``constraint`` (isl text over ``exprs``' names)."""
        vs, ps = set(self.variables), set(self.sizes)
        for e in exprs:
            v, p = _names(e)
            vs |= v
            ps |= p
        return Facts(self.constraints + (constraint,), frozenset(vs), frozenset(ps))

    def inside(self, loop: For) -> Facts:
        """These facts in ``loop``'s body: its bounds and its stride (unchanged where a
        bound is not affine: that bound is simply not known)."""
        v = IndexVar(loop.var)
        out = self.with_variable(loop.var)
        try:
            lo = isl_text(loop.lo)
            out = out.adding(loop.lo, constraint=f"v_{loop.var} >= {lo}")
            if loop.step > 1:
                out = out.adding(loop.lo, constraint=f"exists (e: v_{loop.var} = {lo} + {loop.step} * e)")
        except NotAffine:
            pass
        try:
            out = out.adding(loop.hi, v, constraint=f"v_{loop.var} < {isl_text(loop.hi)}")
        except NotAffine:
            pass
        return out

    def with_variable(self, var: str) -> Facts:
        return Facts(self.constraints, self.variables | {var}, self.sizes)

    def below(self, var: str, cut: Expr) -> Facts:
        """These facts where ``var < cut``."""
        return self.adding(cut, IndexVar(var), constraint=f"v_{var} < {isl_text(cut)}")

    def at_least(self, var: str, cut: Expr) -> Facts:
        return self.adding(cut, IndexVar(var), constraint=f"v_{var} >= {isl_text(cut)}")

    @cached_property
    def _known(self) -> isl.Set:
        """The facts as an isl set (read once; each question intersects it)."""
        return self._read(self.constraints, self.sizes)

    def _read(self, constraints: tuple[str, ...], sizes: frozenset[str] | set[str]) -> isl.Set:
        params = ", ".join(f"p_{n}" for n in sorted(sizes))
        cons = " and ".join((*constraints, *(f"p_{n} >= 1" for n in sorted(sizes)))) or "1 = 1"
        tup = ", ".join(f"v_{n}" for n in sorted(self.variables))
        return isl.Set.read_from_str(_CTX, f"[{params}] -> {{ [{tup}] : {cons} }}")

    def _set(self, extra: str, exprs: tuple[Expr, ...]) -> isl.Set | None:
        ps: set[str] = set()
        for e in exprs:
            v, p = _names(e)
            if v - self.variables:
                return None   # reads a variable nothing is known of
            ps |= p
        return self._known.intersect(self._read((extra,), ps))   # (isl aligns the sizes)

    def always(self, a: Expr, op: str, b: Expr) -> bool:
        """Whether ``a op b`` (``<=`` or ``<``) holds at every point of these facts."""
        try:
            negated = {"<=": ">", "<": ">="}[op]
            s = self._set(f"{isl_text(a)} {negated} {isl_text(b)}", (a, b))
        except NotAffine:
            return False
        return s is not None and s.is_empty()

    def decide(self, e: Expr, constants: bool = False) -> Expr:
        """``e`` with every two-argument ``min`` and ``max`` that one side always wins
        here replaced by that side (innermost first); with ``constants``, only where that
        side is a number (a loop bound ``min(127, K - c1 - 1)`` then keeps the tile's
        size, which bounds the loop's trips, where the size's side wins; where that side
        is always below the number, the number is lowered by one, the same value: the
        last, partial tile's trips are then bounded below the tile's, and no register
        block as wide as a whole tile, which could never run, is made for it)."""
        if not any(isinstance(n, Call) and n.fn in ("min", "max") for n in walk(e)):
            return e
        match e:
            case Call(fn="min" | "max", args=(a, b)):
                a, b = self.decide(a, constants), self.decide(b, constants)
                if self.always(a, "<=", b):
                    win = a if e.fn == "min" else b
                elif self.always(b, "<=", a):
                    win = b if e.fn == "min" else a
                else:
                    win = None
                if win is not None and (not constants or isinstance(win, Literal)):
                    return win
                if win is not None and e.fn == "min":   # (constants: the size's side wins)
                    a, b = (_lowered(a, b, self), b) if isinstance(a, Literal) else (a, _lowered(b, a, self))
                return Call(e.fn, (a, b), e.dtype)
            case Binary(lhs=a, rhs=b):
                return Binary(e.op, self.decide(a, constants), self.decide(b, constants), e.dtype)
            case Unary(operand=a):
                return Unary(e.op, self.decide(a, constants), e.dtype)
            case Call(args=args):
                return Call(e.fn, tuple(self.decide(x, constants) for x in args), e.dtype)
        return e


def _lowered(number: Expr, other: Expr, facts: Facts) -> Expr:
    """``number`` (a Literal) less one where ``other`` is always below it, else as it is."""
    if isinstance(number, Literal) and facts.always(other, "<", number):
        return Literal(int(number.value) - 1, number.dtype)
    return number


_CTX = isl.Context()
