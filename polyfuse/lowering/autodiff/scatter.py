"""Where a read's gradient goes: the access ``X(f(i))`` of a statement, turned around.

TC writes a tensor only at plain indices (``dX(a, b) = ...``), so the gradient of a read
``X(e_0, ..., e_r)`` is a statement over one index per dimension of ``X``. Each affine
``e_j`` solves for one forward index (an index of the forward statement's left side
first, then one with coefficient ±1; a coefficient c > 1 adds the guard
``(a - rest) % c == 0``); the solved index's range becomes a guard, unless it is implied.
A dimension left over (an indirect index ``I(b)``, a product or a division of indices, or
one whose indices are already solved) becomes the guard ``a == e_j`` and its indices are
summed over: a scatter-add written as a gather, the only form TC can express.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import sympy

from polyfuse.ir.comprehension import (Binary, BinaryOp, Expr, IndexVar, Literal, Range, Read,
                                       Unary, UnaryOp, walk)
from polyfuse.ir.symbolic import to_sympy
from polyfuse.ir.types import DType
from polyfuse.lowering.autodiff.algebra import both, compare, int_add, int_mul, int_sub, lit, substitute

Affine = tuple[dict[str, int], Expr]
Rest = tuple[Expr, tuple[tuple[str, int], ...]]   # the part without indices, other indices


@dataclass(frozen=True)
class Scatter:
    """The gradient statement's view of one read.

    ``lhs`` names one index per dimension of the read tensor; ``values`` gives each solved
    forward index as an expression of them and of ``free``, the forward indices left to
    sum over; ``guard`` (None: always) says which instances are real.
    """

    lhs: tuple[str, ...]
    values: Mapping[str, Expr]
    free: tuple[str, ...]
    guard: Expr | None


def scatter(read: Read, ranges: tuple[Range, ...], lhs_indices: Collection[str],
            shape: tuple[Expr, ...], fresh: Fresh) -> Scatter:
    """Solve the indices of ``read`` (in a statement with ``ranges``) for the gradient's
    indices over a tensor of ``shape``."""
    by_name = {r.index: r for r in ranges}
    names: list[str | None] = [None] * len(read.indices)
    values: dict[str, Expr] = {}
    guard: Expr | None = None
    solved: set[str] = set()
    for j, e in enumerate(read.indices):            # X(.., v, ..): the gradient's index is v
        if isinstance(e, IndexVar) and e.name not in solved:
            names[j] = e.name
            solved.add(e.name)
            guard = both(guard, _implied_range(e, by_name[e.name], shape[j]))
    while True:
        pick = _pick(read.indices, names, values, solved, lhs_indices)
        if pick is None:
            break
        j, var, coeff, rest = pick
        names[j] = fresh.name(_LHS_NAMES)
        here = _minus(IndexVar(names[j]), *rest)
        if coeff in (1, -1):
            values[var] = here if coeff == 1 else int_sub(lit(0, DType.INT32), here)
        else:
            values[var] = Binary(BinaryOp.DIV, here, lit(coeff, DType.INT32), DType.INT32)
            guard = both(guard, compare(BinaryOp.EQ, Binary(BinaryOp.MOD, here, lit(coeff, DType.INT32),
                                                            DType.INT32), lit(0, DType.INT32)))
        solved.add(var)
    values = _closed(values)
    for var, value in values.items():
        r = by_name[var]
        guard = both(guard, both(compare(BinaryOp.LE, r.lo, value), compare(BinaryOp.LT, value, r.hi)))
    for j, e in enumerate(read.indices):
        if names[j] is None:
            names[j] = fresh.name(_LHS_NAMES)
            guard = both(guard, compare(BinaryOp.EQ, IndexVar(names[j]), substitute(e, values)))
    free = tuple(r.index for r in ranges if r.index not in solved)
    return Scatter(tuple(n for n in names if n is not None), values, free,
                   None if guard is None else substitute(guard, values))


_LHS_NAMES = ("a", "b", "e", "f", "g", "p", "q", "s", "t", "u", "v", "x", "y", "z")


class Fresh:
    """Names not yet used in a definition."""

    def __init__(self, taken: Collection[str]) -> None:
        self.taken = set(taken)

    def name(self, wanted: tuple[str, ...] | str) -> str:
        for w in (wanted,) if isinstance(wanted, str) else wanted:
            if w not in self.taken:
                self.taken.add(w)
                return w
        stem = wanted if isinstance(wanted, str) else wanted[0]
        n = 1
        while f"{stem}{n}" in self.taken:
            n += 1
        self.taken.add(f"{stem}{n}")
        return f"{stem}{n}"


def _pick(indices: tuple[Expr, ...], names: list[str | None], values: dict[str, Expr],
          solved: set[str], lhs_indices: Collection[str]) -> tuple[int, str, int, Rest] | None:
    """The next (dimension, index, coefficient, rest) to solve: forward left-side indices
    first, then coefficients ±1."""
    best, rank = None, None
    for j, e in enumerate(indices):
        if names[j] is not None:
            continue
        form = _affine(substitute(e, values))
        if form is None:
            continue
        coeffs, rest = form
        for var, c in coeffs.items():
            if var in solved:
                continue
            others = tuple((v, k) for v, k in coeffs.items() if v != var)
            key = (var not in lhs_indices, abs(c) != 1)
            if rank is None or key < rank:
                best, rank = (j, var, c, (rest, others)), key
    return best


def _minus(y: Expr, rest: Expr, others: tuple[tuple[str, int], ...]) -> Expr:
    """``y - rest - sum(k * v for v, k in others)``, each term with its own sign."""
    out = int_sub(y, rest)
    for v, k in others:
        out = int_sub(out, int_mul(k, IndexVar(v))) if k > 0 else int_add(out, int_mul(-k, IndexVar(v)))
    return out


def _affine(e: Expr) -> Affine | None:
    """``e`` as {index: coefficient} plus a part without indices, if it is affine."""
    if not any(isinstance(n, IndexVar | Read) for n in walk(e)):
        return {}, e
    match e:
        case IndexVar(name=n):
            return {n: 1}, lit(0, DType.INT32)
        case Unary(op=UnaryOp.NEG, operand=a):
            form = _affine(a)
            if form is None:
                return None
            return {v: -c for v, c in form[0].items()}, int_sub(lit(0, DType.INT32), form[1])
        case Binary(op=BinaryOp.ADD | BinaryOp.SUB as op, lhs=a, rhs=b):
            fa, fb = _affine(a), _affine(b)
            if fa is None or fb is None:
                return None
            sign = 1 if op is BinaryOp.ADD else -1
            coeffs = dict(fa[0])
            for v, c in fb[0].items():
                coeffs[v] = coeffs.get(v, 0) + sign * c
            combine = int_add if op is BinaryOp.ADD else int_sub
            return {v: c for v, c in coeffs.items() if c}, combine(fa[1], fb[1])
        case Binary(op=BinaryOp.MUL, lhs=Literal(value=int(k)), rhs=a) | \
                Binary(op=BinaryOp.MUL, lhs=a, rhs=Literal(value=int(k))):
            form = _affine(a)
            if form is None or k == 0:
                return None
            return {v: k * c for v, c in form[0].items()}, int_mul(k, form[1])
    return None


def _closed(values: dict[str, Expr]) -> dict[str, Expr]:
    """Each solution rewritten until it names no solved index."""
    out = dict(values)
    for _ in range(len(out)):
        out = {v: substitute(e, out) for v, e in out.items()}
    return out


def _implied_range(var: IndexVar, r: Range, extent: Expr) -> Expr | None:
    """The guard ``lo <= var < hi`` for a gradient index over ``0:extent``, or None
    where the bounds hold for every size."""
    lower = None if _provably(sympy.Integer(0), r.lo) else compare(BinaryOp.LE, r.lo, var)
    upper = None if _provably(r.hi, extent) else compare(BinaryOp.LT, var, r.hi)
    return both(lower, upper)


def _provably(a: Expr | sympy.Expr, b: Expr) -> bool:
    """Whether a >= b for all positive sizes."""
    try:
        sa = a if isinstance(a, sympy.Expr) else to_sympy(a)
        return bool(sympy.simplify(sa - to_sympy(b)).is_nonnegative)
    except (ValueError, TypeError):
        return False

