"""Comprehension passes: the rewrites the planner makes to each kernel step's definition,
by name under a pass manager (as the graph and loop passes run), each checked by the
comprehension verifier; ``model.dump("comprehension:<pass>")`` prints each kernel's
definition after one, ``model.dump("comprehension")`` as the op library gave it.

* ``to_channels_last`` (:func:`~polyfuse.lowering.layout.to_channels_last`): a node the
  layout pass runs channels-last reads its input 0 and writes its output 0 permuted;
* ``inline_pointwise`` (:func:`~polyfuse.lowering.compose.inline_pointwise`): a fusion
  group's composed definition with its producers substituted into their readers;
* ``inline_scalars`` (:func:`inline_scalars`): one-element constants read as literals.

Each kernel step keeps its definition after every pass it went through
(:attr:`~polyfuse.ir.steps.KernelStep.history`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import ClassVar

import numpy as np

from polyfuse.ir.comprehension import Binary, BinaryOp, Call, Definition, Expr, Literal, Read, TensorDecl, map_expr
from polyfuse.ir.passes import PassManager
from polyfuse.ir.steps import History
from polyfuse.ir.symbolic import evaluate_int
from polyfuse.ir.types import DType
from polyfuse.ir.verify import verify_definition

DefinitionPass = Callable[[Definition], Definition]


class ComprehensionPassManager(PassManager[Definition]):
    level: ClassVar[str] = "comprehension"
    unit: ClassVar[str] = "definition"

    def check(self, ir: Definition) -> None:
        verify_definition(ir)


def run_definition_passes(history: History, passes: Sequence[DefinitionPass]) -> History:
    """``history`` (a definition after the passes it went through, the latest last)
    continued by ``passes``."""
    manager = ComprehensionPassManager(passes, verify=True, keep=True)
    manager.run(history[-1][1])
    return history + tuple(manager.kept[1:])


def started(d: Definition) -> History:
    """The history of a definition as the op library (or the composition) made it."""
    return (("input", d),)


# element types whose one-element constants become literals in the kernels reading them
_LITERAL_TYPES = (DType.FLOAT32, DType.FLOAT64, DType.INT32, DType.INT64, DType.BOOL)


def inline_scalars(d: Definition, values: Mapping[str, np.ndarray]) -> Definition:
    """``d`` with its one-element constant parameters (``values``, by parameter name, of a
    fixed shape) read as literals and dropped from its parameters, as onnxruntime and TVM
    fold scalar initializers into the kernels using them: a GELU's ``pow(x, 3)`` then is
    ``x * x * x``, not exp and log, and LLVM sees every constant operand."""
    scalars = {p.name: values[p.name].reshape(()).item() for p in d.params
               if isinstance(p, TensorDecl) and p.name in values and values[p.name].size == 1
               and p.dtype in _LITERAL_TYPES and _fixed(p)}
    if not scalars:
        return d
    dtypes = {p.name: p.dtype for p in d.params if p.name in scalars}

    def literal(e: Expr) -> Expr:
        if isinstance(e, Read) and e.tensor in scalars:
            return Literal(scalars[e.tensor], dtypes[e.tensor])
        return _integer_power(e)

    statements = tuple(replace(st, rhs=map_expr(st.rhs, literal)) for st in d.statements)
    return replace(d, params=tuple(p for p in d.params if p.name not in scalars), statements=statements)


def _fixed(p: TensorDecl) -> bool:
    try:
        return all(evaluate_int(s, {}) >= 0 for s in p.shape)
    except ValueError:  # a size that names a symbol: the parameter binds it
        return False


def _integer_power(e: Expr) -> Expr:
    """``pow(x, 2)`` and ``pow(x, 3)`` as products, ``pow(x, 1)`` as ``x`` (as onnxruntime
    computes its Pow with these exponents); other calls unchanged. ``x`` may be any
    expression (a product's element with its bias added, in an epilogue): LLVM computes
    the repeated operand once."""
    if isinstance(e, Call) and e.fn == "pow" and e.dtype.is_float \
            and isinstance(e.args[1], Literal) and e.args[1].value in (1, 2, 3):
        x = e.args[0]
        out = x
        for _ in range(int(e.args[1].value) - 1):
            out = Binary(BinaryOp.MUL, out, x, e.dtype)
        return out
    return e
