"""The op library: every graph op written as comprehension statements (TC text).

A lowering is a small function registered for one or more op types. It sees the
node, the concrete types of its inputs and the values of its constant inputs, and
returns one of:

* :class:`TCKernel`: a TC definition computing the node (one scheduler and every
  target then serve graphs and TC alike);
* :class:`View`: the output is an input with another shape (Reshape, Squeeze, ...);
* :class:`Folded`: the outputs are known at compile time (Shape, Constant, ...);
* :class:`Counted`: a kernel writing outputs whose size the data decides (NonZero, ...)
  at an upper bound, and their count;
* :class:`Expanded`: other nodes computing the node (ops registered with
  ``expands=True``, which the planner expands before it plans them: RNN, GRU and LSTM
  into a projection and one step node per time step, NonMaxSuppression into kernels and a
  Loop).

A value of a narrow type (float8, int4, ...; see :mod:`polyfuse.ir.types`) reaches a
lowering as its storage type (``ctx.dtype``; ``ctx.element`` names the narrow type), so
movement ops need not know them; a kernel or view names the narrow types its outputs
hold (``narrow``), which :func:`lower` takes from the op's schema where the lowering
leaves it open.

Kernels whose inputs are all constants are evaluated at compile time (folding).

Every node goes through :func:`lower`, which first checks its inputs against the op's
ONNX schema. Lowerings check attributes against the input ranks and shapes with
:meth:`OpContext.axis`, ``axes``, ``ints``, ``rank`` and ``flag``: a malformed node is a
:class:`~polyfuse.errors.ModelError` (``ctx.malformed``), a valid one polyfuse cannot
compile an :class:`~polyfuse.errors.UnsupportedOpError` (``ctx.unsupported``); both name
the node and say what is allowed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np

from polyfuse.errors import ModelError, NeedsValue, UnsupportedOpError
from polyfuse.frontends.onnx_schema import check_signature, narrow_outputs
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
    # the narrow type each node output (positions as ``outputs``) holds in its storage
    # type, None for none; left None, the op's schema decides
    narrow: tuple[DType | None, ...] | None = None


@dataclass(frozen=True)
class View:
    """The output is input ``input``'s storage as ``shape``, starting ``offset`` elements
    in (a reshape at 0; a slice along the first dimension, such as one time step of a
    sequence, further in)."""

    input: int
    shape: tuple[int, ...]
    offset: int = 0
    narrow: tuple[DType | None, ...] | None = None   # as TCKernel's


@dataclass(frozen=True)
class Folded:
    arrays: tuple[np.ndarray, ...]


@dataclass(frozen=True)
class Counted:
    """A kernel whose outputs the data sizes (NonZero, Compress, Unique): it writes them
    at an upper bound of their size and, as the TC output after them, how many entries
    hold results (int64, one element). The node outputs at positions ``trims``
    (``(output, axis)``) hold that many entries along ``axis``; the runtime slices them
    (see :class:`~polyfuse.ir.plan.Trim`), other outputs are whole."""

    kernel: TCKernel
    trims: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Expanded:
    """The node as other nodes (kernels of the op library, control flow), planned in its
    place; ``constants`` are values they read that the lowering made."""

    nodes: tuple[Node, ...]
    constants: dict[str, np.ndarray] = field(default_factory=dict)


Lowered = TCKernel | View | Folded | Counted | Expanded


@dataclass
class OpContext:
    node: Node
    types: list[TensorType | None]        # concrete input types; None for omitted inputs
    values: list[np.ndarray | None]       # constant inputs' values, else None
    opset: int
    # the narrow type each input holds in its storage type (``types``), None for none
    narrow: list[DType | None] = field(default_factory=list)

    def attr(self, key: str, default: Any = None) -> Any:
        return self.node.attr(key, default)

    def shape(self, i: int) -> tuple[int, ...]:
        return tuple(int(d) for d in self.type(i).shape)

    def dtype(self, i: int) -> DType:
        return self.type(i).dtype

    def element(self, i: int) -> DType:
        """Input ``i``'s element type as the model declares it: a narrow type (float8,
        int4, ...) where ``dtype`` gives the storage type holding it."""
        return (self.narrow[i] if i < len(self.narrow) else None) or self.dtype(i)

    def declared(self) -> list[TensorType | None]:
        """The input types as the model declares them (narrow types included)."""
        return [t if t is None else TensorType(self.element(i), t.shape)
                for i, t in enumerate(self.types)]

    def type(self, i: int) -> TensorType:
        t = self.types[i] if i < len(self.types) else None
        if t is None:
            raise self.malformed(f"input {i} is missing; this op needs it (the node has "
                                 f"{len(self.node.inputs)} inputs)")
        return t

    def rank(self, i: int, *allowed: int, least: int = 0) -> int:
        """The rank of input ``i``, which must be one of ``allowed`` (if given) and at
        least ``least``."""
        r = len(self.type(i).shape)
        if allowed and r not in allowed or r < least:
            want = " or ".join(map(str, allowed)) if allowed else f"at least {least}"
            raise self.malformed(f"input {i} has rank {r} (shape {self.shape(i)}); it must have "
                                 f"rank {want}")
        return r

    def axis(self, value: Any, rank: int, what: str = "axis") -> int:
        """An ONNX axis (negative counts from the end) checked to be in [-rank, rank)."""
        if value is None:
            raise self.malformed(f"the {what} attribute is required")
        try:
            a = int(value)
        except (TypeError, ValueError):
            raise self.malformed(f"{what} must be an int, got {value!r}") from None
        if not -rank <= a < rank:
            allowed = f"in [{-rank}, {rank - 1}]" if rank else "absent (the input is a scalar)"
            raise self.malformed(f"{what} {a} is out of range for rank {rank}; it must be {allowed}")
        return a + rank if a < 0 else a

    def axes(self, values: Any, rank: int, what: str = "axes") -> list[int]:
        """ONNX axes, each checked by :meth:`axis`, none repeated."""
        axes = [self.axis(a, rank, what) for a in np.atleast_1d(np.asarray(values)).reshape(-1)]
        if len(set(axes)) != len(axes):
            raise self.malformed(f"{what} {list(np.asarray(values).reshape(-1))} name an axis "
                                 "twice; each may appear once")
        return axes

    def ints(self, value: Any, what: str, count: int | None = None, least: int | None = None) -> list[int]:
        """An ints attribute (or constant input) with ``count`` entries, each >= ``least``."""
        try:
            out = [int(v) for v in np.asarray(value).reshape(-1)]
        except (TypeError, ValueError):
            raise self.malformed(f"{what} must be ints, got {value!r}") from None
        if count is not None and len(out) != count:
            raise self.malformed(f"{what} {out} has {len(out)} entries; it must have {count}")
        if least is not None and any(v < least for v in out):
            raise self.malformed(f"{what} {out} must all be >= {least}")
        return out

    def flag(self, key: str, default: int) -> bool:
        """A 0/1 attribute (keepdims, transA, ...); any other value is refused, since
        runtimes read it differently (as != 0 or as == 1)."""
        value = self.attr(key, default)
        if not (isinstance(value, (int, np.integer)) and value in (0, 1)):
            raise self.malformed(f"attribute {key} is {value!r}; it must be 0 or 1")
        return bool(value)

    def element_type(self, key: str) -> DType | None:
        """The element type attribute ``key`` names (a dtype name such as ``"float32"``:
        the ONNX front end turns TensorProto codes into these), or None when absent."""
        value = self.attr(key)
        if value is None:
            return None
        try:
            return DType(value)
        except ValueError:
            raise self.malformed(f"attribute {key} must name an element type "
                                 f"({', '.join(d.value for d in DType)}), got {value!r}") from None

    def malformed(self, why: str) -> ModelError:
        """The error of a node whose attributes or inputs break the op's definition."""
        return ModelError(f"node '{self.node.name}' ({self.node.op}): {why}")

    def has(self, i: int) -> bool:
        return i < len(self.types) and self.types[i] is not None

    def const(self, i: int, what: str) -> np.ndarray:
        """The value of input ``i``, which the lowering needs at compile time."""
        if not self.has(i):
            raise self.malformed(f"its {what} (input {i}) is missing; give it")
        if self.values[i] is None:
            raise NeedsValue(
                f"node '{self.node.name}' ({self.node.op}) needs its {what} (input {i}) to be a "
                "constant or computable from shapes at compile time", self.node.inputs[i])
        return self.values[i]  # type: ignore[return-value]

    def unsupported(self, why: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"node '{self.node.name}' ({self.node.op}): {why}")


