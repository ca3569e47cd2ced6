"""Control flow the data decides, planned for the program to run: an If whose condition,
or a Loop whose trip count or condition, is computed from data becomes a
:class:`~polyfuse.ir.plan.BranchStep` or :class:`~polyfuse.ir.plan.LoopStep` in the
plan's steps, its branches or body planned once, in the enclosing plan, by the same
planner (their nodes fuse as any others), for the shapes they get.

The program can run it when what the steps write keeps one type: a Loop's body gives
its carried values the types they came in with (so one plan of the body serves every
iteration), an If's branches give outputs of one type. A Loop's scan outputs need a
known trip count M: they are written into buffers of M rows (up to
:data:`STACKED_MAX_BYTES` in all); when the loop may stop before M iterations (its
condition computed), the plan ends there and the runtime cuts them to the iterations
run (a :class:`~polyfuse.ir.plan.Trim` by the loop's counter). What does not fit
(carried shapes that change, scan outputs of a loop whose trip count the data decides or
is too large to hold them all, a body that itself ends its plan) is left to the runtime,
which runs it from Python (:mod:`polyfuse.runtime.interpreted_control`).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from polyfuse.ir.control import ControlParts, control_parts, loop_inputs, trip_count
from polyfuse.ir.graph import Graph, Node, TensorType
from polyfuse.ir.plan import BranchStep, LoopStep, Step, Trim, nbytes
from polyfuse.ir.steps import Block, view_roots
from polyfuse.ir.types import DType
from polyfuse.lowering.inline_control import Inlined, inline_body, passed_condition

# the most bytes of scan-output buffers a loop's M rows may take (exported while loops
# give M = 2**63 - 1 and stop on their condition: their scans are stacked from Python)
STACKED_MAX_BYTES = 1 << 26


class PlanBuilder(Protocol):
    """What of :class:`polyfuse.lowering.plan._Planner` planning control flow uses."""

    steps: list[Step]
    types: dict[str, TensorType]
    consts: dict[str, np.ndarray]
    narrow: dict[str, DType]

    def block(self, nodes: list[Node], results: list[str]) -> Block | None: ...
    def grouped(self, name: str, nodes: list[Node], wanted: set[str]) -> list[Node]: ...
    def record(self, constants: dict[str, np.ndarray]) -> None: ...
    def define(self, what: str, name: str, t: TensorType) -> None: ...
    def snapshot(self) -> tuple[dict, dict, dict]: ...
    def restore(self, saved: tuple[dict, dict, dict]) -> None: ...


def program_control(planner: PlanBuilder, node: Node) -> tuple[Trim, ...] | None:
    """Plan If or Loop ``node`` as a step of the program: the trims of outputs to cut
    after it (the plan then ends), or None (nothing planned) when the program cannot
    run it."""
    if node.op not in ("If", "Loop"):
        return None   # a Scan's length is a shape: it is unrolled, or run from Python
    saved = planner.snapshot()
    trims = (_branch if node.op == "If" else _loop)(planner, node, control_parts(node))
    if trims is None:
        planner.restore(saved)
    return trims


def _scalar(planner: PlanBuilder, name: str, dtype: DType) -> bool:
    t = planner.types.get(name)
    return t is not None and t.dtype is dtype and all(int(d) == 1 for d in t.shape)


def _narrow(planner: PlanBuilder, values: tuple[str, ...]) -> bool:
    """Whether any of ``values`` holds a narrow type (float8, int4, ...) in its storage
    type: the values a loop or branch copies keep only their storage types."""
    return any(v in planner.narrow for v in values)


def _subgraph(planner: PlanBuilder, node: Node, parts: ControlParts, body: Graph, bound: dict[str, str],
              prefix: str) -> Block | None:
    """``body`` inlined under ``prefix`` (its inputs ``bound``) and planned as a block."""
    out = Inlined([], {})
    results = inline_body(node, body, parts, bound, prefix, out)
    planner.record(out.constants)
    return planner.block(planner.grouped(node.name, out.nodes, set(results)), results)


def _branch(planner: PlanBuilder, node: Node, parts: ControlParts) -> tuple[Trim, ...] | None:
    cond = parts.own[0]
    if not _scalar(planner, cond, DType.BOOL):
        return None
    blocks = []
    for key, tag in (("then_branch", "then"), ("else_branch", "else")):
        block = _subgraph(planner, node, parts, node.attr(key), {}, f"{node.name}/{tag}/")
        if block is None:
            return None
        blocks.append(block)
    then, other = blocks
    types = [planner.types[r] for r in then.results]
    if types != [planner.types[r] for r in other.results] or _narrow(planner, then.results + other.results):
        return None   # the branches give different shapes: the runtime runs the one taken
    outputs = tuple(o or f"{node.name}:out{k}" for k, o in enumerate(node.outputs))
    for name, t in zip(outputs, types):
        planner.define(f"node '{node.name}' (If)", name, t)
    planner.steps.append(BranchStep(node.name, cond, outputs, then, other))
    return ()


def _loop(planner: PlanBuilder, node: Node, parts: ControlParts) -> tuple[Trim, ...] | None:
    body: Graph = node.attr("body")
    trip, cond = parts.own[0], parts.own[1]
    if trip and not _scalar(planner, trip, DType.INT64) or cond and not _scalar(planner, cond, DType.BOOL):
        return None
    rows = planner.consts.get(trip) if trip else None
    if parts.scan_outputs and rows is None or _narrow(planner, parts.own[2:]):
        return None   # scan outputs of a length the data decides: the runtime stacks them
    what = f"node '{node.name}' (Loop)"
    counter, going = f"{node.name}:iteration", f"{node.name}:condition"
    for name, t in zip((counter, going), loop_inputs(node, body)):
        planner.define(what, name, t)
    initial = parts.own[2:]
    carried = tuple(o or f"{node.name}:carried{k}" for k, o in enumerate(node.outputs[:parts.carried]))
    for name, init in zip(carried, initial):
        planner.define(what, name, planner.types[init])
    bound = dict(zip((v.name for v in body.inputs), (counter, going, *carried)))
    block = _subgraph(planner, node, parts, body, bound, f"{node.name}/")
    if block is None or not _keeps_types(planner, block, carried, going):
        return None
    scans = node.outputs[parts.carried:]
    early = _may_stop_early(planner, node, parts, cond)
    stacked = tuple(f"{node.name}:bound{j}" if early or not o else o for j, o in enumerate(scans))
    rows = max(0, trip_count(rows)) if scans else 0
    values = [planner.types[s] for s in block.results[1 + parts.carried:]]
    if sum(rows * int(nbytes(t)) for t in values) > STACKED_MAX_BYTES:
        return None
    for name, t in zip(stacked, values):
        planner.define(what, name, TensorType(t.dtype, (rows, *t.shape)))
    planner.steps.append(LoopStep(node.name, trip, cond, initial, counter, going, carried, block, stacked))
    return tuple(Trim(o, b, counter, 0) for o, b in zip(scans, stacked) if o) if early else ()


def _keeps_types(planner: PlanBuilder, block: Block, carried: tuple[str, ...], going: str) -> bool:
    """Whether the body gives a condition, and each carried value in its own type from
    storage that is not another's (the copies after an iteration would overwrite it)."""
    types = planner.types
    roots, _ = view_roots(block.steps, {v: t.dtype.bits // 8 for v, t in types.items()})
    results = block.results[1:1 + len(carried)]
    return _scalar(planner, block.results[0], DType.BOOL) and all(
        types[r] == types[c] and roots.get(r, r) not in {going, *carried} - {c}
        for r, c in zip(results, carried))


def _may_stop_early(planner: PlanBuilder, node: Node, parts: ControlParts, cond: str) -> bool:
    """Whether a loop may run fewer iterations than its trip count: its condition,
    before the first iteration or from its body, is not known to be true."""
    body: Graph = node.attr("body")
    stays = passed_condition(body, dict(zip(body.captures, parts.captures)), planner.consts)
    known = not cond or cond in planner.consts and bool(planner.consts[cond].reshape(-1)[0])
    return not (known and stays in ("passed", True))
