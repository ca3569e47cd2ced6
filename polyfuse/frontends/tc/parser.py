"""Recursive-descent parser for TC: tokens -> syntax tree (``ast``).

Grammar (statements need no separator; ``where`` clauses are comma-separated)::

    module    := def*
    def       := 'def' IDENT '(' [param (',' param)*] ')' '->' '(' output (',' output)* ')'
                 '{' statement* '}'
    param     := IDENT ['(' [expr (',' expr)*] ')'] IDENT      # type, sizes, name
    output    := IDENT | param
    statement := IDENT ['(' [IDENT (',' IDENT)*] ')'] ASSIGN expr ['<=>' IDENT '(' [expr (',' expr)*] ')']
                 ['where' clause (',' clause)*]        # no '(...)': a rank-0 tensor
    clause    := IDENT 'in' sum ':' sum | 'exists' expr | IDENT '=' expr
    expr      := or ['?' expr ':' expr]        # C precedence below
"""

from __future__ import annotations

from polyfuse.errors import TCSyntaxError
from polyfuse.frontends.tc import ast
from polyfuse.frontends.tc.lexer import Kind, Token, tokenize

ASSIGN_OPS = frozenset({"=", "+=", "*=", "max=", "min=", "+=!", "*=!", "max=!", "min=!"})

# binary precedence levels, loosest first
_LEVELS = [("||",), ("&&",), ("==", "!="), ("<", "<=", ">", ">="), ("+", "-"), ("*", "/", "%")]


class Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.tokens = tokenize(source)
        self.pos = 0

    # --- token helpers ---
    @property
    def tok(self) -> Token:
        return self.tokens[self.pos]

    def peek(self, offset: int = 1) -> Token:
        return self.tokens[min(self.pos + offset, len(self.tokens) - 1)]

    def at(self, text: str) -> bool:
        return self.tok.kind in (Kind.OP, Kind.KEYWORD) and self.tok.text == text

    def advance(self) -> Token:
        tok = self.tok
        self.pos = min(self.pos + 1, len(self.tokens) - 1)
        return tok

    def error(self, message: str, tok: Token | None = None) -> TCSyntaxError:
        tok = tok or self.tok
        return TCSyntaxError(message, tok.loc, self.source)

    def expect(self, text: str, what: str | None = None) -> Token:
        if not self.at(text):
            raise self.error(f"expected '{text}'{what or ''}, found {self.tok.describe()}")
        return self.advance()

    def ident(self, what: str) -> ast.Name:
        if self.tok.kind is not Kind.IDENT:
            raise self.error(f"expected {what}, found {self.tok.describe()}")
        tok = self.advance()
        return ast.Name(tok.text, tok.loc)

    # --- definitions ---
    def module(self) -> tuple[ast.DefAST, ...]:
        defs = []
        while self.tok.kind is not Kind.EOF:
            defs.append(self.definition())
        return tuple(defs)

    def definition(self) -> ast.DefAST:
        start = self.expect("def", " to start a definition")
        name = self.ident("a definition name")
        self.expect("(")
        params = self.comma_list(")", self.param)
        self.expect(")")
        self.expect("->")
        self.expect("(", " before the outputs")
        outputs = self.comma_list(")", self.output)
        if not outputs:
            raise self.error("a definition needs at least one output")
        self.expect(")")
        self.expect("{")
        statements = []
        while not self.at("}"):
            if self.tok.kind is Kind.EOF:
                raise self.error("expected '}' to close the definition", self.tok)
            statements.append(self.statement())
        self.expect("}")
        return ast.DefAST(name, tuple(params), tuple(outputs), tuple(statements), start.loc)

    def comma_list(self, closer: str, item):  # type: ignore[no-untyped-def]
        items = []
        if self.at(closer):
            return items
        items.append(item())
        while self.at(","):
            self.advance()
            items.append(item())
        return items

    def param(self) -> ast.ParamAST:
        tname = self.ident("a type name")
        sizes = None
        if self.at("("):
            self.advance()
            sizes = tuple(self.comma_list(")", self.expr))
            self.expect(")")
        name = self.ident("a parameter name")
        return ast.ParamAST(ast.TypeAST(tname.id, sizes, tname.loc), name, tname.loc)

    def output(self) -> ast.ParamAST:
        if self.tok.kind is Kind.IDENT and self.peek().kind is Kind.OP \
                and self.peek().text in (",", ")"):
            name = self.ident("an output name")
            return ast.ParamAST(None, name, name.loc)
        return self.param()

    # --- statements ---
    def statement(self) -> ast.StatementAST:
        tensor = self.ident("a statement (a tensor name)")
        indices = []
        if not self.at("(") and not self.at_assignment():
            raise self.error(f"expected '(' or an assignment after '{tensor.id}' on the left-hand "
                             f"side, found {self.tok.describe()}")
        if self.at("("):
            self.advance()
            indices = self.lhs_indices()
            self.expect(")")
        if not self.at_assignment():
            raise self.error("expected an assignment (=, +=, *=, max=, min=, or with '!'), "
                             f"found {self.tok.describe()}")
        op = self.advance().text
        rhs = self.expr()
        equivalent = self.equivalent() if self.at("<=>") else None
        where: list[ast.WhereRange | ast.WhereExists | ast.WhereLet] = []
        if self.at("where"):
            self.advance()
            where.append(self.where_clause())
            while self.at(","):
                self.advance()
                where.append(self.where_clause())
        return ast.StatementAST(tensor, tuple(indices), op, rhs, tuple(where), tensor.loc,
                                equivalent)

    def at_assignment(self) -> bool:
        return self.tok.kind is Kind.OP and self.tok.text in ASSIGN_OPS

    def equivalent(self) -> ast.Apply:
        """``<=> name(args)``: TC's note of an equivalent reference computation."""
        self.expect("<=>")
        name = self.ident("the name of the equivalent computation after '<=>'")
        self.expect("(", f" after '{name.id}' in the '<=>' annotation")
        args = self.comma_list(")", self.expr)
        self.expect(")", f" to close '{name.id}('")
        return ast.Apply(name.id, tuple(args), name.loc)

    def lhs_indices(self) -> list[ast.Name]:
        indices: list[ast.Name] = []
        if not self.at(")"):
            while True:
                if self.tok.kind is not Kind.IDENT:
                    raise self.error("left-hand side indices must be plain index names, "
                                     f"found {self.tok.describe()}")
                indices.append(self.ident("an index"))
                if self.at(")"):
                    break
                if not self.at(","):
                    raise self.error("left-hand side indices must be plain index names, "
                                     f"found {self.tok.describe()} after '{indices[-1].id}'")
                self.advance()
        return indices

    def where_clause(self) -> ast.WhereRange | ast.WhereExists | ast.WhereLet:
        if self.at("exists"):
            start = self.advance()
            return ast.WhereExists(self.expr(), start.loc)
        name = self.ident("an index name, a let binding or 'exists' in the where clause")
        if self.at("in"):
            self.advance()
            lo = self.binary(0)
            self.expect(":", " between the bounds of the range")
            hi = self.binary(0)
            return ast.WhereRange(name, lo, hi, name.loc)
        if self.at("="):
            self.advance()
            return ast.WhereLet(name, self.expr(), name.loc)
        raise self.error(f"expected 'in' or '=' after '{name.id}' in the where clause, "
                         f"found {self.tok.describe()}")

    # --- expressions ---
    def expr(self) -> ast.Node:
        cond = self.binary(0)
        if not self.at("?"):
            return cond
        self.advance()
        then = self.expr()
        self.expect(":", " in the conditional expression")
        other = self.expr()
        return ast.Ternary(cond, then, other, cond.loc)

    def binary(self, level: int) -> ast.Node:
        if level == len(_LEVELS):
            return self.unary()
        lhs = self.binary(level + 1)
        while self.tok.kind is Kind.OP and self.tok.text in _LEVELS[level]:
            op = self.advance()
            rhs = self.binary(level + 1)
            lhs = ast.BinaryExpr(op.text, lhs, rhs, lhs.loc)
        return lhs

    def unary(self) -> ast.Node:
        if self.tok.kind is Kind.OP and self.tok.text in ("-", "!", "+"):
            op = self.advance()
            operand = self.unary()
            return operand if op.text == "+" else ast.UnaryExpr(op.text, operand, op.loc)
        return self.primary()

    def primary(self) -> ast.Node:
        tok = self.tok
        if tok.kind is Kind.INT:
            self.advance()
            return ast.Number(int(tok.text), tok.loc)
        if tok.kind is Kind.FLOAT:
            self.advance()
            return ast.Number(float(tok.text), tok.loc)
        if tok.kind is Kind.IDENT:
            self.advance()
            if not self.at("("):
                return ast.Name(tok.text, tok.loc)
            self.advance()
            args = self.comma_list(")", self.expr)
            self.expect(")", f" to close '{tok.text}('")
            return ast.Apply(tok.text, tuple(args), tok.loc)
        if self.at("("):
            self.advance()
            inner = self.expr()
            self.expect(")")
            return inner
        raise self.error(f"expected an expression, found {tok.describe()}")


def parse_ast(source: str) -> tuple[ast.DefAST, ...]:
    """Parse TC source into syntax trees, one per ``def``."""
    return Parser(source).module()

