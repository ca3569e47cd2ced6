"""What ATen lowerings build with: graph values, constants and nodes of the graph IR.

A lowering sees the FX node's arguments with every FX node replaced by what it became:
a :class:`Tensor` (a graph value with its dtype and shape), a :class:`Size` (a symbolic
size, held in the graph as a one-element int64 tensor so shapes built from it are graph
values the planner folds once sizes are bound), a tuple of those (multi-output ops), or
a Python value. Lowerings add nodes with :meth:`Builder.op` and return the name of the
value (or names of the values) the FX node defines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from polyfuse.errors import UnsupportedOpError
from polyfuse.ir.graph import Constant, Dim, Node
from polyfuse.ir.types import DType

# the opset the graph ops follow (reduction axes are inputs; ReduceMax takes bool)
OPSET = 20


@dataclass(frozen=True, slots=True)
class Tensor:
    name: str
    dtype: DType
    shape: tuple[Dim, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(frozen=True, slots=True)
class Size:
    """A symbolic size: the graph value ``name`` is an int64 tensor of shape (1,)."""

    name: str


class Unsupported(UnsupportedOpError):
    """A node the registry has a lowering for but not with these arguments."""


class Builder:
    """Collects the nodes and constants of one graph; names derive from FX node names."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.constants: dict[str, Constant] = {}
        self._scalars: dict[tuple, str] = {}
        self._taken: set[str] = set()
        self.prefix = "v"
        self.used: set[int] = set()   # the outputs of the node being lowered that are read
        self._first = False

    def start(self, name: str, used: set[int]) -> None:
        """Lower the FX node ``name`` next (``used``: which of its outputs are read); the
        first value it makes takes its name."""
        self.prefix, self.used, self._first = name, used, True

    def fresh(self, stem: str | None = None) -> str:
        if stem is None and self._first:
            self._first = False
            self._taken.add(self.prefix)
            return self.prefix
        stem = stem or self.prefix
        name, k = stem, 0
        while name in self._taken:
            k += 1
            name = f"{stem}.{k}"
        self._taken.add(name)
        return name

    def reserve(self, name: str) -> None:
        self._taken.add(name)

    def op(self, op: str, inputs: list[str | Tensor | Size | None], outputs: int = 1,
           **attrs: Any) -> Any:
        """Add a node; the name of its output (a tuple of names when ``outputs`` > 1)."""
        names = tuple(self.fresh() for _ in range(outputs))
        ins = tuple("" if i is None else i if isinstance(i, str) else i.name for i in inputs)
        self.nodes.append(Node(op, self.fresh(f"{self.prefix}:{op}"), ins, names,
                               tuple(sorted(attrs.items()))))
        return names[0] if outputs == 1 else names

    def constant(self, array: np.ndarray, stem: str = "const") -> str:
        name = self.fresh(stem)
        self.constants[name] = Constant(name, array)
        return name

    def scalar(self, value: Any, dtype: DType) -> str:
        """A 0-d constant of ``dtype`` (shared by every use of the same value)."""
        key = (repr(value), dtype)
        if key not in self._scalars:
            self._scalars[key] = self.constant(np.array(value, dtype.numpy), "scalar")
        return self._scalars[key]

    def ints(self, values: list[int] | tuple[int, ...]) -> str:
        return self.constant(np.array(values, np.int64), "ints")

    def shape(self, sizes: Any) -> str:
        """An int64 shape tensor of ``sizes`` (ints and symbolic :class:`Size` values)."""
        sizes = list(sizes)
        if all(isinstance(s, (int, np.integer)) for s in sizes):
            return self.ints([int(s) for s in sizes])
        parts = [s.name if isinstance(s, Size) else self.ints([int(s)]) for s in sizes]
        return self.op("Concat", parts, axis=0)

    def cast(self, x: Tensor | str, frm: DType, to: DType) -> str:
        name = x if isinstance(x, str) else x.name
        return name if frm is to else self.op("Cast", [name], to=to.value)

    def operand(self, x: Any, dtype: DType) -> str:
        """``x`` (a tensor or a Python number) as a graph value of ``dtype``; a name is a
        value a lowering made in ``dtype``."""
        if isinstance(x, str):
            return x
        if isinstance(x, Tensor):
            return self.cast(x, x.dtype, dtype)
        if isinstance(x, Size):
            return self.cast(x.name, DType.INT64, dtype)
        if isinstance(x, (bool, int, float, np.number)):
            return self.scalar(x, dtype)
        raise Unsupported(f"an operand {x!r} is neither a tensor nor a number")
