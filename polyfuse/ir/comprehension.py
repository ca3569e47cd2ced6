"""Comprehension IR: what one TC ``def`` means.

A :class:`Definition` has input tensors and scalars, output tensors (temporaries
included, as TC requires) and an ordered list of :class:`Statement` s
``T(i, j) op= expr where i in lo:hi, ...``. Every statement carries the rectangular
range of each of its indices (inferred by the TC front end, or given). Expressions are
fully typed: operands of an arithmetic node share its dtype, implicit conversions are
explicit :class:`Cast` nodes. Index expressions and range bounds use the same nodes
with integer types; integer ``/`` and ``%`` round toward minus infinity.

The bitwise operators ``& | ^ ~`` and the shifts ``<< >>`` take integers. A shift by
a count outside ``[0, bits)`` of its type gives what the sign fill alone gives (0, or
-1 for ``>>`` of a negative value), as numpy and ONNX define it; ``>>`` is arithmetic
on signed types and logical on unsigned ones.

``str(node)`` is the node's TC text; the TC front end parses it back to an equal node.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace

from polyfuse.errors import SourceLocation
from polyfuse.ir.types import DType

Loc = SourceLocation | None


def _loc() -> Loc:
    return field(default=None, compare=False, repr=False)  # type: ignore[return-value]


class UnaryOp(enum.Enum):
    NEG = "-"
    NOT = "!"
    BIT_NOT = "~"


class BinaryOp(enum.Enum):
    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"
    MOD = "%"
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    EQ = "=="
    NE = "!="
    AND = "&&"
    OR = "||"
    BIT_AND = "&"
    BIT_OR = "|"
    BIT_XOR = "^"
    SHL = "<<"
    SHR = ">>"

    @property
    def is_bitwise(self) -> bool:
        """An operator on the bits of integers (the shifts included)."""
        return self in (BinaryOp.BIT_AND, BinaryOp.BIT_OR, BinaryOp.BIT_XOR, BinaryOp.SHL,
                        BinaryOp.SHR)

    @property
    def is_shift(self) -> bool:
        return self in (BinaryOp.SHL, BinaryOp.SHR)

    @property
    def is_comparison(self) -> bool:
        return self in (BinaryOp.LT, BinaryOp.LE, BinaryOp.GT, BinaryOp.GE, BinaryOp.EQ,
                        BinaryOp.NE)

    @property
    def is_logical(self) -> bool:
        return self in (BinaryOp.AND, BinaryOp.OR)


class ReduceOp(enum.Enum):
    """How a statement combines its value into the tensor; ``ASSIGN`` is plain ``=``."""

    ASSIGN = ""
    ADD = "+"
    MUL = "*"
    MAX = "max"
    MIN = "min"

    def token(self, init: bool) -> str:
        return "=" if self is ReduceOp.ASSIGN else f"{self.value}={'!' if init else ''}"


class Expr:
    """Base of expression nodes; every subclass has a ``dtype``."""

    __slots__ = ()
    dtype: DType

    def __str__(self) -> str:
        return format_expr(self)


@dataclass(frozen=True, slots=True)
class Literal(Expr):
    value: int | float | bool
    dtype: DType
    loc: Loc = _loc()


@dataclass(frozen=True, slots=True)
class IndexVar(Expr):
    """A statement index (``i`` in ``O(i) = A(i)``)."""

    name: str
    loc: Loc = _loc()

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return DType.INT32


@dataclass(frozen=True, slots=True)
class SizeVar(Expr):
    """A size name from an input's type (``M`` in ``float(M, K) A``), used as an integer."""

    name: str
    loc: Loc = _loc()

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return DType.INT32


@dataclass(frozen=True, slots=True)
class ScalarRef(Expr):
    """A scalar parameter of the definition (``alpha`` in ``float alpha``)."""

    name: str
    dtype: DType
    loc: Loc = _loc()


@dataclass(frozen=True, slots=True)
class LocalRef(Expr):
    """A scalar local of the loop IR (an accumulator kept in a register)."""

    name: str
    dtype: DType
    loc: Loc = _loc()


