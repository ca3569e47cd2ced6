"""The op library: every graph op written as comprehension statements (TC text).

A lowering is a small function registered for one or more op types. It sees the
node, the concrete types of its inputs and the values of its constant inputs, and
returns one of:

* :class:`TCKernel`: a TC definition computing the node (one scheduler and every
  target then serve graphs and TC alike);
* :class:`View`: the output is an input with another shape (Reshape, Squeeze, ...);
* :class:`Folded`: the outputs are known at compile time (Shape, Constant, ...).

Kernels whose inputs are all constants are evaluated at compile time (folding).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from polyfuse.errors import UnsupportedOpError
from polyfuse.ir.graph import Node, TensorType
from polyfuse.ir.types import DType


@dataclass(frozen=True)
class TCKernel:
    """``source`` defines one TC def whose parameters are the node inputs ``inputs``
    (positions, in order), then ``constants``, and whose first ``len(outputs)`` outputs
    are the node outputs at positions ``outputs``; later TC outputs are temporaries."""

    source: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...] = (0,)
    # arrays computed at compile time (e.g. weights repacked for the kernel), passed
    # as the parameters after the node inputs, in this order
    constants: tuple[np.ndarray, ...] = ()


@dataclass(frozen=True)
class View:
    input: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Folded:
    arrays: tuple[np.ndarray, ...]


Lowered = TCKernel | View | Folded


class NeedsValue(UnsupportedOpError):
    """A lowering needs the value of ``value_name`` at compile time; the model runtime
    specializes on it when it is a small graph input."""

    def __init__(self, message: str, value_name: str) -> None:
        super().__init__(message)
        self.value_name = value_name


@dataclass
class OpContext:
    node: Node
    types: list[TensorType | None]        # concrete input types; None for omitted inputs
    values: list[np.ndarray | None]       # constant inputs' values, else None
    opset: int

    def attr(self, key: str, default: Any = None) -> Any:
        return self.node.attr(key, default)

    def shape(self, i: int) -> tuple[int, ...]:
        t = self.types[i]
        assert t is not None
        return tuple(int(d) for d in t.shape)

    def dtype(self, i: int) -> DType:
        t = self.types[i]
        assert t is not None
        return t.dtype

    def has(self, i: int) -> bool:
        return i < len(self.types) and self.types[i] is not None

    def const(self, i: int, what: str) -> np.ndarray:
        """The value of input ``i``, which the lowering needs at compile time."""
        if not self.has(i) or self.values[i] is None:
            raise NeedsValue(
                f"node '{self.node.name}' ({self.node.op}) needs its {what} (input {i}) to be a "
                "constant or computable from shapes at compile time", self.node.inputs[i])
        return self.values[i]  # type: ignore[return-value]

    def unsupported(self, why: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"node '{self.node.name}' ({self.node.op}): {why}")


Lowering = Callable[[OpContext], Lowered]
OPS: dict[str, Lowering] = {}


def register(*ops: str) -> Callable[[Lowering], Lowering]:
    def add(fn: Lowering) -> Lowering:
        for op in ops:
            OPS[op] = fn
        return fn
    return add


# --- helpers for writing TC -------------------------------------------------------------

INDEX = [f"i{k}" for k in range(16)]


def tensor_param(name: str, t: TensorType | tuple[DType, Sequence[int]]) -> str:
    dtype, shape = (t.dtype, t.shape) if isinstance(t, TensorType) else t
    return f"{dtype}({', '.join(str(int(d)) for d in shape)}) {name}"


def access(name: str, indices: Sequence[str]) -> str:
    return f"{name}({', '.join(indices)})"


def broadcast_indices(shape: Sequence[int], out_shape: Sequence[int],
                      names: Sequence[str] = INDEX) -> list[str]:
    """numpy broadcasting: the indices reading ``shape`` at an element of ``out_shape``."""
    offset = len(out_shape) - len(shape)
    return ["0" if d == 1 and out_shape[offset + k] != 1 else names[offset + k]
            for k, d in enumerate(shape)]


def broadcast_shape(*shapes: Sequence[int]) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*(tuple(s) for s in shapes)))
    except ValueError as err:
        raise UnsupportedOpError(f"shapes {list(map(tuple, shapes))} do not broadcast") from err


def ranges(shape: Sequence[int], names: Sequence[str] = INDEX) -> str:
    """A where clause fixing each index to its extent (for outputs range inference
    cannot size, e.g. broadcasts of size-1 dimensions)."""
    parts = [f"{names[k]} in 0:{int(d)}" for k, d in enumerate(shape)]
    return f" where {', '.join(parts)}" if parts else ""


def literal(value: float | int | bool, dtype: DType) -> str:
    if dtype.is_bool:
        return f"bool({int(bool(value))})"
    if dtype.is_int:
        return f"{dtype}({int(value)})"
    v = float(value)
    if np.isnan(v):
        return f"{dtype}(0.0 / 0.0)"
    if np.isinf(v):
        return f"{dtype}({'-' if v < 0 else ''}1.0 / 0.0)"
    return f"{dtype}({v!r})"


def onnx_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _load_library() -> None:
    """Import every op group so its lowerings register (kept last: they import this module)."""
    import importlib
    import pkgutil
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


_load_library()
