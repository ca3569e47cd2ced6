"""The graph IR's text form read back: ``parse_graph(str(g), g) == g``.

Grammar (white space, new lines included, only separates tokens)::

    graph    := 'graph' name '(' [value (',' value)*] ')' ['captures' '(' [VALUE (',' VALUE)*] ')']
                '->' '(' [value (',' value)*] ')' ['opset' INT] '{' (constant | node)* '}'
    value    := VALUE ':' type                        # VALUE is %name
    type     := NAME '[' [dim (',' dim)*] ']'         # dim: INT or name
    constant := VALUE '=' 'constant' type data
    node     := out (',' out)* '=' name '(' [arg (',' arg)*] ')' '#' name [GROUP]
    out      := VALUE | '_'                           # '_': an omitted optional value
    arg      := out | name '=' attr
    attr     := INT | FLOAT | STRING | 'true' | 'false' | '[' [attr (',' attr)*] ']'
              | 'tensor' '<' type '>' data | graph     # graph: a body or branch
    data     := '[' [scalar (',' scalar)*] ']' | DIGEST   # flat C-order values, or sha:hex
    name     := NAME | STRING

Data printed as a digest comes from ``weights``: a constant's under its name, a large
tensor attribute's or a subgraph's constant's under its digest text (``sha:...``);
passing the original Graph supplies all.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from polyfuse.errors import FrontendError, GraphSyntaxError, SourceLocation, WeightError
from polyfuse.ir.graph import (NAME_PATTERN, PREFIXED_NAME_PATTERN, Constant, Graph, Node,
                               TensorType, Value)
from polyfuse.ir.limits import MAX_NEST_DEPTH
from polyfuse.ir.types import DType


_STRING = r'"(?:[^"\\\n]|\\.)*"'
_NOT_NAME = r"(?![A-Za-z0-9_./-])"
_TOKEN = re.compile(
    r"(?P<space>\s+)"
    rf"|(?P<string>{_STRING})"
    r"|(?P<digest>sha:[0-9a-f]+)"
    rf"|(?P<float>-?(?:\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|inf{_NOT_NAME})|nan{_NOT_NAME})"
    r"|(?P<int>-?\d+)"
    rf"|(?P<value>%(?:{PREFIXED_NAME_PATTERN}|{_STRING}))"
    rf"|(?P<group>@(?:{PREFIXED_NAME_PATTERN}|{_STRING}))"
    rf"|(?P<name>{NAME_PATTERN})"
    r"|(?P<punct>->|[()\[\]{}<>,=:#])")


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str                # a group name of _TOKEN, or "eof"
    text: str
    loc: SourceLocation

    def describe(self) -> str:
        return "end of input" if self.kind == "eof" else f"'{self.text}'"


def parse_graph(text: str, weights: Mapping[str, np.ndarray] | Graph | None = None, *,
                filename: str = "<graph>") -> Graph:
    """The Graph that ``text`` (as ``str(graph)`` prints it) describes.

    Raises GraphSyntaxError at the first token that does not fit, WeightError when a
    digest names data ``weights`` lacks or does not match.
    """
    if isinstance(weights, Graph):
        weights = _weights_of(weights)
    return _Parser(text, dict(weights or {}), filename).graph()


def _weights_of(g: Graph) -> dict[str, np.ndarray]:
    found = {c.name: c.array for c in g.constants}

    def visit_graph(sub: Graph) -> None:
        for c in sub.constants:
            found["sha:" + c.digest()] = c.array
        for n in sub.nodes:
            visit([v for _, v in n.attrs])

    def visit(v: Any) -> None:
        if isinstance(v, np.ndarray):
            found["sha:" + Constant("", v).digest()] = v
        elif isinstance(v, Graph):
            visit_graph(v)
        elif isinstance(v, tuple | list):
            for x in v:
                visit(x)

    for n in g.nodes:
        visit([v for _, v in n.attrs])
    return found


def _tokenize(text: str, filename: str, pattern: re.Pattern[str] = _TOKEN) -> list[_Token]:
    """The tokens of ``text`` by ``pattern`` (whose ``space`` group is dropped), and an eof."""
    tokens, line, line_start, pos = [], 1, 0, 0
    while pos < len(text):
        m = pattern.match(text, pos)
        if m is None:
            raise GraphSyntaxError(f"unexpected character {text[pos]!r}",
                                   SourceLocation(line, pos - line_start + 1), text,
                                   filename=filename)
        if m.lastgroup != "space":
            tokens.append(_Token(m.lastgroup or "", m.group(),
                                 SourceLocation(line, pos - line_start + 1, len(m.group()))))
        if "\n" in m.group():   # only white space spans lines
            line, line_start = line + m.group().count("\n"), m.start() + m.group().rindex("\n") + 1
        pos = m.end()
    tokens.append(_Token("eof", "", SourceLocation(line, pos - line_start + 1)))
    return tokens


class _Parser:
    def __init__(self, text: str, weights: dict[str, np.ndarray], filename: str) -> None:
        self.text, self.weights, self.filename = text, weights, filename
        self.tokens = _tokenize(text, filename)
        self.pos = 0
        self.lists = 0  # attribute lists open around the current token

    # --- tokens ---
    @property
    def tok(self) -> _Token:
        return self.tokens[self.pos]

    def at(self, text: str, offset: int = 0) -> bool:
        tok = self.tokens[min(self.pos + offset, len(self.tokens) - 1)]
        return tok.kind in ("punct", "name") and tok.text == text

    def advance(self) -> _Token:
        tok = self.tok
        self.pos = min(self.pos + 1, len(self.tokens) - 1)
        return tok

    def error(self, message: str, tok: _Token | None = None, cls: type[FrontendError] = GraphSyntaxError,
              hint: str | None = None) -> FrontendError:
        return cls(message, (tok or self.tok).loc, self.text, hint=hint, filename=self.filename)

    def expect(self, text: str) -> _Token:
        if not self.at(text):
            raise self.error(f"expected '{text}', found {self.tok.describe()}")
        return self.advance()

    def take(self, kind: str, what: str) -> _Token:
        if self.tok.kind != kind:
            raise self.error(f"expected {what}, found {self.tok.describe()}")
        return self.advance()

    def comma_list(self, close: str, item: Any) -> list[Any]:
        items = []
        while not self.at(close):
            items.append(item())
            if not self.at(close):
                self.expect(",")
        self.expect(close)
        return items

    def name(self, what: str) -> str:
        if self.tok.kind == "string":
            return self.string()
        return self.take("name", what).text

    def string(self, tok: _Token | None = None, body: str | None = None) -> str:
        """The string token ``tok`` (default: the next one) or its quoted ``body``, unescaped."""
        tok = tok or self.advance()
        try:
            return json.loads(body or tok.text)
        except json.JSONDecodeError as err:
            raise self.error(f"bad string: {err.msg}", tok) from None

    def prefixed(self, kind: str, what: str) -> str:
        """The name of a %value or @group token, bare or quoted after its sigil."""
        tok = self.take(kind, what)
        body = tok.text[1:]
        return self.string(tok, body) if body.startswith('"') else body

    def value_name(self) -> str:
        return self.prefixed("value", "a %value")

    def out(self) -> str:
        if self.at("_"):
            self.advance()
            return ""
        return self.value_name()

    # --- graph ---
    def graph(self, nested: bool = False) -> Graph:
        """A graph: the text's, or (``nested``) a subgraph in an attribute, whose
        constants' data comes by digest."""
        self.expect("graph")
        name = self.name("the graph name")
        self.expect("(")
        inputs = self.comma_list(")", self.value)
        captures: list[str] = []
        if self.at("captures"):
            self.advance()
            self.expect("(")
            captures = self.comma_list(")", self.value_name)
        self.expect("->")
        self.expect("(")
        outputs = self.comma_list(")", self.value)
        opset = 0
        if self.at("opset"):
            self.advance()
            opset = int(self.take("int", "the opset version").text)
        self.expect("{")
        constants, types, nodes = [], [], []
        while not self.at("}"):
            if self.tok.kind == "value" and self.at("=", 1) and self.at("constant", 2):
                constants.append(self.constant(nested))
            elif self.tok.kind == "value" and self.at(":", 1):
                types.append(self.value())
            else:
                nodes.append(self.node())
        self.expect("}")
        if not nested:
            self.take("eof", "end of input after the graph")
        return Graph(name, tuple(inputs), tuple(outputs), tuple(nodes), tuple(constants), opset,
                     tuple(types), tuple(captures))

    def value(self) -> Value:
        name = self.value_name()
        self.expect(":")
        return Value(name, self.type())

    def type(self) -> TensorType:
        tok = self.take("name", "an element type")
        try:
            dtype = DType(tok.text)
        except ValueError:
            raise self.error(f"unknown element type '{tok.text}'", tok) from None
        self.expect("[")
        return TensorType(dtype, tuple(self.comma_list("]", self.dim)))

    def dim(self) -> int | str:
        return int(self.advance().text) if self.tok.kind == "int" else self.name("a dimension")

    def constant(self, nested: bool = False) -> Constant:
        name = self.value_name()
        self.expect("=")
        self.expect("constant")
        return Constant(name, self.data(self.type(), None if nested else name))

    def node(self) -> Node:
        outputs = [self.out()]
        while self.at(","):
            self.advance()
            outputs.append(self.out())
        self.expect("=")
        op = self.name("an op name")
        self.expect("(")
        inputs: list[str] = []
        attrs: list[tuple[str, Any]] = []

        def arg() -> None:
            if self.tok.kind == "value" or (self.at("_") and not self.at("=", 1)):
                if attrs:
                    raise self.error("inputs come before attributes")
                inputs.append(self.out())
            else:
                key = self.name("an input or attribute")
                self.expect("=")
                attrs.append((key, self.attr()))

        self.comma_list(")", arg)
        self.expect("#")
        name = self.name("the node name")
        group = self.prefixed("group", "@group") if self.tok.kind == "group" else ""
        return Node(op, name, tuple(inputs), tuple(outputs), tuple(attrs), group)

    # --- attributes and data ---
    def attr(self) -> Any:
        tok = self.tok
        if tok.kind in ("int", "float") or self.at("true") or self.at("false"):
            return self.scalar()
        if tok.kind == "string":
            return self.string()
        if self.at("["):
            self.advance()
            self.lists += 1
            if self.lists > MAX_NEST_DEPTH:
                raise self.error(f"attribute lists are nested more than {MAX_NEST_DEPTH} deep", tok,
                                 hint="an ONNX attribute is a value or a list of values")
            items = tuple(self.comma_list("]", self.attr))
            self.lists -= 1
            return items
        if self.at("graph"):
            return self.graph(nested=True)
        if self.at("tensor"):
            self.advance()
            self.expect("<")
            t = self.type()
            self.expect(">")
            return self.data(t, None)
        raise self.error(f"expected an attribute value, found {tok.describe()}")

    def scalar(self) -> int | float | bool:
        tok = self.advance()
        if tok.kind == "int":
            return int(tok.text)
        if tok.kind == "float":
            return float(tok.text)
        if tok.text in ("true", "false"):
            return tok.text == "true"
        raise self.error(f"expected a number, found {tok.describe()}", tok)

    def data(self, t: TensorType, name: str | None) -> np.ndarray:
        """Inline values shaped as ``t``, or the weight the digest names (by ``name`` if given)."""
        tok = self.tok
        if not t.is_static:
            raise self.error(f"data of type {t} needs a static shape", tok)
        if tok.kind != "digest":
            self.expect("[")
            values = self.comma_list("]", self.scalar)
            if len(values) != math.prod(t.shape):
                raise self.error(f"{len(values)} values given for type {t}", tok)
            return np.array(values).astype(t.dtype.numpy).reshape(t.shape)
        self.advance()
        key = name if name is not None else tok.text
        array = self.weights.get(key)
        what = f"constant '{name}'" if name is not None else f"tensor attribute {tok.text}"
        if array is None:
            raise self.error(f"{what} has no data: weights lack '{key}'", tok, WeightError,
                             hint="pass weights= a mapping that holds it, or the original Graph")
        array = np.asarray(array)
        found = Constant("", array)
        if found.type != t or "sha:" + found.digest() != tok.text:
            raise self.error(f"{what}: weights['{key}'] is {found.type} sha:{found.digest()}, "
                             f"the text says {t} {tok.text}", tok, WeightError)
        return array