@dataclass(frozen=True, slots=True)
class Read(Expr):
    """An element of a tensor; indices may be affine or read other tensors (indirect).

    ``checked`` lists the dimensions whose index the target checks when the read runs
    (see :mod:`polyfuse.scheduler.bounds`), besides those that read other tensors: an
    index outside the dimension sets the error buffer and reads element 0 instead.
    """

    tensor: str
    indices: tuple[Expr, ...]
    dtype: DType
    loc: Loc = _loc()
    checked: tuple[int, ...] = ()

    def is_checked(self, dim: int) -> bool:
        """Whether the target checks the index of dimension ``dim`` at run time."""
        return dim in self.checked or any(isinstance(n, Read) for n in walk(self.indices[dim]))


@dataclass(frozen=True, slots=True)
class Unary(Expr):
    op: UnaryOp
    operand: Expr
    dtype: DType
    loc: Loc = _loc()


@dataclass(frozen=True, slots=True)
class Binary(Expr):
    op: BinaryOp
    lhs: Expr
    rhs: Expr
    dtype: DType
    loc: Loc = _loc()


@dataclass(frozen=True, slots=True)
class Select(Expr):
    """``cond ? then : other``; only the chosen side is read."""

    cond: Expr
    then: Expr
    other: Expr
    dtype: DType
    loc: Loc = _loc()


@dataclass(frozen=True, slots=True)
class Cast(Expr):
    dtype: DType
    operand: Expr
    loc: Loc = _loc()


@dataclass(frozen=True, slots=True)
class Call(Expr):
    """A builtin function (see :mod:`polyfuse.ir.builtins`)."""

    fn: str
    args: tuple[Expr, ...]
    dtype: DType
    loc: Loc = _loc()


@dataclass(frozen=True, slots=True)
class Range:
    """``lo <= index < hi``; bounds are integer expressions over sizes."""

    index: str
    lo: Expr
    hi: Expr


@dataclass(frozen=True, slots=True)
class Equivalent:
    """TC's ``<=> name(args)`` after a statement: the reference computation it equals.

    A note for readers and tools, kept and printed as written; it has no effect on code.
    """

    name: str
    args: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Statement:
    tensor: str
    indices: tuple[str, ...]
    op: ReduceOp
    init: bool
    rhs: Expr
    ranges: tuple[Range, ...]
    loc: Loc = _loc()
    equivalent: Equivalent | None = None

    @property
    def reduction_indices(self) -> tuple[str, ...]:
        return tuple(r.index for r in self.ranges if r.index not in self.indices)

    def range_of(self, index: str) -> Range:
        return next(r for r in self.ranges if r.index == index)

    def __str__(self) -> str:
        return format_statement(self)


@dataclass(frozen=True, slots=True)
class TensorDecl:
    name: str
    dtype: DType
    shape: tuple[Expr, ...]
    loc: Loc = _loc()

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(frozen=True, slots=True)
class ScalarDecl:
    name: str
    dtype: DType
    loc: Loc = _loc()


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Definition:
    name: str
    params: tuple[TensorDecl | ScalarDecl, ...]
    outputs: tuple[TensorDecl, ...]
    statements: tuple[Statement, ...]
    loc: Loc = _loc()

    @property
    def inputs(self) -> tuple[TensorDecl, ...]:
        return tuple(p for p in self.params if isinstance(p, TensorDecl))

    @property
    def scalars(self) -> tuple[ScalarDecl, ...]:
        return tuple(p for p in self.params if isinstance(p, ScalarDecl))

    @property
    def sizes(self) -> tuple[str, ...]:
        """Size names bound by the inputs' shapes, in order of first appearance, then
        those only the outputs' shapes or the statements name (a plan's kernel may leave
        them to its caller: :func:`polyfuse.frontends.tc.parse`'s ``given_sizes``)."""
        seen: dict[str, None] = {}
        exprs = [e for t in (*self.inputs, *self.outputs) for e in t.shape]
        exprs += [e for st in self.statements for r in st.ranges for e in (r.lo, r.hi)]
        exprs += [st.rhs for st in self.statements]
        for e in exprs:
            for v in walk(e):
                if isinstance(v, SizeVar):
                    seen.setdefault(v.name)
        return tuple(seen)

    def tensor(self, name: str) -> TensorDecl:
        for t in self.inputs + self.outputs:
            if t.name == name:
                return t
        raise KeyError(name)

    def __str__(self) -> str:
        return format_definition(self)


