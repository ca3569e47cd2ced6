"""Syntax tree of TC source, before names are resolved and types inferred."""

from __future__ import annotations

from dataclasses import dataclass

from polyfuse.errors import SourceLocation


class Node:
    __slots__ = ()
    loc: SourceLocation


@dataclass(frozen=True, slots=True)
class Name(Node):
    id: str
    loc: SourceLocation


@dataclass(frozen=True, slots=True)
class Number(Node):
    value: int | float
    loc: SourceLocation


@dataclass(frozen=True, slots=True)
class Apply(Node):
    """``f(args)``: a tensor read, a builtin call or a cast; sema decides which."""

    name: str
    args: tuple[Node, ...]
    loc: SourceLocation


@dataclass(frozen=True, slots=True)
class UnaryExpr(Node):
    op: str
    operand: Node
    loc: SourceLocation


@dataclass(frozen=True, slots=True)
class BinaryExpr(Node):
    op: str
    lhs: Node
    rhs: Node
    loc: SourceLocation


@dataclass(frozen=True, slots=True)
class Ternary(Node):
    cond: Node
    then: Node
    other: Node
    loc: SourceLocation


@dataclass(frozen=True, slots=True)
class WhereRange(Node):
    index: Name
    lo: Node
    hi: Node
    loc: SourceLocation


@dataclass(frozen=True, slots=True)
class WhereExists(Node):
    access: Node
    loc: SourceLocation


@dataclass(frozen=True, slots=True)
class WhereLet(Node):
    name: Name
    value: Node
    loc: SourceLocation


@dataclass(frozen=True, slots=True)
class StatementAST(Node):
    tensor: Name
    indices: tuple[Name, ...]
    op: str            # "=", "+=", "+=!", "max=", ...
    rhs: Node
    where: tuple[WhereRange | WhereExists | WhereLet, ...]
    loc: SourceLocation
    equivalent: Apply | None = None  # TC's ``<=> name(args)``


@dataclass(frozen=True, slots=True)
class TypeAST(Node):
    name: str
    sizes: tuple[Node, ...] | None  # None for a scalar
    loc: SourceLocation


@dataclass(frozen=True, slots=True)
class ParamAST(Node):
    type: TypeAST | None  # None for an output declared by name only
    name: Name
    loc: SourceLocation


@dataclass(frozen=True, slots=True)
class DefAST(Node):
    name: Name
    params: tuple[ParamAST, ...]
    outputs: tuple[ParamAST, ...]
    statements: tuple[StatementAST, ...]
    loc: SourceLocation
