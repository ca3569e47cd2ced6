"""Sizes of a definition: fixed by the shapes of its tensor arguments
(:func:`sizes_of_shapes`), then bound into it (:func:`bind_sizes`: every size name becomes
a constant)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from polyfuse.errors import ShapeError
from polyfuse.ir.comprehension import (Binary, BinaryOp, Call, Definition, Expr, Literal, Range, SizeVar, Statement,
                                       TensorDecl, map_expr, walk)
from polyfuse.ir.symbolic import canonical, zero_divisor
from polyfuse.ir.types import DType


def bind_sizes(d: Definition, sizes: Mapping[str, int]) -> Definition:
    """``d`` with each size in ``sizes`` replaced by its value; shapes and ranges folded."""

    def substitute(e: Expr) -> Expr:
        if isinstance(e, SizeVar) and e.name in sizes:
            return Literal(int(sizes[e.name]), DType.INT32, e.loc)
        return e

    def fold_tensor(t: TensorDecl) -> TensorDecl:
        return replace(t, shape=tuple(canonical(map_expr(s, substitute)) for s in t.shape))

    def fold_statement(s: Statement, sized: bool) -> Statement:
        return replace(s, rhs=map_expr(s.rhs, substitute) if sized else s.rhs,
                       ranges=tuple(Range(r.index, canonical(map_expr(r.lo, substitute)),
                                          canonical(map_expr(r.hi, substitute))) for r in s.ranges))

    params = tuple(fold_tensor(p) if isinstance(p, TensorDecl) else p for p in d.params)
    return replace(d, params=params, outputs=tuple(fold_tensor(t) for t in d.outputs),
                   statements=tuple(fold_statement(s, sized)
                                    for s, sized in zip(d.statements, _remembered(d, "sized bodies", _sized_bodies))))


def _sized_bodies(d: Definition) -> tuple[bool, ...]:
    """Whether each statement's body names a size (most do not: binding a symbolic
    kernel at each new size then walks only shapes and ranges)."""
    return tuple(any(isinstance(n, SizeVar) for n in walk(s.rhs)) for s in d.statements)


def _divisions(d: Definition) -> tuple[tuple[str, Expr], ...]:
    """The output extents and statement bounds that divide (most divide by nothing:
    checking the sizes of each new call then reads none)."""
    bounds = [(f"the size of output '{t.name}'", e) for t in d.outputs for e in t.shape]
    bounds += [(f"the range of '{r.index}' in the statement writing '{s.tensor}'", e)
               for s in d.statements for r in s.ranges for e in (r.lo, r.hi)]
    return tuple((where, e) for where, e in bounds if any(
        isinstance(n, Binary) and n.op in (BinaryOp.DIV, BinaryOp.MOD)
        or isinstance(n, Call) and n.fn in ("floordiv", "floormod") for n in walk(e)))


T = TypeVar("T")


def _remembered(d: Definition, what: str, fn: Callable[[Definition], T]) -> T:
    """``fn(d)``, a fact of the definition's structure, computed once per definition (the
    latest 512 kept, each with its definition, so an id is not reused while kept)."""
    with _FACTS_LOCK:
        found = _FACTS.get((id(d), what))
        if found is not None and found[0] is d:
            return found[1]  # type: ignore[return-value]
    value = fn(d)
    with _FACTS_LOCK:
        _FACTS[(id(d), what)] = (d, value)
        while len(_FACTS) > 512:
            del _FACTS[next(iter(_FACTS))]
    return value


_FACTS: dict[tuple[int, str], tuple[Definition, object]] = {}
_FACTS_LOCK = threading.Lock()


def sizes_of_shapes(d: Definition, shapes: Sequence[tuple[int, ...] | None]) -> dict[str, int]:
    """The value of every size the shapes of ``d``'s tensor arguments fix (one shape per
    parameter, in order; None for a scalar), checked: a size two dimensions give must
    agree, a literal dimension must match, and no output shape or statement range may
    divide by a size expression that is 0 here (each a :class:`ShapeError`). Ranks are
    the caller's to check."""
    sizes: dict[str, int] = {}
    origin: dict[str, str] = {}
    for p, shape in zip(d.params, shapes):
        if shape is None or not isinstance(p, TensorDecl):
            continue
        for dim, (expr, extent) in enumerate(zip(p.shape, shape)):
            where = f"dimension {dim} of '{p.name}'"
            if isinstance(expr, SizeVar):
                if expr.name in sizes and sizes[expr.name] != extent:
                    raise ShapeError(
                        f"{d.name}: size {expr.name} is {sizes[expr.name]} from {origin[expr.name]} "
                        f"but {extent} from {where} (shape {shape})")
                sizes.setdefault(expr.name, int(extent))
                origin.setdefault(expr.name, f"{where} (shape {shape})")
            elif isinstance(expr, Literal) and int(expr.value) != extent:
                raise ShapeError(f"{d.name}: {where} must be {expr.value}, got {extent} "
                                 f"(shape {shape})")
    _check_divisors(d, sizes, origin)
    return sizes


def _check_divisors(d: Definition, sizes: dict[str, int], origin: dict[str, str]) -> None:
    """No output shape or statement range divides by a size expression that is 0 here."""
    for where, e in _remembered(d, "divisions", _divisions):
        divisor = zero_divisor(e, sizes)
        if divisor is None:
            continue
        zeros = [f"{n.name} = 0 from {origin[n.name]}" for n in walk(divisor)
                 if isinstance(n, SizeVar) and sizes.get(n.name) == 0]
        fix = ("pass arguments with at least one element along it" if zeros else
               "pass arguments whose sizes make it nonzero")
        raise ShapeError(f"{d.name}: {where} is {e}, which divides by {divisor} = 0 for these "
                         f"arguments ({'; '.join(zeros) or 'sizes ' + str(sizes)}); a size a shape "
                         f"or range divides by must be nonzero: {fix}")
