"""TC range inference: the largest rectangular index ranges that read nothing out of bounds.

As TC specifies it: ranges fixed by ``where`` clauses come first; then, round by round,
every index that is the only unknown of some access dimension gets the intersection of
the ranges those dimensions allow (other indices at their extremes, the bound of a
multiple rounding down: ``I(2*h + kh)`` with ``kh in 0:KH`` gives
``h in 0:floordiv(H - KH, 2) + 1``; an index ``I(i / 2)`` divides as C does, toward zero).
Indices left over are ambiguous (they only meet other unknowns) or unconstrained.
All bound arithmetic is exact, in sympy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import sympy

from polyfuse.errors import RangeInferenceError, SourceLocation
from polyfuse.ir.comprehension import (Binary, BinaryOp, Cast, Expr, IndexVar, Literal, Read, index_names,
                                       SizeVar, Unary, UnaryOp, walk)
from polyfuse.ir.symbolic import TruncDiv, size_symbol, to_sympy

Interval = tuple[sympy.Expr, sympy.Expr]  # inclusive [min, max]


@dataclass(frozen=True, slots=True)
class Access:
    """One tensor access that must stay in bounds: ``tensor(indices)`` of size ``shape``."""

    tensor: str
    shape: tuple[sympy.Expr, ...]
    indices: tuple[Expr, ...]

    def __str__(self) -> str:
        return f"{self.tensor}({', '.join(str(i) for i in self.indices)})"


def _has_read(e: Expr) -> bool:
    return any(isinstance(n, Read) for n in walk(e))


def interval(e: Expr, known: Mapping[str, Interval]) -> Interval | None:
    """Bounds of an integer expression over known index ranges, or None if not affine-like."""
    match e:
        case Literal(value=v):
            return sympy.Integer(int(v)), sympy.Integer(int(v))
        case SizeVar(name=n):
            return size_symbol(n), size_symbol(n)
        case IndexVar(name=n):
            return known.get(n)
        case Cast(operand=a) if e.dtype.is_int and a.dtype.is_int:
            return interval(a, known)
        case Unary(op=UnaryOp.NEG, operand=a):
            r = interval(a, known)
            return None if r is None else (-r[1], -r[0])
        case Binary(op=BinaryOp.ADD | BinaryOp.SUB, lhs=a, rhs=b):
            ra, rb = interval(a, known), interval(b, known)
            if ra is None or rb is None:
                return None
            if e.op is BinaryOp.ADD:
                return ra[0] + rb[0], ra[1] + rb[1]
            return ra[0] - rb[1], ra[1] - rb[0]
        case Binary(op=BinaryOp.MUL, lhs=a, rhs=b):
            c, other = _constant_factor(a, b)
            if c is None:
                return None
            r = interval(other, known)
            if r is None:
                return None
            return (c * r[0], c * r[1]) if c >= 0 else (c * r[1], c * r[0])
        case Binary(op=BinaryOp.DIV, lhs=a, rhs=Literal(value=d)) if int(d) > 0:
            r = interval(a, known)  # truncation is monotone in the dividend
            return None if r is None else (TruncDiv(r[0], int(d)), TruncDiv(r[1], int(d)))
    return None


def _constant_factor(a: Expr, b: Expr) -> tuple[int | None, Expr]:
    if isinstance(b, Literal):
        return int(b.value), a
    if isinstance(a, Literal):
        return int(a.value), b
    return None, a


def solve(e: Expr, x: str, lo: sympy.Expr, hi: sympy.Expr,
          known: Mapping[str, Interval]) -> Interval | None:
    """The range of ``x`` that keeps ``lo <= e <= hi`` for all values of the known indices.

    ``x`` must occur once in ``e``; None when ``e`` is not of a form that can be inverted.
    """
    match e:
        case IndexVar(name=n) if n == x:
            return lo, hi
        case Cast(operand=a) if e.dtype.is_int and a.dtype.is_int:
            return solve(a, x, lo, hi, known)
        case Unary(op=UnaryOp.NEG, operand=a):
            return solve(a, x, -hi, -lo, known)
        case Binary(op=BinaryOp.ADD | BinaryOp.SUB, lhs=a, rhs=b):
            a_has, b_has = x in index_names(a), x in index_names(b)
            if a_has == b_has:
                return None
            rest = interval(b if a_has else a, known)
            if rest is None:
                return None
            if a_has:  # a + b or a - b, b known
                if e.op is BinaryOp.ADD:
                    return solve(a, x, lo - rest[0], hi - rest[1], known)
                return solve(a, x, lo + rest[1], hi + rest[0], known)
            if e.op is BinaryOp.ADD:
                return solve(b, x, lo - rest[0], hi - rest[1], known)
            return solve(b, x, rest[1] - hi, rest[0] - lo, known)  # a - b with a known
        case Binary(op=BinaryOp.MUL, lhs=a, rhs=b):
            c, other = _constant_factor(a, b)
            if not c:
                return None
            if c > 0:
                return solve(other, x, sympy.ceiling(lo / c), sympy.floor(hi / c), known)
            return solve(other, x, sympy.ceiling(hi / c), sympy.floor(lo / c), known)
        case Binary(op=BinaryOp.DIV, lhs=a, rhs=Literal(value=d)) if int(d) > 0:
            # a / d truncates, so the quotient 0 comes from -(d-1)..d-1: a reaches d - 1
            # past hi * d when hi >= 0 and d - 1 below lo * d when lo <= 0 (min/max pick
            # the case for integer bounds of unknown sign)
            d = int(d)
            below = sympy.Min(d - 1, sympy.Max(0, (d - 1) * (1 - lo)))
            above = sympy.Min(d - 1, sympy.Max(0, (d - 1) * (hi + 1)))
            return solve(a, x, lo * d - below, hi * d + above, known)
    return None


def infer_ranges(accesses: list[Access], fixed: Mapping[str, Interval],
                 indices: Mapping[str, SourceLocation], source: str,
                 outputs: frozenset[str] = frozenset()) -> dict[str, Interval]:
    """Half-open ``(lo, hi)`` ranges for every index of a statement.

    ``fixed`` holds the half-open ranges of ``where`` clauses; ``indices`` every index of
    the statement with its first location, used in errors; ``outputs`` the indices of
    the left-hand side, which also never go below 0 (tensors start at 0).
    """
    half_open = dict(fixed)
    known: dict[str, Interval] = {n: (lo, hi - 1) for n, (lo, hi) in fixed.items()}
    dims = [(a, e, size) for a in accesses for e, size in zip(a.indices, a.shape)
            if not _has_read(e) and index_names(e)]
    pending = [n for n in indices if n not in known]
    while pending:
        found: dict[str, list[Interval]] = {}
        for access, e, size in dims:
            unknown = index_names(e) & set(pending)
            if len(unknown) != 1:
                continue
            x = unknown.pop()
            r = solve(e, x, sympy.Integer(0), size - 1, known)
            if r is not None:
                found.setdefault(x, []).append(r)
        if not found:
            break
        for x, rs in found.items():
            floor = [sympy.Integer(0)] if x in outputs else []
            half_open[x] = (sympy.Max(*floor, *(r[0] for r in rs)),
                            sympy.Min(*(r[1] + 1 for r in rs)))
            known[x] = (half_open[x][0], half_open[x][1] - 1)
        pending = [n for n in pending if n not in found]
    if pending:
        _unresolved(pending[-1], dims, indices, source)  # reduction indices come last
    return {n: half_open[n] for n in indices}


def _unresolved(x: str, dims: list[tuple[Access, Expr, sympy.Expr]],
                indices: Mapping[str, SourceLocation], source: str) -> None:
    uses = [a for a, e, _ in dims if x in index_names(e)]
    example = f"where {x} in 0:N"
    if uses:
        raise RangeInferenceError(
            f"cannot infer the range of index '{x}': it only appears in accesses together "
            f"with other indices of unknown range ({', '.join(dict.fromkeys(map(str, uses)))})",
            indices[x], source,
            hint=f"give its range with a where clause, e.g. `{example}`")
    raise RangeInferenceError(
        f"cannot infer the range of index '{x}': it is not used to read any tensor of known size",
        indices[x], source, hint=f"give its range with a where clause, e.g. `{example}`")


def access_shape(shape: tuple[Expr, ...]) -> tuple[sympy.Expr, ...]:
    return tuple(to_sympy(s) for s in shape)
