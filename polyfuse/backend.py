"""polyfuse as an ONNX backend (the interface ``onnx.backend.test`` drives).

    import polyfuse.backend as backend
    rep = backend.prepare(model)            # compile
    outputs = rep.run([x])                   # list of arrays, in the graph's output order

The target is the host CPU's native code; set ``POLYFUSE_BACKEND_TARGET=reference``
to run through the numpy interpreter instead.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from polyfuse.driver import compile as compile_model
from polyfuse.frontends.onnx_schema import dtype_of
from polyfuse.runtime.model import CompiledModel


def _target() -> str:
    return os.environ.get("POLYFUSE_BACKEND_TARGET", "host")


class PolyfuseRep(BackendRep):
    def __init__(self, model: CompiledModel) -> None:
        self.model = model

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, dict):
            feed = inputs
        else:
            arrays = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            feed = {v.name: a for v, a in zip(self.model.inputs, arrays)}
        out = self.model.run(feed)
        return tuple(out[v.name] for v in self.model.outputs)


class PolyfuseBackend(Backend):
    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> PolyfuseRep:
        return PolyfuseRep(compile_model(model, target=_target()))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper().startswith("CPU")

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        ops = supported_ops()
        if not all(n.op_type in ops and n.domain in ("", "ai.onnx") for n in _nodes(model.graph)):
            return False
        values = list(model.graph.input) + list(model.graph.output)
        return all(v.type.HasField("tensor_type") and dtype_of(v.type.tensor_type.elem_type)
                   for v in values)


def _nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes of ``graph`` and of its nodes' subgraphs (bodies, branches)."""
    found = []
    for n in graph.node:
        found.append(n)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                found += _nodes(a.g)
    return found


def supported_ops() -> set[str]:
    """Op types polyfuse lowers (``Constant`` is read by the front end; control flow is
    planned or run around its subgraphs)."""
    from polyfuse.ir.graph import SUBGRAPH_ATTRS
    from polyfuse.lowering.ops import OPS
    return set(OPS) | {"Constant"} | set(SUBGRAPH_ATTRS)


prepare = PolyfuseBackend.prepare
run_model = PolyfuseBackend.run_model
run_node = PolyfuseBackend.run_node
supports_device = PolyfuseBackend.supports_device
is_compatible = PolyfuseBackend.is_compatible
