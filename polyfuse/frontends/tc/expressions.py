"""Name resolution and type inference for TC expressions: syntax tree -> typed IR.

Literals, indices and size names are *weak*: they take the type of the strongly typed
operand they meet (``A(i) * 2`` stays float16 for a float16 ``A``). Every implicit
conversion becomes an explicit :class:`Cast`; a cast of a literal folds into the literal.
"""

from __future__ import annotations

import difflib

from dataclasses import dataclass, field

from polyfuse.errors import SourceLocation, TCSemanticError
from polyfuse.frontends.tc import ast
from polyfuse.ir.builtins import BUILTINS, BuiltinKind
from polyfuse.ir.comprehension import (Binary, BinaryOp, Call, Cast, Expr, IndexVar, Literal,
                                       Read, ScalarRef, Select, SizeVar, Unary, UnaryOp)
from polyfuse.ir.types import DType, promote


@dataclass(frozen=True, slots=True)
class Typed:
    expr: Expr
    weak: bool

    @property
    def dtype(self) -> DType:
        return self.expr.dtype


@dataclass(slots=True)
class TensorInfo:
    dtype: DType | None
    shape: tuple[Expr, ...] | None   # None until the first statement writing it
    is_input: bool
    written: bool = False
    declared_loc: SourceLocation | None = None


@dataclass(slots=True)
class Scope:
    """What names mean inside one statement."""

    tensors: dict[str, TensorInfo]
    sizes: frozenset[str]
    scalars: dict[str, DType]
    lhs_tensor: str = ""
    lhs_indices: tuple[str, ...] = ()
    lets: dict[str, Typed] = field(default_factory=dict)
    index_locs: dict[str, SourceLocation] = field(default_factory=dict)  # first occurrence


def int_literal(value: int, loc: SourceLocation | None = None) -> Literal:
    return Literal(value, DType.INT32 if -2**31 <= value < 2**31 else DType.INT64, loc)


def cast(e: Expr, dtype: DType) -> Expr:
    """``e`` converted to ``dtype``: no node if it already is, a literal if it is one."""
    if e.dtype is dtype:
        return e
    if isinstance(e, Literal):
        v = e.value
        value = bool(v) if dtype.is_bool else float(v) if dtype.is_float else int(v)
        if dtype.is_unsigned:  # wraps like a C conversion: uint64(-1) is 2**64 - 1
            value = int(value) % 2**dtype.bits
        return Literal(value, dtype, e.loc)
    return Cast(dtype, e, e.loc)


def _join(a: Typed, b: Typed) -> tuple[DType, bool]:
    """The common type of two operands, and whether the result is weak."""
    if a.weak and b.weak:
        if a.dtype.is_float or b.dtype.is_float:
            return DType.FLOAT32, True
        return promote(a.dtype, b.dtype), True
    if a.weak or b.weak:
        weak, strong = (a, b) if a.weak else (b, a)
        if weak.dtype.is_float and not strong.dtype.is_float:
            return DType.FLOAT32, False
        if isinstance(weak.expr, Literal) and weak.dtype.is_int and _signed(strong.dtype) \
                and not -2**(strong.dtype.bits - 1) <= weak.expr.value < 2**(strong.dtype.bits - 1):
            return DType.INT64, False   # as in C: a literal int does not hold is a long
        return (DType.INT32 if strong.dtype.is_bool else strong.dtype), False
    return promote(a.dtype, b.dtype), False


def _signed(dt: DType) -> bool:
    return dt.is_int and not dt.is_unsigned and not dt.is_bool


def _numeric(dt: DType) -> DType:
    return DType.INT32 if dt.is_bool else dt


_BINARY = {op.value: op for op in BinaryOp}


