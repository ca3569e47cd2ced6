"""Loop IR: where every target starts.

A :class:`LoopKernel` is a list of buffers (each marked in, out, inout or temp, with a
dtype, a fixed shape and an alignment), the scalar parameters, and a body of loops,
guards and stores. Loops carry how they should run: serially, on the thread pool
(``parallel``), as SIMD (``vectorize`` with a width) or unrolled (``unroll`` with a
factor). Expressions are comprehension-IR expressions: a :class:`Read` loads from a
buffer, an :class:`IndexVar` names a loop iterator and a :class:`LocalRef` a scalar
local set by :class:`Assign`. Every integer expression is computed in 64 bits
(its nodes are int64) and narrowed only when stored or cast, so index arithmetic
never overflows; int64 literals print bare.

``str(kernel)`` prints the text form, e.g.::

    kernel mm(in float32(64, 32) A, in float32(32, 48) B, out float32(64, 48) C) {
      parallel for c0 in 0:64 {
        for c1 in 0:48 {
          C(c0, c1) = 0.0
        }
      }
    }
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from polyfuse.ir.comprehension import (Binary, Call, Cast, Expr, Literal, ScalarDecl, Select,
                                       Unary, UnaryOp, format_expr, map_expr)
from polyfuse.ir.types import DType


# A kernel with indirect reads (``E(Idx(b), d)``) gets this int64[1] buffer: targets set
# it to 1 when an index read from a tensor falls outside the dimension it indexes (the
# load then reads element 0), and the runtime turns that into a BoundsError.
ERROR_BUFFER = "polyfuse_error"


class BufferRole(enum.Enum):
    IN = "in"
    OUT = "out"
    INOUT = "inout"
    TEMP = "temp"


class LoopKind(enum.Enum):
    SERIAL = "for"
    PARALLEL = "parallel for"


@dataclass(frozen=True, slots=True)
class Buffer:
    name: str
    dtype: DType
    shape: tuple[int, ...]
    role: BufferRole
    alignment: int = 64

    @property
    def strides(self) -> tuple[int, ...]:
        """Row-major element strides."""
        out, step = [], 1
        for extent in reversed(self.shape):
            out.append(step)
            step *= extent
        return tuple(reversed(out))

    def __str__(self) -> str:
        return f"{self.role.value} {self.dtype}({', '.join(map(str, self.shape))}) {self.name}"


class Stmt:
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class For(Stmt):
    """``for var in lo:hi step s`` (hi exclusive).

    ``parallel`` loops run their iterations on the thread pool; ``vector`` > 1 asks for
    SIMD code of that width, ``unroll`` > 1 for that many copies of the body.
    """

    var: str
    lo: Expr
    hi: Expr
    body: tuple[Stmt, ...]
    kind: LoopKind = LoopKind.SERIAL
    step: int = 1
    vector: int = 1
    unroll: int = 1


@dataclass(frozen=True, slots=True)
class If(Stmt):
    cond: Expr
    then: tuple[Stmt, ...]
    other: tuple[Stmt, ...] = ()


@dataclass(frozen=True, slots=True)
class Assign(Stmt):
    """Set the scalar local ``var`` (read back as a ``LocalRef``), kept in compute precision."""

    var: str
    value: Expr


@dataclass(frozen=True, slots=True)
class Store(Stmt):
    buffer: str
    indices: tuple[Expr, ...]
    value: Expr


@dataclass(frozen=True, slots=True)
class LoopKernel:
    name: str
    buffers: tuple[Buffer, ...]
    scalars: tuple[ScalarDecl, ...]
    body: tuple[Stmt, ...]

    def buffer(self, name: str) -> Buffer:
        return next(b for b in self.buffers if b.name == name)

    def __str__(self) -> str:
        return format_kernel(self)


def map_kernel_exprs(kernel: LoopKernel, fn: Callable[[Expr], Expr]) -> LoopKernel:
    """Apply ``map_expr(·, fn)`` to every expression of a kernel."""
    def stmts(body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
        out: list[Stmt] = []
        for s in body:
            if isinstance(s, For):
                s = replace(s, lo=map_expr(s.lo, fn), hi=map_expr(s.hi, fn), body=stmts(s.body))
            elif isinstance(s, If):
                s = replace(s, cond=map_expr(s.cond, fn), then=stmts(s.then), other=stmts(s.other))
            elif isinstance(s, Store):
                s = replace(s, indices=tuple(map_expr(i, fn) for i in s.indices),
                            value=map_expr(s.value, fn))
            elif isinstance(s, Assign):
                s = replace(s, value=map_expr(s.value, fn))
            out.append(s)
        return tuple(out)
    return replace(kernel, body=stmts(kernel.body))


def widen_ints(e: Expr) -> Expr:
    """The loop-IR form of an integer node: int64 (casts and reads keep their type);
    a cast of a literal becomes the literal."""
    if isinstance(e, Cast) and isinstance(e.operand, Literal):
        v = e.operand.value
        return Literal(bool(v) if e.dtype.is_bool else float(v) if e.dtype.is_float else int(v),
                       e.dtype)
    if isinstance(e, (Literal, Binary, Select, Call)) and e.dtype.is_int and e.dtype is not DType.INT64:
        return replace(e, dtype=DType.INT64)
    if isinstance(e, Unary) and e.op is UnaryOp.NEG and e.dtype.is_int and e.dtype is not DType.INT64:
        return replace(e, dtype=DType.INT64)
    return e


def walk_stmts(body: tuple[Stmt, ...]) -> Iterator[Stmt]:
    for s in body:
        yield s
        if isinstance(s, For):
            yield from walk_stmts(s.body)
        elif isinstance(s, If):
            yield from walk_stmts(s.then)
            yield from walk_stmts(s.other)


def _x(e: Expr) -> str:
    return format_expr(e, DType.INT64)


def _format_body(body: tuple[Stmt, ...], indent: str) -> list[str]:
    lines: list[str] = []
    for s in body:
        match s:
            case For(var=v, lo=lo, hi=hi, body=inner, kind=kind, step=step, vector=vec, unroll=unr):
                marks = ((f" step {step}" if step != 1 else "") + (f" vectorize({vec})" if vec > 1 else "")
                         + (f" unroll({unr})" if unr > 1 else ""))
                lines.append(f"{indent}{kind.value} {v} in {_x(lo)}:{_x(hi)}{marks} {{")
                lines += _format_body(inner, indent + "  ")
                lines.append(f"{indent}}}")
            case If(cond=c, then=then, other=other):
                lines.append(f"{indent}if {_x(c)} {{")
                lines += _format_body(then, indent + "  ")
                if other:
                    lines.append(f"{indent}}} else {{")
                    lines += _format_body(other, indent + "  ")
                lines.append(f"{indent}}}")
            case Assign(var=v, value=value):
                lines.append(f"{indent}let {v} = {_x(value)}")
            case Store(buffer=b, indices=ix, value=value):
                lines.append(f"{indent}{b}({', '.join(_x(i) for i in ix)}) = {_x(value)}")
    return lines


def format_kernel(k: LoopKernel) -> str:
    params = [str(b) for b in k.buffers] + [f"{s.dtype} {s.name}" for s in k.scalars]
    return "\n".join([f"kernel {k.name}({', '.join(params)}) {{", *_format_body(k.body, "  "), "}"])
