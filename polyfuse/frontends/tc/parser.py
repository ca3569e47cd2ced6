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

from collections.abc import Callable
from typing import TypeVar

from polyfuse.errors import TCSyntaxError
from polyfuse.frontends.tc import ast
from polyfuse.frontends.tc.lexer import Kind, Token, tokenize
from polyfuse.ir.limits import MAX_EXPR_DEPTH

T = TypeVar("T")

ASSIGN_OPS = frozenset({"=", "+=", "*=", "max=", "min=", "+=!", "*=!", "max=!", "min=!"})

# binary precedence levels, loosest first
_LEVELS = [("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="), ("<", "<=", ">", ">="),
           ("<<", ">>"), ("+", "-"), ("*", "/", "%")]
_PREFIX = ("-", "!", "~", "+")
_LEVEL = {op: level for level, ops in enumerate(_LEVELS) for op in ops}


class Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.tokens = tokenize(source)
        self.pos = 0
        self.nesting = 0  # expression levels open above the current token

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

    def comma_list(self, closer: str, item: Callable[[], T]) -> list[T]:
        items: list[T] = []
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
    # Every stage after the parser walks expressions recursively, so the nesting depth
    # (each operator, call, branch and parenthesis one level) is bounded here, as the
    # tree is built: ``self.nesting`` levels are open above the current token, and a
    # node of depth d under them makes the expression at least nesting + d deep. Binary
    # operators are parsed by precedence climbing and prefix operators in a loop, so one
    # level costs at most three Python frames and the limit comes long before the stack's.

    def expr(self) -> ast.Node:
        return self._expr()[0]

    def binary(self, level: int) -> ast.Node:
        """An expression with no conditional, of operators at ``level`` or tighter."""
        return self._binary(level)[0]

    def _expr(self) -> tuple[ast.Node, int]:
        cond, depth = self._binary(0)
        if not self.at("?"):
            return cond, depth
        question = self.advance()
        self._descend(question)
        then, then_depth = self._expr()
        self.expect(":", " in the conditional expression")
        other, other_depth = self._expr()
        self.nesting -= 1
        depth = self._deeper(1 + max(depth, then_depth, other_depth), question)
        return ast.Ternary(cond, then, other, cond.loc), depth

    def _binary(self, level: int) -> tuple[ast.Node, int]:
        lhs, depth = self._operand()
        while self.tok.kind is Kind.OP and _LEVEL.get(self.tok.text, -1) >= level:
            op = self.advance()
            self._descend(op)
            rhs, rhs_depth = self._binary(_LEVEL[op.text] + 1)
            self.nesting -= 1
            lhs = ast.BinaryExpr(op.text, lhs, rhs, lhs.loc)
            depth = self._deeper(1 + max(depth, rhs_depth), op)
        return lhs, depth

    def _operand(self) -> tuple[ast.Node, int]:
        """A literal, name, call or parenthesized expression under any number of prefix
        operators (``-``, ``!``, ``~``, ``+``); one function, so a level costs one frame here."""
        prefix = []
        while self.tok.kind is Kind.OP and self.tok.text in _PREFIX:
            prefix.append(self.advance())
            self._descend(prefix[-1])
        tok = self.tok
        if tok.kind in (Kind.INT, Kind.FLOAT):
            self.advance()
            node, depth = ast.Number(int(tok.text) if tok.kind is Kind.INT else float(tok.text),
                                     tok.loc), 1
        elif tok.kind is Kind.IDENT and self.peek().text != "(":
            self.advance()
            node, depth = ast.Name(tok.text, tok.loc), 1
        elif tok.kind is Kind.IDENT:
            self.advance()
            self.advance()
            self._descend(tok)
            args = []
            if not self.at(")"):
                args.append(self._expr())
                while self.at(","):
                    self.advance()
                    args.append(self._expr())
            self.expect(")", f" to close '{tok.text}('")
            self.nesting -= 1
            node = ast.Apply(tok.text, tuple(a for a, _ in args), tok.loc)
            depth = 1 + max((d for _, d in args), default=0)
        elif self.at("("):
            self._descend(self.advance())
            node, depth = self._expr()
            self.expect(")")
            self.nesting -= 1
            depth += 1
        else:
            raise self.error(f"expected an expression, found {tok.describe()}")
        for op in reversed(prefix):
            self.nesting -= 1
            node = node if op.text == "+" else ast.UnaryExpr(op.text, node, op.loc)
            depth += 1
        return node, depth

    def _descend(self, tok: Token) -> None:
        """Open one level below ``tok`` (an operand, the arguments, a parenthesis)."""
        self.nesting += 1
        self._deeper(1, tok)

    def _deeper(self, depth: int, tok: Token) -> int:
        """``depth``, checked: a node that deep under the open levels fits the limit."""
        if self.nesting + depth > MAX_EXPR_DEPTH:
            raise TCSyntaxError(
                f"the expression is nested more than {MAX_EXPR_DEPTH} levels deep (operators, "
                "calls, conditionals and parentheses count one level each)", tok.loc, self.source,
                hint="split it: compute a part into a temporary output in an earlier statement, "
                     "or sum many terms with a reduction over an index (+=!) instead of a chain of '+'")
        return depth


def parse_ast(source: str) -> tuple[ast.DefAST, ...]:
    """Parse TC source into syntax trees, one per ``def``."""
    return Parser(source).module()

