"""Control-flow nodes of the graph IR (If, Loop, Scan): their parts and their checks.

A control-flow node's subgraphs (``Node.subgraphs``) are graphs of their own. Each lists
the enclosing values it reads as ``captures``; the node reads them after its own ONNX
inputs, so ``node.inputs`` is ``own inputs + captures``. The planner (static branches and
trip counts, unrolled) and the runtime (data-dependent ones, run per iteration) read the
parts through :func:`control_parts`, checked once here, and take a Loop's iteration
number, condition and trip count through :func:`loop_inputs`, :func:`condition` and
:func:`trip_count`: ONNX's semantics in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from polyfuse.errors import ModelError, UnsupportedOpError
from polyfuse.ir.graph import SUBGRAPH_ATTRS, Graph, Node, TensorType
from polyfuse.ir.types import DType


@dataclass(frozen=True)
class ControlParts:
    """A control-flow node's inputs split by role (names; "" for an omitted one)."""

    own: tuple[str, ...]        # the node's ONNX inputs
    captures: tuple[str, ...]   # what feeds its subgraphs' captures, in their order
    carried: int                # Loop and Scan: loop-carried values (a Scan's states)
    scanned: int                # Scan: scan inputs
    scan_outputs: int           # Loop and Scan


def control_parts(node: Node) -> ControlParts:
    """The parts of If, Loop or Scan ``node``; a ModelError names a node whose subgraphs
    do not fit its inputs and outputs (as onnxruntime refuses to load it)."""
    def bad(why: str) -> ModelError:
        return ModelError(f"node '{node.name}' ({node.op}): {why}")

    bodies = []
    for key in SUBGRAPH_ATTRS[node.op]:
        body = node.attr(key)
        if not isinstance(body, Graph):
            raise bad(f"its attribute {key} (a graph) is missing")
        bodies.append(body)
    split = len(node.inputs) - len(bodies[0].captures)
    own, captures = node.inputs[:split], node.inputs[split:]
    body = bodies[0]
    if node.op == "If":
        for key, branch in zip(SUBGRAPH_ATTRS["If"], bodies):
            if len(branch.outputs) != len(node.outputs):
                raise bad(f"its {key} gives {len(branch.outputs)} outputs, the node has "
                          f"{len(node.outputs)}")
            if branch.inputs:
                raise bad(f"its {key} takes inputs ({len(branch.inputs)}); branches take none")
        if len(own) != 1 or not own[0]:
            raise bad("it needs one input, the condition")
        return ControlParts(own, captures, 0, 0, 0)
    if node.op == "Loop":
        carried = len(own) - 2
        if carried < 0:
            raise bad("it needs inputs M and cond (either may be empty) before the loop-carried values")
        if len(body.inputs) != carried + 2:
            raise bad(f"its body takes {len(body.inputs)} inputs; with {carried} loop-carried "
                      f"values it must take {carried + 2} (iteration number, condition, values)")
        scan_outputs = len(body.outputs) - 1 - carried
        if scan_outputs < 0 or len(node.outputs) != carried + scan_outputs:
            raise bad(f"its body gives {len(body.outputs)} outputs; with {carried} loop-carried "
                      f"values and {len(node.outputs)} node outputs it must give "
                      f"{1 + len(node.outputs)} (condition, values, scan outputs)")
        loop_inputs(node, body)
        return ControlParts(own, captures, carried, 0, scan_outputs)
    scanned = node.attr("num_scan_inputs")
    if not isinstance(scanned, int) or not 1 <= scanned <= len(own):
        raise bad(f"its num_scan_inputs ({scanned!r}) must be between 1 and its {len(own)} inputs")
    carried = len(own) - scanned
    if len(body.inputs) != len(own):
        raise bad(f"its body takes {len(body.inputs)} inputs; the node gives {len(own)}")
    scan_outputs = len(body.outputs) - carried
    if scan_outputs < 0 or len(node.outputs) != len(body.outputs):
        raise bad(f"its body gives {len(body.outputs)} outputs; the node has {len(node.outputs)} "
                  f"and {carried} states")
    for key, count in (("scan_input_axes", scanned), ("scan_input_directions", scanned),
                       ("scan_output_axes", scan_outputs), ("scan_output_directions", scan_outputs)):
        given = node.attr(key)
        if given is not None and len(given) != count:
            raise bad(f"its {key} has {len(given)} entries for {count} scan "
                      f"{'inputs' if 'input' in key else 'outputs'}")
        if given is not None and "directions" in key and any(d not in (0, 1) for d in given):
            raise bad(f"its {key} {list(given)} must be 0 (forward) or 1 (reverse)")
    return ControlParts(own, captures, carried, scanned, scan_outputs)


