"""Composing the TC definitions of a fusion group into one, and inlining producers.

:func:`compose` joins the definitions of a group's members (sizes bound) into one
definition: each graph value the group reads becomes a parameter, each value it
defines a tensor, and each member's temporaries stay private to it. Values read after
the group are its outputs; everything else is a temporary.

:func:`inline_pointwise` then (the planner's comprehension pass of that name) substitutes a temporary's defining expression into the
statements reading it, as Halide's ``compute_inline`` does, when that costs no work:
the producer is a plain ``=`` over the whole tensor with no reduction, each reader is
one too (never a reduction, whose inner loop would then repeat the producer's work),
and the producer is read once, at a different element for each element of the reader
(a squeeze-excite gate's sigmoid read across a whole map stays one per channel), or is
a handful of operations and reads without calls; and the reader's expression stays
within :data:`~polyfuse.ir.limits.MAX_EXPR_DEPTH` (a long chain of elementwise ops
then keeps a temporary every so often instead of one expression too deep for the later
stages to walk). A conv's channels-last
accumulator, its bias, a batch norm, a ReLU and a residual add so become one statement
``Y(n, m, h, w) = max(T(n, h, w, m) + B(m) + R(n, m, h, w), 0)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from polyfuse.ir.comprehension import (Call, Cast, Definition, Expr, IndexVar, Literal, Read,
                                       ReduceOp, Select, Statement, TensorDecl, index_names, map_expr, walk)
from polyfuse.ir.limits import MAX_EXPR_DEPTH, expr_depth
from polyfuse.ir.verify import verify_definition

CHEAP_NODES = 4   # operations and reads of a producer inlined where it is read more than once


@dataclass(frozen=True)
class Member:
    """One node's definition (sizes bound): the graph value bound to each parameter,
    and the graph value of each of its first outputs (later outputs are temporaries)."""

    definition: Definition
    params: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class Composed:
    definition: Definition
    params: tuple[str, ...]    # graph value of each parameter
    outputs: tuple[str, ...]   # graph value of each output the group exports

    @property
    def exports(self) -> set[str]:
        """The tensors of the outputs the group exports (what inlining keeps)."""
        return {t.name for t in self.definition.outputs[:len(self.outputs)]}


def compose(name: str, members: Sequence[Member], exported: set[str]) -> Composed:
    """One definition computing every member in order; ``exported`` values (read after
    the group or graph outputs) become its first outputs. Nothing is inlined yet."""
    tensor_of: dict[str, str] = {}      # graph value -> tensor name in the composition
    params: list[TensorDecl] = []
    param_values: list[str] = []
    decls: dict[str, TensorDecl] = {}   # defined tensors, in order
    statements: list[Statement] = []
    for k, m in enumerate(members):
        d = m.definition
        rename: dict[str, str] = {}
        for p, value in zip(d.inputs, m.params):
            if value not in tensor_of:
                tensor_of[value] = f"v{len(tensor_of)}"
                params.append(replace(p, name=tensor_of[value]))
                param_values.append(value)
            rename[p.name] = tensor_of[value]
        for j, t in enumerate(d.outputs):
            if j < len(m.outputs) and m.outputs[j]:
                tensor_of[m.outputs[j]] = f"v{len(tensor_of)}"
                rename[t.name] = tensor_of[m.outputs[j]]
            else:
                rename[t.name] = f"t{k}_{t.name}"
            decls[rename[t.name]] = replace(t, name=rename[t.name])
        statements += [_rename_statement(s, rename) for s in d.statements]
    value_of = {t: v for v, t in tensor_of.items()}
    exports = [t for t in decls if value_of.get(t) in exported]
    outputs = tuple(decls[t] for t in exports) + tuple(decls[t] for t in decls if t not in exports)
    composed = Definition(name, tuple(params), outputs, tuple(statements))
    verify_definition(composed)
    return Composed(composed, tuple(param_values), tuple(value_of[t] for t in exports))


def _rename_statement(s: Statement, rename: dict[str, str]) -> Statement:
    def fn(e: Expr) -> Expr:
        return replace(e, tensor=rename[e.tensor]) if isinstance(e, Read) and e.tensor in rename else e
    return replace(s, tensor=rename.get(s.tensor, s.tensor), rhs=map_expr(s.rhs, fn))


def inline_pointwise(d: Definition, keep: set[str]) -> Definition:
    """Inline every temporary (not in ``keep``) that can be, then drop the temporaries
    nobody reads any more."""
    statements = list(d.statements)
    changed = True
    while changed:
        changed = False
        for k, s in enumerate(statements):
            readers = _inlinable(statements, k, keep, d)
            if readers is None:
                continue
            inlined = {r: _substitute(statements[r].rhs, s) for r in readers}
            if any(expr_depth(e) > MAX_EXPR_DEPTH for e in inlined.values()):
                continue
            for r, rhs in inlined.items():
                statements[r] = replace(statements[r], rhs=rhs)
            del statements[k]
            changed = True
            break
    read = {e.tensor for s in statements for e in walk(s.rhs) if isinstance(e, Read)}
    outputs = tuple(t for t in d.outputs if t.name in keep or t.name in read)
    kept = [s for s in statements if s.tensor in keep or s.tensor in read]
    return replace(d, outputs=outputs, statements=tuple(kept))


def _inlinable(statements: list[Statement], k: int, keep: set[str],
               d: Definition) -> list[int] | None:
    """The positions of the statements reading ``statements[k]``'s tensor, if it can be
    inlined into all of them; None if not."""
    s = statements[k]
    if s.tensor in keep or s.op is not ReduceOp.ASSIGN or s.reduction_indices or \
            len(set(s.indices)) != len(s.indices) or not _covers(s, d.tensor(s.tensor)):
        return None
    if any(t.tensor == s.tensor for j, t in enumerate(statements) if j != k):
        return None     # another statement writes it too
    sources = {e.tensor for e in walk(s.rhs) if isinstance(e, Read)}
    readers, sites = [], 0
    for j, t in enumerate(statements):
        uses = sum(1 for e in walk(t.rhs) if isinstance(e, Read) and e.tensor == s.tensor)
        if not uses:
            continue
        if j < k or t.op is not ReduceOp.ASSIGN or t.reduction_indices:
            return None
        readers.append(j)
        sites += uses
    if not readers:
        return None
    if any(statements[j].tensor in sources for j in range(k + 1, readers[-1] + 1)):
        return None     # what it reads is overwritten before a reader runs
    operations = [e for e in walk(s.rhs) if not isinstance(e, (IndexVar, Literal))]
    cheap = len(operations) <= CHEAP_NODES and not any(isinstance(e, (Call, Select)) for e in operations)
    if (sites > 1 or any(_broadcasts(statements[j], s.tensor) for j in readers)) and not cheap:
        return None     # the reader would compute it again for many elements
    return readers


def _broadcasts(reader: Statement, tensor: str) -> bool:
    """Whether ``reader`` reads ``tensor`` at the same element for several of its own
    elements (an index of the reader appears in none of the read's indices)."""
    for e in walk(reader.rhs):
        if isinstance(e, Read) and e.tensor == tensor:
            used = set().union(*(index_names(i) for i in e.indices))
            if set(reader.indices) - used:
                return True
    return False


def _covers(s: Statement, t: TensorDecl) -> bool:
    """Whether ``s`` writes every element of ``t`` (ranges 0:extent on every index)."""
    for index, extent in zip(s.indices, t.shape):
        r = s.range_of(index)
        if not (isinstance(r.lo, Literal) and r.lo.value == 0 and r.hi == extent):
            return False
    return len(s.indices) == t.rank


def _substitute(e: Expr, producer: Statement) -> Expr:
    """``e`` with every read of the producer's tensor replaced by its expression."""
    def fn(x: Expr) -> Expr:
        if not (isinstance(x, Read) and x.tensor == producer.tensor):
            return x
        at = dict(zip(producer.indices, x.indices))
        body = map_expr(producer.rhs, lambda v: at[v.name] if isinstance(v, IndexVar) else v)
        return body if body.dtype is x.dtype else Cast(x.dtype, body)
    return map_expr(e, fn)
