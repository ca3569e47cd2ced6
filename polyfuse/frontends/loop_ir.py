"""The text form of the loop IR, parsed back: ``parse_kernel(str(k)) == k``.

Expressions use the TC expression syntax (and the TC parser); types follow the loop
IR's rules: integer nodes are int64, reads take their buffer's type, shifts and bit
reinterpretations the type they compute in, a cast of a literal is that literal, a local
takes the type of the value first assigned to it.
"""

from __future__ import annotations

from dataclasses import replace

from polyfuse.errors import TCSyntaxError
from polyfuse.frontends.tc import ast
from polyfuse.frontends.tc.lexer import Kind
from polyfuse.frontends.tc.parser import Parser
from polyfuse.ir.builtins import BUILTINS, reinterpreted
from polyfuse.ir.comprehension import (Binary, BinaryOp, Call, Cast, Expr, IndexVar, Literal,
                                       LocalRef, Read, ScalarDecl, ScalarRef, Select, Unary,
                                       UnaryOp)
from polyfuse.ir.limits import MAX_NEST_DEPTH
from polyfuse.ir.loops import (Assign, Buffer, BufferRole, For, If, LoopKernel, LoopKind, Packing,
                               Stmt, Store, TileProduct)
from polyfuse.ir.types import DType

_I64 = DType.INT64


def _wide(dt: DType) -> DType:
    """The register type of an integer node (see ``widen_ints``): int64, or uint64."""
    return dt if dt is DType.UINT64 else _I64
_BINARY = {op.value: op for op in BinaryOp}
_ROLES = {r.value: r for r in BufferRole}


