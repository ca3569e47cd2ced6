"""The ``torch.compile`` backend: ``torch.compile(model, backend="polyfuse")``.

AOTAutograd traces what dynamo captured into graphs of core ATen ops (a forward graph,
and a backward graph when gradients are needed); each graph is partitioned by
torch's ``CapabilityBasedPartitioner`` into the parts polyfuse can lower, each part is
compiled as one polyfuse program, and the rest stays eager PyTorch (the ops left out are
logged once each, on the ``polyfuse.torch`` logger). Tensors cross as numpy views of
the same memory, and CUDA tensors as they are on the ``cuda`` target
(:mod:`polyfuse.torch.tensors`); sizes dynamo keeps symbolic
(``dynamic=True``) stay symbolic in the compiled programs, which plan each new size once.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from polyfuse.driver import compile_graph
from polyfuse.errors import OptionError, UnsupportedOpError
from polyfuse.frontends.torch import rejection, to_graph, to_numpy
from polyfuse.runtime.model import CompiledModel
from polyfuse.targets import Target
from polyfuse.torch.tensors import operand, tensor

logger = logging.getLogger("polyfuse.torch")
_logged: set[str] = set()


@dataclass(frozen=True)
class BackendOptions:
    """``torch.compile(..., options={...})``: the target polyfuse compiles for and the
    tuning records its kernels take their schedules from."""

    target: str = "host"
    tuning_records: str | os.PathLike | None = None

    @staticmethod
    def of(options: Mapping[str, Any] | None) -> BackendOptions:
        options = dict(options or {})
        known = {"target", "tuning_records"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise OptionError(f"the polyfuse backend has no option {', '.join(map(repr, unknown))}; "
                              f"its options are {sorted(known)}")
        return BackendOptions(**options)


def matmul_precision() -> str:
    """``"tf32"`` where torch lets float32 products run on TF32 tensor cores
    (``torch.backends.cuda.matmul.allow_tf32``, or a float32 matmul precision other than
    ``"highest"``), else ``"ieee"``: the precision compiled parts follow."""
    allowed = torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
    return "tf32" if allowed else "ieee"


class _Supported(OperatorSupportBase):
    """ATen ops the front end lowers; ops that compute sizes stay with torch, which
    passes them to the compiled parts."""

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: torch.fx.Node) -> bool:
        if node.op != "call_function" or not _is_tensors(node.meta.get("val")):
            return False
        reason = rejection(node)
        if reason is not None:
            _log_once(reason.op, reason)
        return reason is None


def _log_once(what: str, why: object) -> None:
    if what not in _logged:
        _logged.add(what)
        logger.info("polyfuse leaves %s to eager PyTorch: %s", what, why)


def _is_tensors(val: Any) -> bool:
    if isinstance(val, torch.Tensor):
        return True
    return isinstance(val, (tuple, list)) and bool(val) and \
        all(v is None or isinstance(v, torch.Tensor) for v in val)


class CompiledPart(torch.nn.Module):
    """One partition as a compiled polyfuse program, called as the FX submodule was.

    Inputs at the positions ``frozen`` are weights (parameters and buffers of an
    inference graph): they are compiled in as constants from their values at the first
    call, so the graph passes fold and repack them; a later call with other weight
    tensors, or after they changed in place (their version counter moved), compiles
    again."""

    def __init__(self, sub: torch.fx.GraphModule, options: BackendOptions, name: str,
                 frozen: Sequence[int] = ()) -> None:
        super().__init__()
        self.eager = sub               # the part as torch runs it, for sizes polyfuse refuses
        self.options, self.name, self.frozen = options, name, tuple(frozen)
        self.target = Target.parse(options.target)
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        self.placeholders = [p.name for p in placeholders]
        self.position = {p.name: k for k, p in enumerate(placeholders)}
        self.sizes = {p.name for p in placeholders if isinstance(p.meta.get("val"), torch.SymInt)}
        output = next(n for n in sub.graph.nodes if n.op == "output")
        self.several = isinstance(output.args[0], (tuple, list))   # the part returns a tuple
        self._weights: list[tuple[torch.Tensor, int]] = []
        self.model: CompiledModel | None = None if self.frozen else self._build(())

    def _build(self, args: Sequence[Any]) -> CompiledModel:
        constants = {self.placeholders[k]: to_numpy(args[k]).copy() for k in self.frozen}
        graph = to_graph(self.eager, constants=constants, name=self.name)
        return compile_graph(graph, self.options.target, tuning_records=self.options.tuning_records,
                             passes=True, precision=matmul_precision())

    def _compiled(self, args: Sequence[Any]) -> CompiledModel:
        weights = [args[k] for k in self.frozen]
        if self.model is None or any(a is not w or a._version != v
                                     for a, (w, v) in zip(weights, self._weights)):
            self.model = self._build(args)
            self._weights = [(w, w._version) for w in weights]
        return self.model

    def forward(self, *args: Any) -> Any:
        model = self._compiled(args)
        feed = {}
        for v in model.inputs:
            a = args[self.position[v.name]]
            feed[v.name] = np.array([int(a)], np.int64) if v.name in self.sizes else \
                operand(a, self.target, f"input '{v.name}'")
        try:
            results = model.run(feed)
        except UnsupportedOpError as err:   # planning for these sizes needs what polyfuse lacks
            _log_once(f"{self.name} at these sizes", err)
            return self.eager(*args)
        outs = tuple(tensor(a) for a in results.values())
        return outs if self.several else outs[0]


def compile_part(sub: torch.fx.GraphModule, inputs: Sequence[Any], options: BackendOptions,
                 name: str = "part", weights: frozenset[str] = frozenset()) -> CompiledPart:
    """A partition's submodule compiled; ``inputs`` are the nodes it is called with (whose
    ``meta["val"]`` the submodule's placeholders may lack), those named in ``weights``
    compiled in as constants."""
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    for p, arg in zip(placeholders, inputs):
        if "val" not in p.meta and isinstance(arg, torch.fx.Node):
            p.meta["val"] = arg.meta.get("val")
    frozen = [k for k, arg in enumerate(inputs) if isinstance(arg, torch.fx.Node) and arg.name in weights]
    return CompiledPart(sub, options, name, frozen)


def _weights(gm: torch.fx.GraphModule) -> frozenset[str]:
    """The placeholders of an AOTAutograd graph that are parameters and buffers (by name:
    partitioning copies the graph's nodes)."""
    from torch._guards import TracingContext
    context = TracingContext.try_get()
    static = getattr(getattr(context, "fw_metadata", None), "static_input_indices", None) or ()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return frozenset(placeholders[k].name for k in static if k < len(placeholders))


def compile_partitioned(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                        options: BackendOptions, freeze: bool = False) -> Any:
    """``gm`` with its polyfuse-supported parts replaced by compiled programs (called
    boxed, with a list of arguments, as AOTAutograd prefers); with ``freeze`` (inference
    graphs), weights are compiled in as constants."""
    from torch._functorch.aot_autograd import make_boxed_func
    partitioner = CapabilityBasedPartitioner(gm, _Supported(), allows_single_node_partition=True)
    partitions = partitioner.propose_partitions()
    if not partitions:
        return make_boxed_func(gm)
    weights = _weights(gm) if freeze else frozenset()
    fused = partitioner.fuse_partitions(partitions)
    for node in list(fused.graph.nodes):
        if node.op == "call_module" and str(node.target).startswith("fused_"):
            sub = getattr(fused, str(node.target))
            part = compile_part(sub, list(node.args), options, str(node.target), weights)
            setattr(fused, str(node.target), part)
    fused.recompile()
    return make_boxed_func(fused)


def decompositions() -> dict:
    """The decompositions AOTAutograd applies: torch's core ATen table."""
    from torch._decomp import core_aten_decompositions
    return dict(core_aten_decompositions())


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
            options: Mapping[str, Any] | None = None, mode: str | None = None) -> Any:
    """The dynamo backend (``torch.compile(model, backend=polyfuse.torch.backend)``)."""
    from torch._dynamo.backends.common import aot_autograd
    opts = BackendOptions.of(options)
    compiler = functools.partial(compile_partitioned, options=opts)
    inference = functools.partial(compile_partitioned, options=opts, freeze=True)
    return aot_autograd(fw_compiler=compiler, bw_compiler=compiler, inference_compiler=inference,
                        decompositions=decompositions())(gm, example_inputs)
