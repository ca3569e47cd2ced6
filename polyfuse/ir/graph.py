"""Graph IR: a typed DAG of ops, constants and inputs (what an ONNX model says).

Values are named; each node reads values and defines new ones. Shapes may hold
symbolic dimensions (strings) until they are bound by the inputs of a call.
Attributes are kept as ONNX gives them (ints, floats, strings, tuples of those,
arrays for tensor attributes). ``str(graph)`` prints one line per node.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polyfuse.errors import IRVerificationError
from polyfuse.ir.types import DType

Dim = int | str


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
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


@dataclass(frozen=True, slots=True)
class Value:
    name: str
    type: TensorType

    def __str__(self) -> str:
        return f"%{self.name}: {self.type}"


@dataclass(frozen=True, eq=False)
class Constant:
    """A weight or folded value; equal when the data is."""

    name: str
    array: np.ndarray = field(repr=False)

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

    def __str__(self) -> str:
        attrs = "".join(f", {k}={_format_attr(v)}" for k, v in self.attrs)
        outs = ", ".join(f"%{o}" for o in self.outputs)
        ins = ", ".join(f"%{i}" if i else "_" for i in self.inputs)
        group = f" @{self.group}" if self.group else ""
        return f"{outs} = {self.op}({ins}{attrs})  # {self.name}{group}"


def _format_attr(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"tensor<{v.dtype}{list(v.shape)}>"
    if isinstance(v, tuple):
        return "[" + ", ".join(_format_attr(x) for x in v) + "]"
    return repr(v)


@dataclass(frozen=True)
class Graph:
    name: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    nodes: tuple[Node, ...]
    constants: tuple[Constant, ...] = ()
    opset: int = 0

    def constant(self, name: str) -> Constant | None:
        return next((c for c in self.constants if c.name == name), None)

    def __str__(self) -> str:
        lines = [f"graph {self.name}({', '.join(map(str, self.inputs))}) "
                 f"-> ({', '.join(map(str, self.outputs))}) {{"]
        lines += [f"  %{c.name} = constant {c.type}" for c in self.constants]
        lines += [f"  {n}" for n in self.nodes]
        lines.append("}")
        return "\n".join(lines)


def verify_graph(g: Graph) -> None:
    """Every value is defined once, before use; every output is defined."""
    defined: set[str] = set()
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
    for v in g.outputs:
        if v.name not in defined:
            raise IRVerificationError(f"graph '{g.name}': output '{v.name}' is never defined")


def _define(g: Graph, defined: set[str], name: str, what: str) -> None:
    if name in defined:
        raise IRVerificationError(f"graph '{g.name}': '{name}' is defined twice (again as {what})")
    defined.add(name)