class ExprAnalyzer:
    def __init__(self, scope: Scope, source: str) -> None:
        self.scope = scope
        self.source = source

    def error(self, message: str, loc: SourceLocation, hint: str | None = None) -> TCSemanticError:
        return TCSemanticError(message, loc, self.source, hint=hint)

    def analyze(self, node: ast.Node) -> Typed:
        match node:
            case ast.Number(value=v, loc=loc):
                if isinstance(v, float):
                    return Typed(Literal(v, DType.FLOAT32, loc), True)
                if v >= 2**63:  # as in C: no integer type holds it
                    raise self.error(f"integer literal {v} is too large for int64 (at most "
                                     f"{2**63 - 1})", loc, hint="write a smaller constant, or a "
                                     "float literal (e.g. 1e19) if a float is meant")
                return Typed(int_literal(v, loc), True)
            case ast.Name():
                return self.name(node)
            case ast.Apply():
                return self.apply(node)
            case ast.UnaryExpr(op=op, operand=operand, loc=loc):
                return self.unary(op, self.analyze(operand), loc)
            case ast.BinaryExpr(op=op, lhs=lhs, rhs=rhs, loc=loc):
                return self.binary(_BINARY[op], self.analyze(lhs), self.analyze(rhs), loc)
            case ast.Ternary(cond=c, then=t, other=o, loc=loc):
                cond = cast(self.analyze(c).expr, DType.BOOL)
                a, b = self.analyze(t), self.analyze(o)
                dt, weak = _join(a, b)
                return Typed(Select(cond, cast(a.expr, dt), cast(b.expr, dt), dt, loc), weak)
        raise self.error("expected an expression", node.loc)

    def name(self, node: ast.Name) -> Typed:
        s, n = self.scope, node.id
        if n in s.lets:
            return s.lets[n]
        if n in s.scalars:
            return Typed(ScalarRef(n, s.scalars[n], node.loc), False)
        if n in s.sizes:
            return Typed(SizeVar(n, node.loc), True)
        if n in s.tensors and s.tensors[n].shape in (None, ()):
            return Typed(self.read(ast.Apply(n, (), node.loc)), False)  # a rank-0 tensor
        if n in s.tensors:
            rank = len(s.tensors[n].shape or ())
            raise self.error(f"tensor '{n}' is used without indices",
                             node.loc, hint=f"read an element, e.g. {n}({', '.join('ijklmn'[:rank])})")
        s.index_locs.setdefault(n, node.loc)
        return Typed(IndexVar(n, node.loc), True)

    def apply(self, node: ast.Apply) -> Typed:
        if node.name in self.scope.tensors:
            return Typed(self.read(node), False)
        dtype = DType.from_name(node.name)
        if dtype is not None:
            if len(node.args) != 1:
                raise self.error(f"the cast '{node.name}(...)' takes one argument, "
                                 f"got {len(node.args)}", node.loc)
            value = self.analyze(node.args[0]).expr
            if value.dtype is dtype and dtype.compute is not dtype and not isinstance(value, Literal):
                return Typed(Cast(dtype, value, node.loc), False)  # rounds a float16 value
            return Typed(cast(value, dtype), False)
        builtin = BUILTINS.get(node.name)
        if builtin is None:
            close = difflib.get_close_matches(node.name, [*self.scope.tensors, *BUILTINS], 3)
            hint = (f"did you mean {' or '.join(repr(c) for c in close)}?" if close else
                    f"tensors here: {', '.join(self.scope.tensors)}; builtins: {', '.join(BUILTINS)}")
            raise self.error(f"unknown function or tensor '{node.name}'", node.loc, hint=hint)
        if len(node.args) != builtin.arity:
            raise self.error(f"'{node.name}' takes {builtin.arity} argument"
                             f"{'s' if builtin.arity != 1 else ''}, got {len(node.args)}", node.loc)
        args = [self.analyze(a) for a in node.args]
        acc = args[0]
        for other in args[1:]:
            dt, weak = _join(acc, other)
            acc = Typed(cast(acc.expr, dt), weak)
        dt, weak = _numeric(acc.dtype), acc.weak
        # ir/builtins.py's table gives every BITS and WORDS builtin its result type
        result = builtin.result
        if builtin.kind is BuiltinKind.BITS:
            assert result is not None, node.name
            return Typed(self.reinterpret(result, args[0], node.loc), False)
        if builtin.kind is BuiltinKind.WORDS:
            assert result is not None, node.name
            floats = [a.expr.dtype for a in args if a.expr.dtype.is_float]
            if floats:   # a value converted to a word would be read as packed bytes or halves
                raise self.error(f"'{node.name}' reads int32 words of packed narrow values; an "
                                 f"argument is {floats[0]}", node.loc,
                                 hint="pass int32 words (as_int32(x) takes a float32's bits)")
            words = tuple(cast(a.expr, DType.INT32) for a in args)
            return Typed(Call(node.name, words, result, node.loc), False)
        if builtin.kind is BuiltinKind.FLOAT and not dt.is_float:
            dt = DType.FLOAT32
        return Typed(Call(node.name, tuple(cast(a.expr, dt) for a in args), dt, node.loc), weak)

    def reinterpret(self, dt: DType, a: Typed, loc: SourceLocation) -> Expr:
        """``as_<dt>(a)``: a weak literal or index takes the integer type of ``dt``'s width."""
        value = a.expr
        if a.weak and not value.dtype.is_float:
            value = cast(value, DType(f"int{dt.bits}"))
        elif a.weak:
            value = cast(value, DType.FLOAT64 if dt.bits == 64 else DType.FLOAT32)
        if value.dtype.bits != dt.bits:
            raise self.error(f"as_{dt} reads the bits of a {dt.bits}-bit value; its argument is "
                             f"{value.dtype} ({value.dtype.bits} bits)", loc,
                             hint=f"cast the argument to a {dt.bits}-bit type first")
        return Call(f"as_{dt}", (value,), dt, loc)

    def read(self, node: ast.Apply) -> Read:
        s, name = self.scope, node.name
        info = s.tensors[name]
        if not info.is_input and not info.written and name != s.lhs_tensor:
            raise self.error(f"'{name}' is read before any statement writes it", node.loc,
                             hint="statements run in order; compute it in an earlier statement")
        indices = []
        for arg in node.args:
            t = self.analyze(arg)
            if not t.dtype.is_int:
                raise self.error(f"an index of '{name}' must be an integer expression, "
                                 f"this one is {t.dtype}", arg.loc)
            indices.append(t.expr)
        if name == s.lhs_tensor:
            self._check_self_read(node, indices)
        if info.shape is not None and len(indices) != len(info.shape):
            raise self.error(f"'{name}' has {len(info.shape)} dimension"
                             f"{'s' if len(info.shape) != 1 else ''} but is indexed with "
                             f"{len(indices)}", node.loc)
        assert info.dtype is not None
        return Read(name, tuple(indices), info.dtype, node.loc)

    def _check_self_read(self, node: ast.Apply, indices: list[Expr]) -> None:
        s = self.scope
        same = tuple(i.name if isinstance(i, IndexVar) else None for i in indices) == s.lhs_indices
        if not s.tensors[s.lhs_tensor].written:
            raise self.error(f"'{node.name}' is read before any statement writes it", node.loc,
                             hint="statements run in order; compute it in an earlier statement")
        if not same:
            raise self.error(f"'{node.name}' is written by this statement, so it may only be read "
                             f"at the same indices ({', '.join(s.lhs_indices)})", node.loc,
                             hint="write the result to a new output tensor instead")

    def unary(self, op: str, a: Typed, loc: SourceLocation) -> Typed:
        if op == "!":
            return Typed(Unary(UnaryOp.NOT, cast(a.expr, DType.BOOL), DType.BOOL, loc), False)
        dt = _numeric(a.dtype)
        if op == "~":
            self.integers("~", dt, loc)
            operand = cast(a.expr, dt)
            if isinstance(operand, Literal):
                return Typed(cast(Literal(~int(operand.value), DType.INT64, loc), dt), a.weak)
            return Typed(Unary(UnaryOp.BIT_NOT, operand, dt, loc), a.weak)
        operand = cast(a.expr, dt)
        if isinstance(operand, Literal):
            return Typed(cast(Literal(-operand.value, DType.INT64 if dt.is_unsigned else dt, loc), dt),
                         a.weak)
        return Typed(Unary(UnaryOp.NEG, operand, dt, loc), a.weak)

    def binary(self, op: BinaryOp, a: Typed, b: Typed, loc: SourceLocation) -> Typed:
        if op.is_logical:
            return Typed(Binary(op, cast(a.expr, DType.BOOL), cast(b.expr, DType.BOOL),
                                DType.BOOL, loc), False)
        dt, weak = _join(a, b)
        if op.is_comparison:
            return Typed(Binary(op, cast(a.expr, dt), cast(b.expr, dt), DType.BOOL, loc), False)
        dt = _numeric(dt)
        if op.is_bitwise:
            self.integers(op.value, dt, loc)
        return Typed(Binary(op, cast(a.expr, dt), cast(b.expr, dt), dt, loc), weak)

    def integers(self, op: str, dt: DType, loc: SourceLocation) -> None:
        if not dt.is_int:
            raise self.error(f"'{op}' works on the bits of integers; its operands here are {dt}",
                             loc, hint=f"cast them to an integer type, or read the bits of a float "
                                       f"with as_int{dt.bits}(...)")
