"""Specialize a definition to concrete sizes: every size name becomes a constant."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from polyfuse.ir.comprehension import (Definition, Expr, Literal, Range, SizeVar, Statement, TensorDecl,
                                       map_definition_exprs)
from polyfuse.ir.symbolic import canonical
from polyfuse.ir.types import DType


def bind_sizes(d: Definition, sizes: Mapping[str, int]) -> Definition:
    """``d`` with each size in ``sizes`` replaced by its value; shapes and ranges folded."""

    def substitute(e: Expr) -> Expr:
        if isinstance(e, SizeVar) and e.name in sizes:
            return Literal(int(sizes[e.name]), DType.INT32, e.loc)
        return e

    bound = map_definition_exprs(d, substitute)

    def fold_tensor(t: TensorDecl) -> TensorDecl:
        return replace(t, shape=tuple(canonical(s) for s in t.shape))

    def fold_statement(s: Statement) -> Statement:
        return replace(s, ranges=tuple(Range(r.index, canonical(r.lo), canonical(r.hi))
                                       for r in s.ranges))

    params = tuple(fold_tensor(p) if isinstance(p, TensorDecl) else p for p in bound.params)
    return replace(bound, params=params, outputs=tuple(fold_tensor(t) for t in bound.outputs),
                   statements=tuple(fold_statement(s) for s in bound.statements))
