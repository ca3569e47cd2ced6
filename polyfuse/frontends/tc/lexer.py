"""Tokens of the TC language."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from polyfuse.errors import SourceLocation, TCSyntaxError


class Kind(enum.Enum):
    IDENT = "identifier"
    INT = "integer"
    FLOAT = "number"
    OP = "operator"
    KEYWORD = "keyword"
    EOF = "end of input"


KEYWORDS = frozenset({"def", "where", "in", "exists"})

# Longest first: "+=!" before "+=", "max=!" before "max=".
_OPERATORS = ["max=!", "min=!", "+=!", "*=!", "<=>", "max=", "min=", "->", "+=", "*=", "==", "!=",
              "<=", ">=", "&&", "||", "<<", ">>", "+", "-", "*", "/", "%", "<", ">", "=", "!",
              "&", "|", "^", "~", "?", ":", "(", ")", "{", "}", ","]
_TOKEN = re.compile(
    r"(?P<space>[ \t\r\f\v]+)|(?P<newline>\n)|(?P<comment>#[^\n]*)"
    r"|(?P<float>(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?f?|\d+[eE][+-]?\d+f?)"
    r"|(?P<int>\d+)"
    r"|(?P<op>" + "|".join(re.escape(o) + (r"(?!=)" if o in ("max=", "min=") else "")
                           for o in _OPERATORS) + r")"
    r"|(?P<ident>[A-Za-z_][A-Za-z_0-9]*)")


@dataclass(frozen=True, slots=True)
class Token:
    kind: Kind
    text: str
    loc: SourceLocation

    def describe(self) -> str:
        return "end of input" if self.kind is Kind.EOF else f"'{self.text}'"


def tokenize(source: str) -> list[Token]:
    """Split TC source into tokens; raises TCSyntaxError at the first bad character."""
    tokens: list[Token] = []
    line, line_start, pos = 1, 0, 0
    while pos < len(source):
        m = _TOKEN.match(source, pos)
        if m is None:
            loc = SourceLocation(line, pos - line_start + 1)
            raise TCSyntaxError(f"unexpected character {source[pos]!r}", loc, source)
        kind, text = m.lastgroup, m.group()
        loc = SourceLocation(line, pos - line_start + 1, len(text))
        if kind == "newline":
            line, line_start = line + 1, m.end()
        elif kind == "float":
            tokens.append(Token(Kind.FLOAT, text.rstrip("f"), loc))
        elif kind == "int":
            tokens.append(Token(Kind.INT, text, loc))
        elif kind == "op":
            tokens.append(Token(Kind.OP, text, loc))
        elif kind == "ident":
            tokens.append(Token(Kind.KEYWORD if text in KEYWORDS else Kind.IDENT, text, loc))
        pos = m.end()
    tokens.append(Token(Kind.EOF, "", SourceLocation(line, pos - line_start + 1)))
    return tokens