@dataclass(frozen=True, slots=True)
class Module:
    definitions: tuple[Definition, ...]

    def __getitem__(self, name: str) -> Definition:
        for d in self.definitions:
            if d.name == name:
                return d
        raise KeyError(name)

    def __str__(self) -> str:
        return "\n\n".join(format_definition(d) for d in self.definitions) + "\n"


# --- traversal -----------------------------------------------------------------------

def combine(op: ReduceOp, a: Expr, b: Expr, dtype: DType) -> Expr:
    """``a op b`` for a reduction's ``op`` (+, *, max or min)."""
    if op in (ReduceOp.ADD, ReduceOp.MUL):
        return Binary(BinaryOp.ADD if op is ReduceOp.ADD else BinaryOp.MUL, a, b, dtype)
    return Call(op.value, (a, b), dtype)


def children(e: Expr) -> tuple[Expr, ...]:
    """The operands of ``e``, in order (none for a leaf)."""
    return _operands(type(e))(e)


def _no_operands(e: Expr) -> tuple[Expr, ...]:
    return ()


def _operands(kind: type) -> Callable[[Expr], tuple[Expr, ...]]:
    """How to read the operands of an expression of type ``kind``, found once per type
    (the traversals run millions of times while a model compiles)."""
    found = _OPERANDS.get(kind)
    if found is None:
        found = _OPERANDS[kind] = (
            (lambda e: e.indices) if issubclass(kind, Read)   # type: ignore[attr-defined]
            else (lambda e: (e.operand,)) if issubclass(kind, (Unary, Cast))   # type: ignore[attr-defined]
            else (lambda e: (e.lhs, e.rhs)) if issubclass(kind, Binary)   # type: ignore[attr-defined]
            else (lambda e: (e.cond, e.then, e.other)) if issubclass(kind, Select)   # type: ignore[attr-defined]
            else (lambda e: e.args) if issubclass(kind, Call)   # type: ignore[attr-defined]
            else _no_operands)
    return found


_OPERANDS: dict[type, Callable[[Expr], tuple[Expr, ...]]] = {}


