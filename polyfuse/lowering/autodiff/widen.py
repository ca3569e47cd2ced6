"""Definitions retyped to another float type (``float64`` to check gradients, or to run a
``float`` definition on double data)."""

from __future__ import annotations

from dataclasses import fields, replace

from polyfuse.ir.comprehension import Definition, Expr, ScalarDecl, TensorDecl, map_definition_exprs
from polyfuse.ir.types import DType


def widen(d: Definition, dtype: DType = DType.FLOAT64) -> Definition:
    """``d`` with every float type (of tensors, scalars and expressions) made ``dtype``."""
    def expr(e: Expr) -> Expr:
        if "dtype" in {f.name for f in fields(e)} and e.dtype.is_float:  # type: ignore[arg-type]
            return replace(e, dtype=dtype)  # type: ignore[type-var]
        return e

    def decl(p: TensorDecl | ScalarDecl) -> TensorDecl | ScalarDecl:
        return replace(p, dtype=dtype) if p.dtype.is_float else p

    d = map_definition_exprs(d, expr)
    return replace(d, params=tuple(decl(p) for p in d.params),
                   outputs=tuple(decl(t) for t in d.outputs))  # type: ignore[misc]
