"""Control flow the program cannot run, continued from Python when the model runs;
outputs whose sizes the data decides, cut to size.

Most control flow the data decides runs in the program itself: an If whose condition,
or a Loop whose trip count or condition, is computed from data is a
:class:`~polyfuse.ir.plan.BranchStep` or :class:`~polyfuse.ir.plan.LoopStep` of the plan
(:mod:`polyfuse.lowering.program_control`), its body planned once, run natively with
no Python between iterations. What the planner can resolve it inlines
(:mod:`polyfuse.lowering.inline_control`). The rest ends the plan
(:class:`~polyfuse.ir.plan.ControlStep`) and is run here: a Loop whose body changes the
shapes of its carried values, an If whose branches give different shapes, a Loop with
scan outputs and a trip count the data decides (their length is known only once it has
run), a Scan past the unrolling limits, a body that itself ends its plan. Each branch
or body is compiled as a :class:`~polyfuse.runtime.model.CompiledModel` of its own
(planned and compiled per set of shapes it is given, cached), and this module decides
which branch runs and how often the body runs, and carries the loop-carried values
between iterations: each iteration costs a call of a compiled program from Python, tens
of microseconds (the program's own loops cost what their kernels and copies do). The
rest of the graph then runs as a model of its own too, planned for the shapes the node
produced: so a Loop's scan outputs have exactly the length the data decides. The same
holds after a LoopStep whose scan outputs were written into buffers of the trip count's
rows and may have stopped early: they are cut here to the iterations it ran.

The feeds made here are trusted (``run_trusted``: not checked again).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import numpy as np

from polyfuse.errors import ModelError, ShapeError
from polyfuse.ir.control import (ControlParts, condition, control_parts, loop_inputs, loop_value, scan_attr,
                                 trip_count)
from polyfuse.ir.graph import Constant, Graph, Node, TensorType, Value
from polyfuse.ir.plan import ControlStep, Trim
from polyfuse.ir.types import DType

Arrays = dict[str, np.ndarray]


class Runnable(Protocol):
    """A compiled model (:class:`~polyfuse.runtime.model.CompiledModel`)."""

    def run_trusted(self, feed: Arrays) -> Arrays: ...


# the compiled model of a graph (a subgraph, or the rest of a graph) for arrays of the
# element types and ranks given; cached per owner (the subgraph, or the ControlStep),
# which ``make`` builds the graph of
Submodel = Callable[[object, Callable[[], Graph], Arrays], Runnable]


def run_tail(tail: ControlStep, env: Arrays, graph: Graph, submodel: Submodel) -> Arrays:
    """``graph``'s outputs, from ``env`` (the values ``tail`` reads, but for its
    constants): the control-flow node run, then the nodes after it."""
    outputs = graph.outputs
    env = env | dict(tail.constants)
    node = tail.node
    rest = tail.rest
    if tail.waits:   # planned with the rest, now that the value it needs is known
        rest = (node, *rest)
    elif tail.trims:   # the plan ran the node's kernel: its outputs cut to the counts it wrote
        env.update({t.output: _trimmed(env, t) for t in tail.trims})
    else:
        env.update({name: value for name, value in zip(node.outputs, run_control(node, env, submodel))
                    if name})
    if not rest:
        return {v.name: env[v.name] for v in outputs}
    defined = {o for n in rest for o in n.outputs}
    needed = dict.fromkeys(i for n in rest for i in n.inputs
                           if i and i not in defined) | dict.fromkeys(v.name for v in outputs
                                                                      if v.name not in defined)
    feed = {n: np.asarray(env[n], order="C") for n in needed if n not in tail.constants}
    constants = tuple(Constant(n, np.asarray(tail.constants[n])) for n in needed if n in tail.constants)

    def make() -> Graph:
        return Graph(f"{graph.name}/{node.name}", (), outputs, rest, constants, graph.opset)
    return submodel(tail, make, feed).run_trusted(feed)


def _trimmed(env: Arrays, trim: Trim) -> np.ndarray:
    """The first entries (as many as its count says) of an output written at its bound size."""
    bound = env[trim.bound]
    if not trim.count:
        return bound
    count = trip_count(env[trim.count])
    return np.ascontiguousarray(bound[(slice(None),) * trim.axis + (slice(0, count),)])


def run_control(node: Node, env: Arrays, submodel: Submodel) -> list[np.ndarray]:
    """What If, Loop or Scan ``node`` gives for the values in ``env``."""
    parts = control_parts(node)
    captured = dict(zip(node.subgraphs[0].captures, (env[c] for c in parts.captures)))
    if node.op == "If":
        branch = node.attr("then_branch" if condition(node, env[parts.own[0]]) else "else_branch")
        return _run_body(branch, {}, captured, submodel)
    if node.op == "Loop":
        return _loop(node, parts, env, captured, submodel)
    return _scan(node, parts, env, captured, submodel)


def _run_body(body: Graph, bound: Arrays, captured: Arrays, submodel: Submodel) -> list[np.ndarray]:
    """``body`` run on its inputs ``bound`` (by body input name) and its captures."""
    feed = {n: np.asarray(a, order="C") for n, a in (bound | captured).items()}
    outs = submodel(body, lambda: body, feed).run_trusted(feed)
    return [outs[v.name] for v in body.outputs]


def _loop(node: Node, parts: ControlParts, env: Arrays, captured: Arrays,
          submodel: Submodel) -> list[np.ndarray]:
    body: Graph = node.attr("body")
    trip, cond = parts.own[0], parts.own[1]
    limit = trip_count(env[trip]) if trip else None
    going = condition(node, env[cond]) if cond else True
    carried = [np.asarray(env[v]) for v in parts.own[2:]]
    scans: list[list[np.ndarray]] = [[] for _ in range(parts.scan_outputs)]
    names = [v.name for v in body.inputs]
    counter, flag = loop_inputs(node, body)
    k = 0
    while going and (limit is None or k < limit):
        bound = dict(zip(names, [loop_value(counter, k), loop_value(flag, True), *carried]))
        values = _run_body(body, bound, captured, submodel)
        going = condition(node, values[0])
        carried = values[1:1 + parts.carried]
        for scan, value in zip(scans, values[1 + parts.carried:]):
            scan.append(value)
        k += 1
    stacked = [_stacked(node, body.outputs[1 + parts.carried + j], values, 0)
               for j, values in enumerate(scans)]
    return carried + stacked


def _scan(node: Node, parts: ControlParts, env: Arrays, captured: Arrays,
          submodel: Submodel) -> list[np.ndarray]:
    body: Graph = node.attr("body")
    scanned = [np.asarray(env[x]) for x in parts.own[parts.carried:]]
    axes = [a % x.ndim if -x.ndim <= a < x.ndim else _bad_axis(node, a, x.ndim)
            for a, x in zip(scan_attr(node, "scan_input_axes", parts.scanned), scanned)]
    reverse = scan_attr(node, "scan_input_directions", parts.scanned)
    lengths = {x.shape[a] for x, a in zip(scanned, axes)}
    if len(lengths) != 1:
        raise ModelError(f"node '{node.name}' (Scan): its scan inputs have lengths "
                         f"{sorted(lengths)} along their scan axes; they must agree")
    length = lengths.pop()
    states = [np.asarray(env[v]) for v in parts.own[:parts.carried]]
    scans: list[list[np.ndarray]] = [[] for _ in range(parts.scan_outputs)]
    names = [v.name for v in body.inputs]
    for k in range(length):
        slices = [np.asarray(np.take(x, length - 1 - k if back else k, axis=a))
                  for x, a, back in zip(scanned, axes, reverse)]
        values = _run_body(body, dict(zip(names, states + slices)), captured, submodel)
        states = values[:parts.carried]
        for scan, value in zip(scans, values[parts.carried:]):
            scan.append(value)
    out_axes = scan_attr(node, "scan_output_axes", parts.scan_outputs)
    out_reverse = scan_attr(node, "scan_output_directions", parts.scan_outputs)
    return states + [_stacked(node, body.outputs[parts.carried + j], values[::-1] if back else values, a)
                     for j, (values, a, back) in enumerate(zip(scans, out_axes, out_reverse))]


def _bad_axis(node: Node, axis: int, rank: int) -> int:
    raise ModelError(f"node '{node.name}' (Scan): scan axis {axis} for a tensor of rank {rank}")


def _stacked(node: Node, declared: Value, values: list[np.ndarray], axis: int) -> np.ndarray:
    """One scan output: the iterations' values stacked along a new ``axis``."""
    if not values:   # no iteration: the element shape is what the body declares
        if not declared.type.is_static:
            raise ShapeError(f"node '{node.name}' ({node.op}) ran no iteration and its body does not "
                             f"declare the shape of scan output '{declared.name}'; its shape is unknown")
        return np.zeros((0, *declared.type.shape), declared.type.dtype.numpy)
    shapes = {v.shape for v in values}
    if len(shapes) > 1:
        raise ShapeError(f"node '{node.name}' ({node.op}): scan output '{declared.name}' has shapes "
                         f"{sorted(shapes)} in different iterations; they must agree")
    return np.stack(values, axis=axis)


def retyped(graph: Graph, feed: Arrays) -> Graph:
    """``graph`` (a subgraph, or the rest of one) taking ``feed``'s values as its inputs,
    typed by their element types and ranks (each dimension a size bound by the call)."""
    def value(name: str) -> Value:
        a = feed[name]
        dtype = DType.from_numpy(a.dtype)
        if dtype is None:
            raise ModelError(f"graph '{graph.name}': value '{name}' has element type {a.dtype}, "
                             "which polyfuse does not support")
        return Value(name, TensorType(dtype, tuple(f"{name}#{k}" for k in range(a.ndim))))
    return replace(graph, inputs=tuple(value(n) for n in feed), captures=())
