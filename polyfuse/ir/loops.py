"""Loop IR: where every target starts.

A :class:`LoopKernel` is a list of buffers (each marked in, out, inout or temp, with a
dtype, a fixed shape and an alignment), the scalar parameters, and a body of loops,
guards and stores. Loops carry how they should run: serially, on the thread pool
(``parallel``), as SIMD (``vectorize`` with a width) or unrolled (``unroll`` with a
factor). Expressions are comprehension-IR expressions: a :class:`Read` loads from a
buffer and an :class:`IndexVar` names a loop iterator. Targets compute every integer
expression in 64 bits and narrow it only when it is stored or cast, so index
arithmetic never overflows; integer literals print in their shortest type.

``str(kernel)`` prints the text form, e.g.::

    kernel mm(in float32[64, 32] A, in float32[32, 48] B, out float32[64, 48] C) {
      parallel for c0 in 0:64 {
        for c1 in 0:48 {
          C(c0, c1) = 0.0
        }
      }
    }
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass

from polyfuse.ir.comprehension import Expr, ScalarDecl, format_expr
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
        return f"{self.role.value} {self.dtype}[{', '.join(map(str, self.shape))}] {self.name}"


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


def walk_stmts(body: tuple[Stmt, ...]) -> Iterator[Stmt]:
    for s in body:
        yield s
        if isinstance(s, For):
            yield from walk_stmts(s.body)
        elif isinstance(s, If):
            yield from walk_stmts(s.then)
            yield from walk_stmts(s.other)


def _format_body(body: tuple[Stmt, ...], indent: str) -> list[str]:
    lines: list[str] = []
    for s in body:
        match s:
            case For(var=v, lo=lo, hi=hi, body=inner, kind=kind, step=step, vector=vec, unroll=unr):
                marks = ((f" step {step}" if step != 1 else "") + (f" vectorize({vec})" if vec > 1 else "")
                         + (f" unroll({unr})" if unr > 1 else ""))
                lines.append(f"{indent}{kind.value} {v} in {format_expr(lo)}:{format_expr(hi)}{marks} {{")
                lines += _format_body(inner, indent + "  ")
                lines.append(f"{indent}}}")
            case If(cond=c, then=then, other=other):
                lines.append(f"{indent}if {format_expr(c)} {{")
                lines += _format_body(then, indent + "  ")
                if other:
                    lines.append(f"{indent}}} else {{")
                    lines += _format_body(other, indent + "  ")
                lines.append(f"{indent}}}")
            case Assign(var=v, value=value):
                lines.append(f"{indent}let {v} = {format_expr(value)}")
            case Store(buffer=b, indices=ix, value=value):
                lines.append(f"{indent}{b}({', '.join(format_expr(i) for i in ix)}) = {format_expr(value)}")
    return lines


def format_kernel(k: LoopKernel) -> str:
    params = [str(b) for b in k.buffers] + [f"{s.dtype} {s.name}" for s in k.scalars]
    return "\n".join([f"kernel {k.name}({', '.join(params)}) {{", *_format_body(k.body, "  "), "}"])