Lowering = Callable[[OpContext], Lowered]
OPS: dict[str, Lowering] = {}
# polyfuse's own ops, which only expansions make (a recurrence's steps): a model naming
# one is refused as unsupported, like any op outside OPS
INTERNAL: dict[str, Lowering] = {}
EXPANDS: set[str] = set()   # ops whose lowerings give Expanded


def lower(ctx: OpContext) -> Lowered:
    """The node lowered by its op's lowering, after the checks every op shares: its
    inputs against the op's ONNX schema (count, dtypes) and their ranks against the
    indices a TC text can name."""
    check_signature(ctx.node, ctx.declared(), ctx.opset)
    for i, t in enumerate(ctx.types):
        if t is not None and len(t.shape) > MAX_RANK:
            raise ctx.unsupported(f"input {i} has rank {len(t.shape)}; polyfuse supports "
                                  f"tensors of rank at most {MAX_RANK}")
    lowered = (OPS.get(ctx.node.op) or INTERNAL[ctx.node.op])(ctx)
    if isinstance(lowered, (TCKernel, View)) and lowered.narrow is None:
        narrow = narrow_outputs(ctx.node, ctx.declared(), ctx.opset) if any(ctx.narrow) else ()
        positions = lowered.outputs if isinstance(lowered, TCKernel) else (0,)
        lowered = replace(lowered, narrow=tuple(narrow[i] if i < len(narrow) else None
                                                for i in positions))
    return lowered


