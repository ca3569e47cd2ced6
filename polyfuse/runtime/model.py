"""Compiled graphs: what ``polyfuse.compile`` returns.

A :class:`CompiledModel` holds the graph; for each set of input shapes it builds a
plan (cached): every node lowered through the op library, nodes with constant inputs
folded at compile time, reshapes turned into views, and every other node a TC kernel
compiled for the target. ``run`` checks the feed, then runs the plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from polyfuse.errors import ArgumentError, DTypeError, ShapeError
from polyfuse.frontends.tc import parse
from polyfuse.ir.comprehension_interpreter import interpret
from polyfuse.ir.graph import Graph, Node, TensorType, Value
from polyfuse.ir.types import DType
from polyfuse.lowering.ops import OPS, Folded, NeedsValue, OpContext, TCKernel, View
from polyfuse.runtime.arguments import bind_arguments
from polyfuse.runtime.kernel import Kernel
from polyfuse.scheduler.options import MappingOptions
from polyfuse.targets import Target


@dataclass
class _Step:
    node: Node
    run: Any                  # callable(env) -> None


# Small integer inputs (shapes, axes, indices fed at run time) are treated as constants
# when planning, and the plan is specialized to their values.
VALUE_INPUT_MAX = 64


class _Plan:
    def __init__(self, model: CompiledModel, shapes: dict[str, tuple[int, ...]],
                 values: dict[str, np.ndarray]) -> None:
        self.steps: list[_Step] = []
        g = model.graph
        types: dict[str, TensorType] = {v.name: TensorType(v.type.dtype, shapes[v.name])
                                        for v in g.inputs}
        consts: dict[str, np.ndarray] = {c.name: c.array for c in g.constants} | values
        types.update({c.name: c.type for c in g.constants})
        for node in g.nodes:
            ctx = OpContext(node, [types.get(i) if i else None for i in node.inputs],
                            [consts.get(i) if i else None for i in node.inputs], g.opset)
            lowered = OPS[node.op](ctx)
            if isinstance(lowered, Folded):
                for name, array in zip(node.outputs, lowered.arrays):
                    consts[name] = array
                    types[name] = _type(array)
            elif isinstance(lowered, View):
                src = node.inputs[lowered.input]
                types[node.outputs[0]] = TensorType(types[src].dtype, lowered.shape)
                if src in consts:
                    consts[node.outputs[0]] = consts[src].reshape(lowered.shape)
                else:
                    self.steps.append(_Step(node, _view(src, node.outputs[0], lowered.shape)))
            else:
                self.kernel(model, node, lowered, types, consts)
        self.consts = consts
        self.types = types
        self.memory = plan_memory(self.steps, types, {v.name for v in g.outputs})

    def kernel(self, model: CompiledModel, node: Node, k: TCKernel,
               types: dict[str, TensorType], consts: dict[str, np.ndarray]) -> None:
        d = parse(k.source).definitions[0]
        names = [node.inputs[i] for i in k.inputs]
        outs = [node.outputs[i] for i in k.outputs]
        if all(n in consts for n in names):  # fold at compile time with the interpreter
            bound = bind_arguments(d, [consts[n] for n in names])
            results = interpret(d, bound.values, bound.sizes)
            for name, t in zip(outs, d.outputs):
                consts[name] = results[t.name]
                types[name] = _type(results[t.name])
            return
        kernel = Kernel(d, model.target, k.source, model.options)
        dummies = [np.empty([int(x) for x in types[n].shape], types[n].dtype.numpy) for n in names]
        spec = kernel.specialize(*dummies)
        for name, t, shape in zip(outs, d.outputs, spec.output_shapes):
            types[name] = TensorType(t.dtype, shape)
        params = [p.name for p in d.params]
        results = [t.name for t in d.outputs[:len(outs)]]

        def run(env: dict[str, np.ndarray]) -> None:
            produced = spec.run({p: env[n] for p, n in zip(params, names)})
            for name, r in zip(outs, results):
                env[name] = produced[r]
        self.steps.append(_Step(node, run))


@dataclass(frozen=True)
class MemoryPlan:
    """Activations placed in one arena by liveness (as Glow does): ``offsets`` of each
    intermediate value, the arena's size, and the naive sum of all activations."""

    offsets: dict[str, int]
    arena_bytes: int
    naive_bytes: int


