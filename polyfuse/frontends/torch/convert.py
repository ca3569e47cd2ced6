"""FX graphs of ATen ops -> graph IR.

Each FX node's ``meta["val"]`` (a fake tensor, a SymInt or a tuple of them) gives the
dtype and shape of what it computes; sizes torch holds as SymInts stay symbolic: they
are the dimension names of the graph's inputs and outputs (``s0``), and values of the
graph (one-element int64 tensors) where ops use them, which the planner folds once the
inputs' sizes are known. Nodes the registry cannot lower are reported together, each
with the line of the user's code that made it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.fx

from polyfuse.errors import UnsupportedOpError
from polyfuse.frontends.torch.builder import OPSET, Builder, Size, Tensor, Unsupported
from polyfuse.frontends.torch.registry import LOWERINGS, op_name
from polyfuse.ir.graph import Constant, Dim, Graph, TensorType, Value
from polyfuse.ir.types import DType

from polyfuse.frontends.torch import aten_elementwise, aten_nn, aten_shape

# the modules whose lowerings fill the registry (importing them registers them)
OP_MODULES = (aten_elementwise, aten_nn, aten_shape)

DTYPES = {torch.float32: DType.FLOAT32, torch.float64: DType.FLOAT64, torch.float16: DType.FLOAT16,
          torch.bfloat16: DType.BFLOAT16, torch.int8: DType.INT8, torch.int16: DType.INT16,
          torch.int32: DType.INT32, torch.int64: DType.INT64, torch.uint8: DType.UINT8,
          torch.bool: DType.BOOL}


@dataclass(frozen=True)
class Rejection:
    """A node polyfuse cannot lower: its op, its FX name, where the user's code made it,
    and why (when the op is known but not with these arguments)."""

    op: str
    node: str
    location: str
    reason: str = ""

    def __str__(self) -> str:
        why = f": {self.reason}" if self.reason else ""
        where = f" at {self.location}" if self.location else ""
        return f"{self.op} (node '{self.node}'{where}){why}"


def location(node: torch.fx.Node) -> str:
    """``file:line in function: code`` of the user's code that made ``node``, from the
    innermost frame of its FX stack trace; "" when it has none."""
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines()]
    for k in range(len(lines) - 1, -1, -1):
        if lines[k].startswith("File "):
            parts = lines[k].split(", ")
            file = parts[0].removeprefix("File ").strip('"')
            line = parts[1].removeprefix("line ") if len(parts) > 1 else "?"
            fn = parts[2].removeprefix("in ") if len(parts) > 2 else ""
            code = lines[k + 1] if k + 1 < len(lines) and not lines[k + 1].startswith("File ") else ""
            return f"{file}:{line} in {fn}" + (f": {code}" if code else "")
    return ""


def dims(shape: Any) -> tuple[Dim, ...]:
    """Sizes as the graph IR holds them: ints, or the SymInt's expression as a name."""
    out: list[Dim] = []
    for d in shape:
        if isinstance(d, int):
            out.append(int(d))
        elif isinstance(d, torch.SymInt) and d.node.is_constant():
            out.append(int(d.node.maybe_as_int()))
        else:
            out.append(str(d).replace(" ", ""))
    return tuple(out)


def dtype(t: torch.dtype) -> DType:
    dt = DTYPES.get(t)
    if dt is None:
        raise Unsupported(f"tensors of {t}, which polyfuse does not support")
    return dt


def _described(val: Any) -> Any:
    """What an FX node computes, as lowerings see it (tensors without names)."""
    if isinstance(val, torch.Tensor):
        return Tensor("", dtype(val.dtype), dims(val.shape))
    if isinstance(val, torch.SymInt):
        return Size("")
    if isinstance(val, (tuple, list)):
        return tuple(_described(v) for v in val)
    if val is None or isinstance(val, (int, float, bool)):
        return val
    raise Unsupported(f"a value of type {type(val).__name__}")


def _named(out: Any, got: Any) -> Any:
    """``out`` (from :func:`_described`) with the graph values the lowering made."""
    if isinstance(out, Tensor):
        return Tensor(got, out.dtype, out.shape)
    if isinstance(out, Size):
        return Size(got) if isinstance(got, str) else got
    if isinstance(out, tuple):
        return tuple(None if g is None else _named(o, g) for o, g in zip(out, got))
    return got


def used_outputs(node: torch.fx.Node) -> set[int]:
    """The outputs of a multi-output node that its users read (through getitem)."""
    used: set[int] = set()
    for user in node.users:
        if user.op == "call_function" and op_name(user.target) == "operator.getitem":
            used.add(int(user.args[1]))
        else:
            used.update(range(64))
    return used


def graph_input(node: torch.fx.Node) -> Value:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return Value(node.name, TensorType(dtype(val.dtype), dims(val.shape)))
    if isinstance(val, torch.SymInt):   # fed as a one-element int64 tensor
        return Value(node.name, TensorType(DType.INT64, (1,)))
    raise Unsupported(f"input '{node.name}' is a {type(val).__name__}, not a tensor or a size")


