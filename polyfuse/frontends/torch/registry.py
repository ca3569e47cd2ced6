"""The registry of ATen op -> graph-op lowerings, and how FX targets are named in it.

Ops are named as torch prints them (``aten.add.Tensor``, ``aten.sym_size.int``);
Python operators on sizes and tuples as ``operator.mul``, ``operator.getitem``. A
lowering is called as ``fn(builder, out, *args, **kwargs)``: ``out`` is what the FX
node computes (a :class:`~polyfuse.frontends.torch.builder.Tensor` without a name, a
tuple of them, or a :class:`Size`), the arguments are those of the FX node with each
FX node replaced by what it became. It returns the graph value(s) the node defines.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Lowering = Callable[..., Any]

LOWERINGS: dict[str, Lowering] = {}


def register(*names: str) -> Callable[[Lowering], Lowering]:
    def add(fn: Lowering) -> Lowering:
        for name in names:
            LOWERINGS[name] = fn
        return fn
    return add


def op_name(target: Any) -> str:
    """The registry's name of an FX ``call_function`` target."""
    module = getattr(target, "__module__", None)
    if type(target).__name__ in ("OpOverload", "OpOverloadPacket"):
        return str(target)
    name = getattr(target, "__name__", str(target))
    if module in ("_operator", "operator"):
        return f"operator.{name}"
    return f"{module}.{name}" if module else name