def plan_memory(steps: list[_Step], types: dict[str, TensorType], outputs: set[str],
                alignment: int = 64) -> MemoryPlan:
    """First-fit placement of every value a step defines, freed after its last reader."""
    produced = [o for st in steps for o in st.node.outputs if o in types]
    size = {v: -(-max(1, types[v].dtype.bits // 8 * _count(types[v])) // alignment) * alignment
            for v in produced}
    last = {v: len(steps) if v in outputs else k for k, st in enumerate(steps)
            for v in st.node.outputs if v in size}
    for k, st in enumerate(steps):
        for i in st.node.inputs:
            if i in last:
                last[i] = max(last[i], k)
    live: list[tuple[int, int, str]] = []   # (offset, size, value)
    offsets: dict[str, int] = {}
    arena = 0
    for k, st in enumerate(steps):
        live = [blk for blk in live if last[blk[2]] >= k]
        for v in st.node.outputs:
            if v not in size:
                continue
            offset = 0
            for start, length, _ in sorted(live):
                if offset + size[v] <= start:
                    break
                offset = max(offset, start + length)
            offsets[v] = offset
            live.append((offset, size[v], v))
            arena = max(arena, offset + size[v])
    return MemoryPlan(offsets, arena, sum(size.values()))


def _count(t: TensorType) -> int:
    n = 1
    for d in t.shape:
        n *= int(d)
    return n


def _view(src: str, dst: str, shape: tuple[int, ...]) -> Any:
    def run(env: dict[str, np.ndarray]) -> None:
        env[dst] = env[src].reshape(shape)
    return run


def _type(array: np.ndarray) -> TensorType:
    dt = DType.from_numpy(array.dtype)
    if dt is None:
        raise DTypeError(f"a folded value has dtype {array.dtype}, which polyfuse does not support")
    return TensorType(dt, tuple(int(d) for d in array.shape))


class CompiledModel:
    """A graph compiled for a target; ``run({name: array}) -> {name: array}``."""

    def __init__(self, graph: Graph, target: Target, options: MappingOptions | None = None,
                 input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> None:
        self.graph = graph
        self.target = target
        self.options = options
        self._plans: dict[tuple, _Plan] = {}
        self._value_inputs: set[str] = set()  # small inputs whose values plans depend on
        self.input_shapes = dict(input_shapes or {})
        if self.input_shapes:
            self._plan({v.name: tuple(self.input_shapes.get(v.name, v.type.shape)) for v in graph.inputs})

    @property
    def inputs(self) -> tuple[Value, ...]:
        return self.graph.inputs

    @property
    def outputs(self) -> tuple[Value, ...]:
        return self.graph.outputs

    def _plan(self, shapes: dict[str, tuple], values: dict[str, np.ndarray] | None = None) -> _Plan:
        unbound = {f"{n}[{k}]={d}" for n, s in shapes.items() for k, d in enumerate(s)
                   if not isinstance(d, int)}
        if unbound:
            raise ShapeError(f"input dimensions {sorted(unbound)} are symbolic; call the model "
                             "with arrays, or pass input_shapes={name: shape} to compile()")
        values = values or {}
        key = (tuple(sorted(shapes.items())),
               tuple((n, v.tobytes()) for n, v in sorted(values.items())))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _Plan(self, shapes, values)
        return plan

    def memory_plan(self, **shapes: tuple[int, ...]) -> MemoryPlan:
        """The activation arena for these input shapes (all inputs must be given)."""
        missing = [v.name for v in self.graph.inputs if v.name not in shapes]
        if missing:
            raise ArgumentError(f"memory_plan needs the shape of every input; missing {missing}, "
                                f"e.g. memory_plan({missing[0]}=(1, 3, 224, 224))")
        return self._plan({v.name: tuple(shapes[v.name]) for v in self.graph.inputs}).memory

    def run(self, feed: Mapping[str, Any]) -> dict[str, np.ndarray]:
        expected = {v.name: v for v in self.graph.inputs}
        unknown = sorted(set(feed) - set(expected))
        missing = sorted(set(expected) - set(feed))
        if unknown or missing:
            raise ArgumentError(f"model inputs are {sorted(expected)}; "
                                + (f"unknown: {unknown} " if unknown else "")
                                + (f"missing: {missing}" if missing else ""))
        env: dict[str, np.ndarray] = {}
        for name, v in expected.items():
            a = feed[name]
            if not isinstance(a, (np.ndarray, np.generic)):
                raise ArgumentError(f"input '{name}' must be a numpy array, got {type(a).__name__}")
            a = np.asarray(a)
            if a.dtype != v.type.dtype.numpy:
                raise DTypeError(f"input '{name}' must be {v.type.dtype}, got {a.dtype}")
            if a.ndim != v.type.rank or any(isinstance(d, int) and d != e
                                            for d, e in zip(v.type.shape, a.shape)):
                raise ShapeError(f"input '{name}' must have shape {v.type.shape}, got {a.shape}")
            env[name] = np.asarray(a, order="C")  # keeps 0-d arrays 0-d
        shapes = {n: tuple(int(d) for d in env[n].shape) for n in expected}
        while True:
            values = {n: a for n, a in env.items() if a.size <= VALUE_INPUT_MAX
                      and (a.dtype.kind in "iu" or n in self._value_inputs)}
            try:
                plan = self._plan(shapes, values)
                break
            except NeedsValue as need:  # e.g. Resize scales fed at run time
                name = need.value_name
                if name not in env or name in values or env[name].size > VALUE_INPUT_MAX:
                    raise
                self._value_inputs.add(name)
        env.update(plan.consts)
        for step in plan.steps:
            step.run(env)
        return {v.name: env[v.name] for v in self.graph.outputs}

    def __call__(self, *arrays: Any) -> tuple[np.ndarray, ...] | np.ndarray:
        if len(arrays) != len(self.graph.inputs):
            raise ArgumentError(f"the model takes {len(self.graph.inputs)} inputs "
                                f"({', '.join(v.name for v in self.graph.inputs)}), got {len(arrays)}")
        out = self.run(dict(zip((v.name for v in self.graph.inputs), arrays)))
        values = tuple(out.values())
        return values[0] if len(values) == 1 else values
