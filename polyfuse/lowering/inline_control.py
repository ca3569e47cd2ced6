"""Control flow resolved when planning: If, Loop and Scan inlined into the graph.

When the planner knows what a control-flow node does for the shapes (and small input
values) of a call, the node becomes plain graph nodes, as onnxruntime's and TVM's graph
optimizers resolve it: an If whose condition is known (a constant, a value folded from
shapes, a small input the plan is specialized to) becomes its taken branch; a Scan, and a
Loop whose trip count is known and whose condition stays known (constant, or passed
through unchanged), are unrolled (the body inlined once per iteration, loop-carried
values threaded through, scan outputs stacked by Unsqueeze and Concat, a Scan's axes and
directions honoured). The inlined nodes then fuse and fold like any others.

What is not known, would unroll past :data:`UNROLL_MAX_TRIPS` iterations or
:data:`UNROLL_MAX_NODES` nodes, or is a loop with control flow in its body, stays a node:
the program runs it, its body planned once (:mod:`polyfuse.lowering.program_control`),
or, where the program cannot, the planner ends its plan there and the runtime runs it
from Python, iteration by iteration (:mod:`polyfuse.runtime.interpreted_control`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from polyfuse.errors import ModelError
from polyfuse.ir.control import (ControlParts, condition, control_parts, loop_inputs, loop_value, scan_attr,
                                 trip_count)
from polyfuse.ir.graph import Graph, Node, TensorType

UNROLL_MAX_TRIPS = 256
UNROLL_MAX_NODES = 4096


@dataclass
class Inlined:
    """Nodes replacing a control-flow node, and the constants they introduce."""

    nodes: list[Node]
    constants: dict[str, np.ndarray]


def resolve_control_flow(node: Node, types: Mapping[str, TensorType],
                         consts: Mapping[str, np.ndarray], opset: int) -> Inlined | None:
    """``node`` as plain nodes, or None when what it does depends on data (or it would
    unroll too far)."""
    parts = control_parts(node)
    out = Inlined([], {})
    if node.op == "If":
        cond = consts.get(parts.own[0])
        if cond is None:
            return None
        branch = node.attr("then_branch" if condition(node, cond) else "else_branch")
        _bind(node, out, inline_body(node, branch, parts, {}, f"{node.name}/", out), node.outputs)
        return out
    if node.op == "Loop":
        return _unroll_loop(node, parts, consts, opset, out)
    return _unroll_scan(node, parts, types, opset, out)


def live_nodes(nodes: list[Node], wanted: set[str]) -> list[Node]:
    """The nodes ``wanted`` values are computed through (inlined bodies compute values
    nothing reads: a Loop's condition, a dropped output)."""
    live = set(wanted)
    kept = []
    for n in reversed(nodes):
        if any(o in live for o in n.outputs if o):
            kept.append(n)
            live.update(i for i in n.inputs if i)
    return kept[::-1]


def inline_body(node: Node, body: Graph, parts: ControlParts, bound: dict[str, str], prefix: str,
            out: Inlined) -> list[str]:
    """``body``'s nodes renamed under ``prefix`` with its inputs ``bound`` (body name ->
    value) and its captures read from the node's inputs, added to ``out``; the values
    of its outputs."""
    rename = dict(bound) | dict(zip(body.captures, parts.captures))
    for c in body.constants:
        rename[c.name] = prefix + c.name
        out.constants[prefix + c.name] = c.array
    for n in body.nodes:
        rename.update({o: prefix + o for o in n.outputs if o})
        # unnamed body nodes are named after the node already (``Loop_0/Add_3``)
        name = prefix + n.name.removeprefix(f"{node.name}/")
        out.nodes.append(replace(n, name=name, group="",
                                 inputs=tuple(rename[i] if i else "" for i in n.inputs),
                                 outputs=tuple(rename[o] if o else "" for o in n.outputs)))
    return [rename[v.name] for v in body.outputs]


def _bind(node: Node, out: Inlined, values: list[str], names: tuple[str, ...]) -> None:
    """The node's outputs ``names`` defined as the inlined ``values`` (omitted ones skipped)."""
    for k, (src, name) in enumerate(zip(values, names)):
        if name:
            out.nodes.append(Node("Identity", f"{node.name}:out{k}", (src,), (name,)))


def _constant(out: Inlined, name: str, value: np.ndarray) -> str:
    out.constants[name] = value
    return name


def _unroll_loop(node: Node, parts: ControlParts, consts: Mapping[str, np.ndarray], opset: int,
                 out: Inlined) -> Inlined | None:
    """A Loop whose trip count and condition are known, unrolled; None otherwise."""
    body: Graph = node.attr("body")
    trip, cond = parts.own[0], parts.own[1]
    limit = None if not trip else consts.get(trip)
    if trip and limit is None:
        return None
    going = True if not cond else consts.get(cond)
    if going is None:
        return None
    going = going is True or condition(node, going)
    stays = passed_condition(body, dict(zip(body.captures, parts.captures)), consts)
    if stays is None:
        return None
    trips = _loop_trips(node, None if limit is None else trip_count(limit), going, stays)
    if not _unrollable(body, trips):
        return None
    if trips == 0 and parts.scan_outputs:
        return None   # the scan outputs' shapes need the body planned: the runtime's
    carried = list(parts.own[2:])
    scans: list[list[str]] = [[] for _ in range(parts.scan_outputs)]
    counter_type, flag_type = loop_inputs(node, body)
    for k in range(trips):
        prefix = f"{node.name}/{k}/"
        # names no inlined body value has: those are all "{prefix}{name}"
        counter = _constant(out, f"{node.name}/{k}:iteration", loop_value(counter_type, k))
        flag = _constant(out, f"{node.name}/{k}:condition", loop_value(flag_type, True))
        names = [v.name for v in body.inputs]
        bound = dict(zip(names, [counter, flag, *carried]))
        values = inline_body(node, body, parts, bound, prefix, out)
        carried = values[1:1 + parts.carried]
        for scan, value in zip(scans, values[1 + parts.carried:]):
            scan.append(value)
    stacked = [_stack(node, out, f"{node.name}:scan{j}", parts_, 0, opset)
               for j, parts_ in enumerate(scans)]
    _bind(node, out, carried + stacked, node.outputs)
    return out


def _unrollable(body: Graph, trips: int) -> bool:
    """Whether to unroll ``trips`` iterations of ``body``: within the limits, and with no
    control flow inside (which, if it depends on data, would end the plan in the first
    iteration and leave every later one a plan of its own; run per iteration, the body
    is compiled once)."""
    return trips <= UNROLL_MAX_TRIPS and trips * max(1, len(body.nodes)) <= UNROLL_MAX_NODES \
        and not any(n.subgraphs for n in body.nodes)


def passed_condition(body: Graph, captured: dict[str, str],
                      consts: Mapping[str, np.ndarray]) -> bool | str | None:
    """How a Loop body's condition output is known: "passed" when it is the condition
    input (through Identity nodes), its value when a constant (of the body, or captured),
    None when computed."""
    producer = {o: n for n in body.nodes for o in n.outputs}
    name = body.outputs[0].name
    while name in producer and producer[name].op == "Identity":
        name = producer[name].inputs[0]
    if name == body.inputs[1].name:
        return "passed"
    constant = body.constant(name)
    value = constant.array if constant is not None else consts.get(captured.get(name, ""))
    if value is None or value.size != 1:
        return None
    return bool(value.reshape(-1)[0])


def _loop_trips(node: Node, limit: int | None, going: bool, stays: bool | str) -> int:
    if not going:
        return 0
    again = stays == "passed" or stays is True
    if limit is None and again:
        raise ModelError(f"node '{node.name}' (Loop): it has no trip count and its condition "
                         "stays true: it never ends")
    if limit is None:
        return 1
    return max(0, limit) if again else min(max(0, limit), 1)


def _unroll_scan(node: Node, parts: ControlParts, types: Mapping[str, TensorType], opset: int,
                 out: Inlined) -> Inlined | None:
    """A Scan unrolled over its scan inputs' (known) length; None past the limits."""
    body: Graph = node.attr("body")
    scanned = parts.own[parts.carried:]
    axes = scan_attr(node, "scan_input_axes", parts.scanned)
    reverse = scan_attr(node, "scan_input_directions", parts.scanned)
    ranks = [types[x].rank for x in scanned]
    axes = tuple(_axis(node, a, r, "scan_input_axes") for a, r in zip(axes, ranks))
    lengths = {int(types[x].shape[a]) for x, a in zip(scanned, axes)}
    if len(lengths) != 1:
        raise ModelError(f"node '{node.name}' (Scan): its scan inputs have lengths "
                         f"{sorted(lengths)} along their scan axes; they must agree")
    length = lengths.pop()
    if length == 0 or not _unrollable(body, length):
        return None
    states = list(parts.own[:parts.carried])
    scans: list[list[str]] = [[] for _ in range(parts.scan_outputs)]
    names = [v.name for v in body.inputs]
    for k in range(length):
        prefix = f"{node.name}/{k}/"
        slices = []
        for j, (x, a, back) in enumerate(zip(scanned, axes, reverse)):
            at = length - 1 - k if back else k
            index = _constant(out, f"{node.name}/{k}:index{j}", np.array(at, np.int64))
            slices.append(f"{node.name}/{k}:slice{j}")
            out.nodes.append(Node("Gather", slices[-1], (x, index), (slices[-1],), (("axis", a),)))
        values = inline_body(node, body, parts, dict(zip(names, states + slices)), prefix, out)
        states = values[:parts.carried]
        for scan, value in zip(scans, values[parts.carried:]):
            scan.append(value)
    out_axes = scan_attr(node, "scan_output_axes", parts.scan_outputs)
    out_reverse = scan_attr(node, "scan_output_directions", parts.scan_outputs)
    stacked = []
    for j, (values, axis, back) in enumerate(zip(scans, out_axes, out_reverse)):
        # a negative axis counts from the end of the stacked rank: Unsqueeze's and Concat's too
        stacked.append(_stack(node, out, f"{node.name}:scan{j}", values[::-1] if back else values,
                              axis, opset))
    _bind(node, out, states + stacked, node.outputs)
    return out


def _axis(node: Node, axis: int, rank: int, key: str) -> int:
    if not -rank <= axis < rank:
        raise ModelError(f"node '{node.name}' (Scan): {key} has axis {axis} for a tensor of rank {rank}")
    return axis % rank


def _stack(node: Node, out: Inlined, name: str, values: list[str], axis: int, opset: int) -> str:
    """``values`` (one per iteration) stacked along a new ``axis``, by Unsqueeze and Concat."""
    pieces = []
    for k, v in enumerate(values):
        piece = f"{name}/{k}"
        if opset >= 13:
            axes = _constant(out, f"{piece}/axes", np.array([axis], np.int64))
            out.nodes.append(Node("Unsqueeze", piece, (v, axes), (piece,)))
        else:
            out.nodes.append(Node("Unsqueeze", piece, (v,), (piece,), (("axes", (axis,)),)))
        pieces.append(piece)
    out.nodes.append(Node("Concat", name, tuple(pieces), (name,), (("axis", axis),)))
    return name
