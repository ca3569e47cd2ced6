"""What reverse mode needs to know about a forward definition: which value of a tensor
each statement reads and writes (its versions), checked to be differentiable.

A statement writing ``T`` makes a new version of ``T``; the version it replaces is its
*old* one. Reads in a statement see the latest version of each tensor before it
(inputs have one version, ``None``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import sympy

from polyfuse.errors import TCSemanticError
from polyfuse.ir.comprehension import (Definition, Expr, IndexVar, Read, ReduceOp, Statement,
                                       TensorDecl, children)
from polyfuse.lowering.autodiff.scatter import _provably

Version = tuple[str, int | None]   # (tensor, index of the statement that wrote it; None: input)


class GradientError(TCSemanticError):
    """A definition, or one statement of it, that reverse mode cannot differentiate."""


def value_reads(e: Expr) -> Iterator[Read]:
    """The reads whose values ``e`` computes with (not those inside index expressions)."""
    if isinstance(e, Read):
        yield e
        return
    for c in children(e):
        yield from value_reads(c)


def reads(e: Expr) -> Iterator[Read]:
    """Every read of ``e``, those in index expressions too."""
    if isinstance(e, Read):
        yield e
        for i in e.indices:
            yield from reads(i)
        return
    for c in children(e):
        yield from reads(c)


@dataclass
class Forward:
    """The versions of a definition's tensors."""

    definition: Definition
    source: str | None
    old: list[int | None]              # per statement: the version it replaces
    final: dict[str, int]              # per output: the statement of its last write

    @staticmethod
    def of(d: Definition, source: str | None = None) -> Forward:
        latest: dict[str, int] = {}
        old: list[int | None] = []
        outputs = {t.name for t in d.outputs}
        fwd = Forward(d, source, old, {})
        for k, s in enumerate(d.statements):
            for r in reads(s.rhs):
                if r.tensor in outputs and r.tensor not in latest:
                    raise fwd.error(f"'{s.tensor}' reads '{r.tensor}' before any statement writes "
                                    "it, so its value (the caller's out= contents) has no gradient", s)
                if r.tensor == s.tensor and (s.op is not ReduceOp.ASSIGN or r.indices !=
                                             tuple(IndexVar(i) for i in s.indices)):
                    raise fwd.error(f"the statement writing '{s.tensor}' also reads it "
                                    f"({r}) other than as its own element in an '=': which value it "
                                    "sees depends on the order of the loops", s,
                                    hint="write the new value into another temporary output")
            if s.op is not ReduceOp.ASSIGN and not s.init and s.tensor not in latest:
                raise fwd.error(f"'{s.tensor}' accumulates into the caller's out= contents, "
                                "which have no gradient", s, hint=f"start it with '{s.op.token(True)}'")
            old.append(latest.get(s.tensor))
            latest[s.tensor] = k
        fwd.final.update(latest)
        return fwd

    def error(self, message: str, s: Statement, node: Expr | None = None,
              hint: str | None = None) -> GradientError:
        loc = getattr(node, "loc", None) or s.loc
        return GradientError(f"cannot differentiate the statement writing '{s.tensor}': {message}",
                             loc, self.source, hint=hint)

    @property
    def statements(self) -> tuple[Statement, ...]:
        return self.definition.statements

    def tensor(self, name: str) -> TensorDecl:
        return self.definition.tensor(name)

    def version_at(self, k: int, tensor: str) -> Version:
        """The version of ``tensor`` that statement ``k`` reads."""
        if tensor == self.statements[k].tensor:
            return tensor, self.old[k]
        written = [j for j in range(k) if self.statements[j].tensor == tensor]
        return tensor, written[-1] if written else None

    def is_final(self, v: Version) -> bool:
        return v[1] is not None and self.final.get(v[0]) == v[1]

    def covers(self, k: int) -> bool:
        """Whether statement ``k`` writes every element of its tensor."""
        s = self.statements[k]
        shape = self.tensor(s.tensor).shape
        return all(_provably(s.range_of(i).hi, extent) and _provably(sympy.Integer(0), s.range_of(i).lo)
                   for i, extent in zip(s.indices, shape))

    def replaces(self, k: int) -> bool:
        """Whether statement ``k`` leaves nothing of the version it replaces (every element
        written, none accumulated into)."""
        s = self.statements[k]
        return (s.op is ReduceOp.ASSIGN or s.init) and self.covers(k)

    def active(self, wrt: str) -> set[Version]:
        """The versions whose value depends on input ``wrt``."""
        found: set[Version] = {(wrt, None)}
        for k, s in enumerate(self.statements):
            if not self.tensor(s.tensor).dtype.is_float:
                continue
            sources = {self.version_at(k, r.tensor) for r in value_reads(s.rhs) if r.dtype.is_float}
            if self.old[k] is not None and not self.replaces(k):
                sources.add((s.tensor, self.old[k]))
            if sources & found:
                found.add((s.tensor, k))
        return found

