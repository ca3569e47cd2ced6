"""Graph IR: a typed DAG of ops, constants and inputs (what an ONNX model says).

Values are named; each node reads values and defines new ones. Shapes may hold
symbolic dimensions (strings) until they are bound by the inputs of a call.
Attributes are kept as ONNX gives them (ints, floats, strings, tuples of those,
arrays for tensor attributes). ``str(graph)`` prints one line per node, in a text
form that ``polyfuse.frontends.graph_text.parse_graph`` reads back: arrays of at most
``INLINE_MAX`` elements print their values, larger ones their type and digest.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polyfuse.errors import IRVerificationError
from polyfuse.ir.types import DType, aligned_array

Dim = int | str

INLINE_MAX = 16

# control-flow ops and their attributes holding subgraphs (bodies and branches): each
# subgraph is a Graph whose ``captures`` are the enclosing values it reads, fed by the
# node's inputs after its own ONNX inputs, in order
SUBGRAPH_ATTRS = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}
# Names print bare when they match these (after % and @ they may start with a digit);
# anything else, and bare words the parser reads as values or keywords, print as JSON strings.
NAME_PATTERN = r"[A-Za-z_/][A-Za-z0-9_./-]*"
PREFIXED_NAME_PATTERN = r"[A-Za-z0-9_./-]+"
RESERVED = frozenset({"inf", "nan", "true", "false", "constant"})


@dataclass(frozen=True, slots=True)
class TensorType:
    dtype: DType
    shape: tuple[Dim, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def __str__(self) -> str:
        dims = (str(d) if isinstance(d, int) else format_name(d) for d in self.shape)
        return f"{self.dtype}[{', '.join(dims)}]"


@dataclass(frozen=True, slots=True)
class Value:
    name: str
    type: TensorType

    def __str__(self) -> str:
        return f"{format_name(self.name, '%')}: {self.type}"


@dataclass(frozen=True, eq=False)
class Constant:
    """A weight or folded value; equal when the data is."""

    name: str
    array: np.ndarray = field(repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "array", aligned_array(self.array))   # see types.aligned_array

    @property
    def type(self) -> TensorType:
        dt = DType.from_numpy(self.array.dtype)
        assert dt is not None
        return TensorType(dt, tuple(int(d) for d in self.array.shape))

    def digest(self) -> str:
        return hashlib.sha256(np.ascontiguousarray(self.array).tobytes()).hexdigest()[:16]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Constant) and self.name == other.name and \
            self.array.dtype == other.array.dtype and np.array_equal(self.array, other.array)

    def __hash__(self) -> int:
        return hash((self.name, self.digest()))


@dataclass(frozen=True, slots=True)
class Node:
    op: str
    name: str
    inputs: tuple[str, ...]          # value names; "" for an omitted optional input
    outputs: tuple[str, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    group: str = ""                  # fusion group (one kernel per group); "" for none

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    @property
    def subgraphs(self) -> tuple[Graph, ...]:
        """The bodies or branches of a control-flow node (none for other ops)."""
        return tuple(self.attr(key) for key in SUBGRAPH_ATTRS.get(self.op, ()))

    def __str__(self) -> str:
        outs = ", ".join(format_name(o, "%") if o else "_" for o in self.outputs)
        args = [format_name(i, "%") if i else "_" for i in self.inputs]
        args += [f"{format_name(k)}={_format_attr(v)}" for k, v in self.attrs]
        name = format_name(self.name) + (f" {format_name(self.group, '@')}" if self.group else "")
        return f"{outs} = {format_name(self.op)}({', '.join(args)})  # {name}"


def format_name(name: str, prefix: str = "") -> str:
    """``name`` after ``prefix``, bare if it reads back as one token, else quoted."""
    if prefix:
        bare = re.fullmatch(PREFIXED_NAME_PATTERN, name) is not None
    else:
        bare = re.fullmatch(NAME_PATTERN, name) is not None and name not in RESERVED
    return prefix + (name if bare else json.dumps(name, ensure_ascii=False))


def format_array(a: np.ndarray) -> str:
    """``a``'s values, flat in C order, or its digest when it has more than INLINE_MAX."""
    if a.size > INLINE_MAX:
        return "sha:" + Constant("", a).digest()
    return "[" + ", ".join(str(x).lower() if a.dtype == bool else str(x) for x in a.flat) + "]"


def _format_attr(v: Any) -> str:
    if isinstance(v, Graph):
        return str(v).replace("\n", "\n    ")
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, np.ndarray):
        return f"tensor<{Constant('', v).type}> {format_array(v)}"
    if isinstance(v, tuple | list):
        return "[" + ", ".join(_format_attr(x) for x in v) + "]"
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, bool):
        return str(v).lower()
    return repr(v)