def walk(e: Expr) -> Iterator[Expr]:
    """Every node of ``e``, parents before children, left to right (an explicit stack:
    nested generators cost one per level above each node)."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        operands = _operands(type(node))
        if operands is not _no_operands:
            stack.extend(reversed(operands(node)))


def index_names(e: Expr) -> set[str]:
    """The names of the statement indices ``e`` uses."""
    return {n.name for n in walk(e) if isinstance(n, IndexVar)}


def map_expr(e: Expr, fn: Callable[[Expr], Expr]) -> Expr:
    """Rebuild ``e`` bottom-up, replacing each node by ``fn(node with mapped children)``."""
    kids = children(e)
    if kids:
        new = tuple(map_expr(c, fn) for c in kids)
        if any(a is not b for a, b in zip(new, kids)):   # (identity: equality compares whole subtrees)
            e = with_children(e, new)
    return fn(e)


def with_children(e: Expr, new: tuple[Expr, ...]) -> Expr:
    """``e`` with its children (in :func:`children` order) replaced by ``new``."""
    match e:
        case Read():
            return replace(e, indices=new)
        case Unary() | Cast():
            return replace(e, operand=new[0])
        case Binary():
            return replace(e, lhs=new[0], rhs=new[1])
        case Select():
            return replace(e, cond=new[0], then=new[1], other=new[2])
        case Call():
            return replace(e, args=new)
    raise TypeError(type(e).__name__)


def map_definition_exprs(d: Definition, fn: Callable[[Expr], Expr]) -> Definition:
    """Apply ``map_expr(·, fn)`` to every expression of a definition (shapes, ranges, bodies)."""

    def tensor(t: TensorDecl) -> TensorDecl:
        return replace(t, shape=tuple(map_expr(s, fn) for s in t.shape))

    def statement(s: Statement) -> Statement:
        ranges = tuple(Range(r.index, map_expr(r.lo, fn), map_expr(r.hi, fn)) for r in s.ranges)
        return replace(s, rhs=map_expr(s.rhs, fn), ranges=ranges)

    params = tuple(tensor(p) if isinstance(p, TensorDecl) else p for p in d.params)
    return replace(d, params=params, outputs=tuple(tensor(t) for t in d.outputs),
                   statements=tuple(statement(s) for s in d.statements))


# --- printing (TC text) ----------------------------------------------------------------

# C's precedence levels
_PREC = {BinaryOp.OR: 2, BinaryOp.AND: 3, BinaryOp.BIT_OR: 4, BinaryOp.BIT_XOR: 5,
         BinaryOp.BIT_AND: 6, BinaryOp.EQ: 7, BinaryOp.NE: 7, BinaryOp.LT: 8, BinaryOp.LE: 8,
         BinaryOp.GT: 8, BinaryOp.GE: 8, BinaryOp.SHL: 9, BinaryOp.SHR: 9, BinaryOp.ADD: 10,
         BinaryOp.SUB: 10, BinaryOp.MUL: 11, BinaryOp.DIV: 11, BinaryOp.MOD: 11}
_PREC_SELECT, _PREC_UNARY, _PREC_ATOM = 1, 12, 13


def _prec(e: Expr) -> int:
    match e:
        case Binary(op=op):
            return _PREC[op]
        case Select():
            return _PREC_SELECT
        case Unary():
            return _PREC_UNARY
        case Literal(value=v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
            return _PREC_UNARY
    return _PREC_ATOM


def _literal(e: Literal, int_type: DType) -> str:
    v = e.value
    if e.dtype is DType.BOOL:
        return f"bool({int(bool(v))})"
    if e.dtype is int_type:
        return str(int(v))
    if e.dtype is DType.FLOAT32:
        return repr(float(v))
    return f"{e.dtype}({repr(float(v)) if e.dtype.is_float else int(v)})"


def format_expr(e: Expr, int_type: DType = DType.INT32) -> str:
    """TC text of ``e``; integer literals of ``int_type`` print bare (int64 in loop IR)."""
    def sub(c: Expr, min_prec: int) -> str:
        text = format_expr(c, int_type)
        return f"({text})" if _prec(c) < min_prec else text

    match e:
        case Literal():
            return _literal(e, int_type)
        case IndexVar(name=n) | SizeVar(name=n) | ScalarRef(name=n) | LocalRef(name=n):
            return n
        case Read(tensor=t, indices=ix, checked=checked):
            shown = (format_expr(i, int_type) for i in ix)
            return f"{t}({', '.join(f'checked({i})' if k in checked else i for k, i in enumerate(shown))})"
        case Unary(op=op, operand=a):
            return f"{op.value}{sub(a, _PREC_UNARY)}"
        case Binary(op=op, lhs=a, rhs=b):
            p = _PREC[op]
            return f"{sub(a, p)} {op.value} {sub(b, p + 1)}"
        case Select(cond=c, then=a, other=b):
            return f"{sub(c, _PREC_SELECT + 1)} ? {sub(a, _PREC_SELECT + 1)} : {sub(b, _PREC_SELECT)}"
        case Cast(dtype=dt, operand=a):
            return f"{dt}({format_expr(a, int_type)})"
        case Call(fn=fn, args=args):
            return f"{fn}({', '.join(format_expr(a, int_type) for a in args)})"
    raise TypeError(f"not an expression: {e!r}")


def format_statement(s: Statement) -> str:
    head = f"{s.tensor}({', '.join(s.indices)}) {s.op.token(s.init)} {format_expr(s.rhs)}"
    if s.equivalent is not None:
        args = ", ".join(format_expr(a) for a in s.equivalent.args)
        head += f" <=> {s.equivalent.name}({args})"
    if not s.ranges:
        return head
    where = ", ".join(f"{r.index} in {format_expr(r.lo)}:{format_expr(r.hi)}" for r in s.ranges)
    return f"{head}\n    where {where}"


def _format_tensor(t: TensorDecl) -> str:
    return f"{t.dtype}({', '.join(format_expr(s) for s in t.shape)}) {t.name}"


def format_definition(d: Definition) -> str:
    params = ", ".join(_format_tensor(p) if isinstance(p, TensorDecl) else f"{p.dtype} {p.name}"
                       for p in d.params)
    outputs = ", ".join(_format_tensor(t) for t in d.outputs)
    body = "\n".join("  " + format_statement(s).replace("\n", "\n  ") for s in d.statements)
    return f"def {d.name}({params}) -> ({outputs}) {{\n{body}\n}}"


def node_fields(node: object) -> dict[str, object]:
    """The compared fields of an IR node, for generic passes and debugging."""
    return {f.name: getattr(node, f.name) for f in fields(node) if f.compare}  # type: ignore[arg-type]