def loop_inputs(node: Node, body: Graph) -> tuple[TensorType, TensorType]:
    """The types of a Loop body's first two inputs, the iteration number (int64) and the
    condition (bool), as the body declares them: each a scalar, or a tensor of shape [1]
    (as many exporters write them; onnxruntime then binds them with that shape, and a
    Shape of the counter is [1]). A ModelError names any other type."""
    out = []
    for v, dt, role in zip(body.inputs[:2], (DType.INT64, DType.BOOL), ("iteration number", "condition")):
        shape = v.type.shape
        if v.type.dtype is not dt or len(shape) > 1 or shape and isinstance(shape[0], int) and shape[0] != 1:
            raise ModelError(f"node '{node.name}' (Loop): its body's {role} '{v.name}' is declared "
                             f"{v.type}; it must be a {dt} scalar or a {dt} tensor of shape [1]")
        out.append(TensorType(dt, (1,) * len(shape)))
    return out[0], out[1]


def condition(node: Node, value: object) -> bool:
    """An If's or a Loop's condition ``value`` as a bool; a ModelError names a condition
    of other than one element (onnxruntime refuses it too)."""
    cond = np.asarray(value)
    if cond.size != 1:
        raise ModelError(f"node '{node.name}' ({node.op}): its condition has {cond.size} "
                         "elements; it must have one")
    return bool(cond.reshape(-1)[0])


def trip_count(value: object) -> int:
    """A Loop's trip count ``value`` (a scalar or one element) as an int."""
    return int(np.asarray(value).reshape(-1)[0])


def loop_value(t: TensorType, value: int | bool) -> np.ndarray:
    """``value`` as a Loop body's iteration number or condition of type ``t``."""
    return np.full(tuple(int(d) for d in t.shape), value, t.dtype.numpy)


def batched_scan(node: Node) -> Node:
    """An opset-8 Scan (input 0 ``sequence_lens``, then states and scan inputs with a
    batch axis 0 before the sequence axis) as the opset-9 Scan meaning the same: an outer
    Scan over the batch (every state and scan input a scan input, every output a scan
    output) whose body is a Scan of the original body over one batch element."""
    body: Graph = node.attr("body")
    split = len(node.inputs) - len(body.captures)
    own, captures = node.inputs[:split], node.inputs[split:]
    if own and own[0]:
        raise UnsupportedOpError(f"node '{node.name}' (Scan): opset 8's sequence_lens (sequences of "
                                 "different lengths in a batch) is not supported; leave it empty")
    scanned = node.attr("num_scan_inputs")
    if not isinstance(scanned, int) or len(body.inputs) != len(own) - 1:
        raise ModelError(f"node '{node.name}' (Scan): its body takes {len(body.inputs)} inputs; "
                         f"the node gives {len(own) - 1} states and scan inputs")
    element = [replace(v, name=f"{node.name}/element{k}") for k, v in enumerate(body.inputs)]
    results = [replace(v, name=f"{node.name}/result{k}") for k, v in enumerate(body.outputs)]
    inner = Node("Scan", f"{node.name}/sequence",
                 tuple(v.name for v in element) + captures, tuple(v.name for v in results),
                 (("body", body), ("num_scan_inputs", scanned),
                  ("scan_input_directions", tuple(node.attr("directions", (0,) * scanned)))))
    per_element = Graph(f"{body.name}/element", tuple(element), tuple(results), (inner,),
                        opset=body.opset, captures=body.captures)
    return Node("Scan", node.name, own[1:] + captures, node.outputs,
                (("body", per_element), ("num_scan_inputs", len(element))))


def scan_attr(node: Node, key: str, count: int) -> tuple[int, ...]:
    """A Scan's axes or directions per scan input or output (zeros by default)."""
    return tuple(int(v) for v in node.attr(key, (0,) * count))