@dataclass(frozen=True)
class Graph:
    name: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    nodes: tuple[Node, ...]
    constants: tuple[Constant, ...] = ()
    opset: int = 0
    types: tuple[Value, ...] = ()    # inferred types of intermediate values (those known)
    captures: tuple[str, ...] = ()   # a subgraph's values of the enclosing graph, by name

    def constant(self, name: str) -> Constant | None:
        return next((c for c in self.constants if c.name == name), None)

    def type_of(self, name: str) -> TensorType | None:
        """The type of a value, where the graph knows it."""
        for v in self.inputs + self.outputs + self.types:
            if v.name == name:
                return v.type
        c = self.constant(name)
        return None if c is None else c.type

    def __str__(self) -> str:
        opset = f" opset {self.opset}" if self.opset else ""
        captures = (f" captures({', '.join(format_name(c, '%') for c in self.captures)})"
                    if self.captures else "")
        lines = [f"graph {format_name(self.name)}({', '.join(map(str, self.inputs))}){captures} "
                 f"-> ({', '.join(map(str, self.outputs))}){opset} {{"]
        lines += [f"  {format_name(c.name, '%')} = constant {c.type} {format_array(c.array)}"
                  for c in self.constants]
        lines += [f"  {v}" for v in self.types]
        lines += [f"  {n}" for n in self.nodes]
        lines.append("}")
        return "\n".join(lines)


def reshape_target(src: Sequence[int], shape: Sequence[int], allow_zero: bool = False) -> list[int]:
    """ONNX Reshape's target ``shape`` for an input of shape ``src``: a 0 copies the
    input's dimension there (unless ``allow_zero``), and a single -1 takes what the
    others leave (several -1 stay as they are, for the caller to refuse)."""
    out = [src[k] if d == 0 and not allow_zero and k < len(src) else d for k, d in enumerate(shape)]
    if out.count(-1) == 1:
        known = math.prod(d for d in out if d != -1)
        out[out.index(-1)] = math.prod(src) // known if known else 0
    return out


def consumers(g: Graph) -> dict[str, list[Node]]:
    """The nodes reading each value, in order."""
    users: dict[str, list[Node]] = {}
    for n in g.nodes:
        for i in n.inputs:
            if i:
                users.setdefault(i, []).append(n)
    return users


def sole_use(g: Graph, users: dict[str, list[Node]], value: str) -> Node | None:
    """The one node reading ``value``, if exactly one does and it is not a graph output."""
    readers = users.get(value, [])
    if len(readers) != 1 or any(v.name == value for v in g.outputs):
        return None
    return readers[0]


def verify_graph(g: Graph) -> None:
    """Every value is defined once, before use; every output is defined."""
    defined: set[str] = set(g.captures)
    for v in g.inputs:
        _define(g, defined, v.name, "input")
    for c in g.constants:
        _define(g, defined, c.name, "constant")
    for n in g.nodes:
        for i in n.inputs:
            if i and i not in defined:
                raise IRVerificationError(f"graph '{g.name}': node '{n.name}' ({n.op}) reads "
                                          f"'{i}' before it is defined")
        for o in n.outputs:
            if o:
                _define(g, defined, o, f"output of node '{n.name}'")
        for body in n.subgraphs:
            verify_graph(body)
    for v in g.outputs:
        if v.name not in defined:
            raise IRVerificationError(f"graph '{g.name}': output '{v.name}' is never defined")


def _define(g: Graph, defined: set[str], name: str, what: str) -> None:
    if name in defined:
        raise IRVerificationError(f"graph '{g.name}': '{name}' is defined twice (again as {what})")
    defined.add(name)


def value_sources(graph: Graph, name: str) -> set[str]:
    """The inputs of ``graph`` whose values value ``name`` is computed from (``name``
    itself, if an input): the nodes producing it, back to the inputs, but not through
    ``Shape`` and ``Size``, whose outputs the shapes alone give."""
    inputs = {v.name for v in graph.inputs}
    producer = {out: node for node in graph.nodes for out in node.outputs}
    found: set[str] = set()
    seen: set[str] = set()
    pending = [name]
    while pending:
        value = pending.pop()
        if value in seen or not value:
            continue
        seen.add(value)
        if value in inputs:
            found.add(value)
        node = producer.get(value)
        if node is not None and node.op not in ("Shape", "Size"):
            pending.extend(node.inputs)
    return found