HeldLowering = TypeVar("HeldLowering", TCKernel, View)


def holding(lowered: HeldLowering, to: DType) -> HeldLowering:
    """``lowered``, whose output 0 holds values of ``to`` (perhaps a narrow type)."""
    return replace(lowered, narrow=(to if to.is_narrow else None,))


def register(*ops: str, internal: bool = False, expands: bool = False) -> Callable[[Lowering], Lowering]:
    def add(fn: Lowering) -> Lowering:
        for op in ops:
            (INTERNAL if internal else OPS)[op] = fn
            if expands:
                EXPANDS.add(op)
        return fn
    return add


# --- helpers for writing TC -------------------------------------------------------------

INDEX = [f"i{k}" for k in range(16)]
MAX_RANK = len(INDEX) - 1   # one index name spare, for ops adding a dimension (OneHot)


def tensor_param(name: str, t: TensorType | tuple[DType, Sequence[int]]) -> str:
    dtype, shape = (t.dtype, t.shape) if isinstance(t, TensorType) else t
    if len(shape) > MAX_RANK:
        raise UnsupportedOpError(f"a tensor of rank {len(shape)} (shape {tuple(shape)}); polyfuse "
                                 f"supports tensors of rank at most {MAX_RANK}")
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


def balanced(terms: Sequence[str], combine: Callable[[str, str], str], chain: int = 16) -> str:
    """``terms`` combined left to right, or as a balanced tree when there are more than
    ``chain`` of them (so a node with hundreds of inputs stays a shallow expression)."""
    if len(terms) <= chain:
        expr = terms[0]
        for t in terms[1:]:
            expr = combine(expr, t)
        return expr
    half = len(terms) // 2
    return combine(balanced(terms[:half], combine, chain), balanced(terms[half:], combine, chain))


def _load_library() -> None:
    """Import every op group so its lowerings register (kept last: they import this module)."""
    import importlib
    import pkgutil
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


_load_library()