class Converter:
    """One FX graph into one graph IR graph; ``constants`` gives the arrays of placeholders
    that are weights (torch.export's parameters and buffers)."""

    def __init__(self, gm: torch.fx.GraphModule, constants: Mapping[str, np.ndarray] | None = None) -> None:
        self.gm = gm
        self.weights = dict(constants or {})
        self.b = Builder()
        self.env: dict[torch.fx.Node, Any] = {}
        self.inputs: list[Value] = []
        self.rejected: list[Rejection] = []
        for n in gm.graph.nodes:
            self.b.reserve(n.name)

    def run(self, name: str = "torch") -> Graph:
        outputs: list[Value] = []
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self._placeholder(node)
            elif node.op == "get_attr":
                self._get_attr(node)
            elif node.op == "call_function":
                self._call(node)
            elif node.op == "output":
                outputs = self._outputs(node)
            else:
                self.rejected.append(Rejection(f"{node.op} {node.target}", node.name, location(node)))
        if self.rejected:
            raise unsupported_error(self.rejected)
        graph = Graph(name, tuple(self.inputs), tuple(outputs), tuple(self.b.nodes),
                      tuple(self.b.constants.values()), OPSET)
        return graph

    def _placeholder(self, node: torch.fx.Node) -> None:
        if node.name in self.weights:
            array = self.weights[node.name]
            self.b.constants[node.name] = Constant(node.name, array)
            self.env[node] = Tensor(node.name, DType.from_numpy(array.dtype), array.shape)
            return
        try:
            value = graph_input(node)
        except Unsupported as err:
            self.rejected.append(Rejection("input", node.name, location(node), str(err)))
            return
        self.inputs.append(value)
        val = node.meta["val"]
        self.env[node] = Size(node.name) if isinstance(val, torch.SymInt) \
            else Tensor(node.name, value.type.dtype, value.type.shape)

    def _get_attr(self, node: torch.fx.Node) -> None:
        value = self.gm
        for part in str(node.target).split("."):
            value = getattr(value, part)
        if not isinstance(value, torch.Tensor):
            self.rejected.append(Rejection("get_attr", node.name, location(node),
                                           f"'{node.target}' is not a tensor"))
            return
        array = to_numpy(value)
        self.b.constants[node.name] = Constant(node.name, array)
        self.env[node] = Tensor(node.name, dtype(value.dtype), tuple(array.shape))

    def _call(self, node: torch.fx.Node) -> None:
        name = op_name(node.target)
        lowering = LOWERINGS.get(name)
        if lowering is None:
            self.rejected.append(Rejection(name, node.name, location(node)))
            return
        if self._missing(node):
            return   # an input was rejected; that is reported already
        args, kwargs = self._resolve(node.args), self._resolve(node.kwargs)
        self.b.start(node.name, used_outputs(node))
        try:
            out = _described(node.meta.get("val"))
            got = lowering(self.b, out, *args, **kwargs)
        except (Unsupported, TypeError) as err:
            reason = str(err) if isinstance(err, Unsupported) else f"arguments not understood ({err})"
            self.rejected.append(Rejection(name, node.name, location(node), reason))
            return
        self.env[node] = _named(out, got)

    def _missing(self, node: torch.fx.Node) -> bool:
        return any(isinstance(a, torch.fx.Node) and a not in self.env for a in node.all_input_nodes)

    def _resolve(self, value: Any) -> Any:
        if isinstance(value, torch.fx.Node):
            return self.env.get(value)
        if isinstance(value, (list, tuple)):
            resolved = [self._resolve(v) for v in value]
            return tuple(resolved) if isinstance(value, tuple) else resolved
        if isinstance(value, dict):
            return {k: self._resolve(v) for k, v in value.items()}
        return value

    def _outputs(self, node: torch.fx.Node) -> list[Value]:
        results = node.args[0]
        results = list(results) if isinstance(results, (list, tuple)) else [results]
        outputs: list[Value] = []
        taken = {v.name for v in self.inputs} | set(self.b.constants)
        for r in results:
            value = self.env.get(r) if isinstance(r, torch.fx.Node) else r
            if not isinstance(value, Tensor):
                if not self._missing(node):
                    self.rejected.append(Rejection("output", str(r), location(node),
                                                   f"an output is {type(value).__name__}, not a tensor"))
                continue
            name = value.name
            if name in taken:   # an input, constant or earlier output returned again
                self.b.start(f"{name}.out", set())
                name = self.b.op("Identity", [name])
            taken.add(name)
            outputs.append(Value(name, TensorType(value.dtype, value.shape)))
        return outputs


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as a numpy array (bfloat16 through ml_dtypes)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.contiguous().numpy()


def unsupported_error(rejected: list[Rejection]) -> UnsupportedOpError:
    ops = sorted({r.op for r in rejected})
    listing = "; ".join(str(r) for r in rejected[:8]) + ("; ..." if len(rejected) > 8 else "")
    return UnsupportedOpError(f"the graph uses {len(ops)} op{'s' if len(ops) > 1 else ''} polyfuse "
                              f"cannot compile ({', '.join(ops)}): {listing}")


def to_graph(gm: torch.fx.GraphModule, *, constants: Mapping[str, np.ndarray] | None = None,
             name: str = "torch") -> Graph:
    """The graph IR of an FX graph of ATen ops (placeholders named in ``constants`` are
    weights); every op it cannot lower is listed in one :class:`UnsupportedOpError`."""
    return Converter(gm, constants).run(name)