class _LoopParser(Parser):
    def __init__(self, source: str) -> None:
        super().__init__(source)
        self.buffers: dict[str, Buffer] = {}
        self.scalars: dict[str, DType] = {}
        self.locals: dict[str, DType] = {}
        self.blocks = 0  # blocks open around the current token

    def word(self, text: str) -> bool:
        return self.tok.text == text and self.tok.kind in (Kind.IDENT, Kind.KEYWORD)

    def expect_word(self, text: str) -> None:
        if not self.word(text):
            raise self.error(f"expected '{text}', found {self.tok.describe()}")
        self.advance()

    def integer(self) -> int:
        negative = self.at("-") and bool(self.advance())
        if self.tok.kind is not Kind.INT:
            raise self.error(f"expected an integer, found {self.tok.describe()}")
        return -int(self.advance().text) if negative else int(self.advance().text)

    def extent(self) -> int | ast.Node:
        """A buffer's extent: an integer, or an expression of the kernel's sizes."""
        return self.integer() if self.tok.kind is Kind.INT else self.expr()

    def packing(self, rank: int) -> Packing:
        """``= pack SOURCE(form, ...) [padded]``, each form a sum of ``c*pA``, ``pA`` and integers."""
        self.advance()
        self.expect_word("pack")
        source = self.ident("the packed buffer's source").id
        self.expect("(")
        offsets, coefs = [], []
        while True:
            offset, row = 0, [0] * rank
            while True:
                if self.tok.kind is Kind.IDENT:
                    c, axis = 1, self.advance()
                else:
                    c, axis = self.integer(), None
                    if self.at("*"):
                        self.advance()
                        axis = self.advance()
                if axis is None:
                    offset += c
                elif not (axis.text.startswith("p") and axis.text[1:].isdigit()
                          and int(axis.text[1:]) < rank):
                    raise self.error(f"'{axis.text}' is not an axis p0..p{rank - 1} of the packed buffer")
                else:
                    row[int(axis.text[1:])] += c
                if not self.at("+"):
                    break
                self.advance()
            offsets.append(offset)
            coefs.append(tuple(row))
            if not self.at(","):
                break
            self.advance()
        self.expect(")")
        padded = self.word("padded")
        if padded:
            self.advance()
        return Packing(source, tuple(offsets), tuple(coefs), padded)

    def dtype(self) -> DType:
        name = self.ident("a type")
        dt = DType.from_name(name.id)
        if dt is None:
            raise TCSyntaxError(f"unknown type '{name.id}'", name.loc, self.source)
        return dt

    def kernel(self) -> LoopKernel:
        self.expect_word("kernel")
        name = self.ident("a kernel name").id
        self.expect("(")
        buffers, scalars = [], []
        while not self.at(")"):
            if self.tok.text in _ROLES:
                role = _ROLES[self.advance().text]
                panel = self.word("panel") and bool(self.advance())
                dt = self.dtype()
                self.expect("(")
                shape = tuple(self.comma_list(")", self.extent))
                self.expect(")")
                buffer = self.ident("a buffer name").id
                b = Buffer(buffer, dt, shape, role,  # type: ignore[arg-type]  (extents of sizes: typed below)
                           packing=self.packing(len(shape)) if self.at("=") else None, panel=panel)
                buffers.append(b)
            else:
                dt = self.dtype()
                s = ScalarDecl(self.ident("a scalar name").id, dt)
                self.scalars[s.name] = dt
                scalars.append(s)
            if not self.at(","):
                break
            self.advance()
        self.expect(")")
        # a symbolic kernel's extents read its int scalars, declared after the buffers
        buffers = [replace(b, shape=tuple(n if isinstance(n, int) else self.typed(n) for n in b.shape))
                   for b in buffers]
        self.buffers = {b.name: b for b in buffers}
        body = self.block()
        if self.tok.kind is not Kind.EOF:
            raise self.error(f"unexpected {self.tok.describe()} after the kernel")
        return LoopKernel(name, tuple(buffers), tuple(scalars), body)

    def block(self) -> tuple[Stmt, ...]:
        opening = self.expect("{")
        self.blocks += 1
        if self.blocks > MAX_NEST_DEPTH + 1:  # the kernel's body, then loops and conditionals
            raise TCSyntaxError(f"loops and conditionals are nested more than {MAX_NEST_DEPTH} "
                                "deep", opening.loc, self.source,
                                hint="a loop kernel's text nests at most that many blocks")
        out = []
        while not self.at("}"):
            out.append(self.statement())
        self.expect("}")
        self.blocks -= 1
        return tuple(out)

    def statement(self) -> Stmt:
        if self.word("for") or self.peek().text == "for" and \
                any(self.word(k.value.split()[0]) for k in LoopKind):
            return self.loop()
        if self.word("if"):
            self.advance()
            cond = self.typed(self.expr())
            then = self.block()
            other: tuple[Stmt, ...] = ()
            if self.word("else"):
                self.advance()
                other = self.block()
            return If(cond, then, other)
        if self.word("tile"):
            return self.tile()
        if self.word("let"):
            self.advance()
            var = self.ident("a local name").id
            self.expect("=")
            value = self.typed(self.expr())
            self.locals.setdefault(var, value.dtype)
            return Assign(var, value)
        target = self.ident("a statement")
        self.expect("(")
        indices = tuple(self.typed(e) for e in self.comma_list(")", self.expr))
        self.expect(")")
        self.expect("=")
        return Store(target.id, indices, self.typed(self.expr()))

    def tile(self) -> TileProduct:
        """``tile BUILTIN(rows, cols, depth) ACC += A * B steps(acc, a, b) { nest }``."""
        self.advance()
        builtin = self.ident("a dot-product builtin").id
        shape = self.integers()
        acc = self.read()
        self.expect("+=")
        a = self.read()
        self.expect("*")
        b = self.read()
        self.expect_word("steps")
        steps = self.integers()
        if len(shape) != 3 or len(steps) != 3:
            raise self.error("a tile product has 3 extents (rows, columns, depth) and 3 steps")
        return TileProduct(builtin, shape, acc, a, b, steps, self.block())

    def integers(self) -> tuple[int, ...]:
        self.expect("(")
        values = tuple(self.comma_list(")", self.integer))
        self.expect(")")
        return values

    def read(self) -> Read:
        read = self.typed(self._operand()[0])
        if not isinstance(read, Read):
            raise self.error("expected a buffer element")
        return read

    def loop(self) -> For:
        kind = LoopKind.SERIAL
        for k in (LoopKind.PARALLEL, LoopKind.BLOCK, LoopKind.THREAD):
            if self.word(k.value.split()[0]):
                self.advance()
                kind = k
        self.expect_word("for")
        var = self.ident("a loop variable").id
        self.expect("in")
        lo = self.typed(self.binary(0))
        self.expect(":")
        hi = self.typed(self.binary(0))
        step = vector = unroll = 1
        while not self.at("{"):
            word = self.ident("step, vectorize or unroll").id
            if word == "step":
                step = self.integer()
                continue
            self.expect("(")
            value = self.integer()
            self.expect(")")
            if word == "vectorize":
                vector = value
            elif word == "unroll":
                unroll = value
            else:
                raise self.error(f"unknown loop annotation '{word}'")
        return For(var, lo, hi, self.block(), kind, step, vector, unroll)

    # --- typing ---
    def typed(self, node: ast.Node) -> Expr:
        match node:
            case ast.Number(value=v):
                return Literal(v, DType.FLOAT32 if isinstance(v, float) else _I64)
            case ast.Name(id="inf" | "nan" as n):
                return Literal(float(n), DType.FLOAT32)
            case ast.Name(id=n):
                if n in self.locals:
                    return LocalRef(n, self.locals[n])
                if n in self.scalars:
                    return ScalarRef(n, self.scalars[n])
                return IndexVar(n)
            case ast.Apply(name=n, args=args) if n in self.buffers:
                # ``checked(i)`` marks an index the target checks at run time
                marked = tuple(k for k, a in enumerate(args) if isinstance(a, ast.Apply)
                               and a.name == "checked" and len(a.args) == 1)
                indices = [self.typed(a.args[0] if isinstance(a, ast.Apply) and k in marked else a)
                           for k, a in enumerate(args)]
                return Read(n, tuple(indices), self.buffers[n].dtype, checked=marked)
            case ast.Apply(name=n, args=args):
                return self.apply(n, [self.typed(a) for a in args], node)
            case ast.UnaryExpr(op="-", operand=a):
                x = self.typed(a)
                if isinstance(x, Literal):
                    return Literal(-x.value, x.dtype)
                return Unary(UnaryOp.NEG, x, _wide(x.dtype) if x.dtype.is_int else x.dtype)
            case ast.UnaryExpr(op="!", operand=a):
                return Unary(UnaryOp.NOT, self.typed(a), DType.BOOL)
            case ast.UnaryExpr(op="~", operand=a):
                x = self.typed(a)
                return Unary(UnaryOp.BIT_NOT, x, _wide(x.dtype))
            case ast.BinaryExpr(op=op, lhs=a, rhs=b):
                bop = _BINARY[op]
                x, y = self.typed(a), self.typed(b)
                dt = DType.BOOL if bop.is_comparison or bop.is_logical else x.dtype if bop.is_shift \
                    else _wide(x.dtype) if x.dtype.is_int or x.dtype.is_bool else x.dtype
                return Binary(bop, x, y, dt)
            case ast.Ternary(cond=c, then=t, other=o):
                a, b = self.typed(t), self.typed(o)
                return Select(self.typed(c), a, b, _wide(a.dtype) if a.dtype.is_int else a.dtype)
        raise TCSyntaxError("not a loop IR expression", node.loc, self.source)

    def apply(self, name: str, args: list[Expr], node: ast.Node) -> Expr:
        dt = DType.from_name(name)
        if dt is not None and len(args) == 1:
            a = args[0]
            if isinstance(a, Literal):
                v = a.value
                return Literal(bool(v) if dt.is_bool else float(v) if dt.is_float else int(v), dt)
            return Cast(dt, a)
        bits = reinterpreted(name)
        if bits is not None:
            return Call(name, tuple(args), bits)
        if name in BUILTINS:
            dt = args[0].dtype
            return Call(name, tuple(args), _wide(dt) if dt.is_int else dt)
        raise TCSyntaxError(f"unknown buffer or function '{name}'", node.loc, self.source)


def parse_kernel(text: str) -> LoopKernel:
    """Parse the text of a loop kernel (as ``str(kernel)`` prints it)."""
    return _LoopParser(text).kernel()
