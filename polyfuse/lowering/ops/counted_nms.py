"""NonMaxSuppression: per batch and class, boxes taken greedily in score order, each
kept unless a box kept before it overlaps it by more than the IoU threshold.

Greedy selection is sequential (a box's fate depends on the fates of the boxes before
it), which no comprehension states; it is the one fixed point of a parallel step,
though: ``G(j) = candidate(j) and no i before j with G(i) suppresses j``. Iterated from
``G = candidates``, each round settles at least the next box in score order, and a round
that changes nothing has reached the greedy answer. So the node expands (``Expanded``)
into three kernels and a Loop the data ends:

* ``NonMaxSuppression.setup``: the candidates (score above the threshold) and, per batch
  and class, which candidate comes before and suppresses which box (IoU computed in the
  boxes' type, in the reference's order of operations);
* a Loop of ``NonMaxSuppression.round`` until a round changes nothing (run by the
  runtime, the round compiled once);
* ``NonMaxSuppression.select``: the first ``max_output_boxes_per_class`` kept per batch
  and class, numbered batch by batch, class by class, in score order (ties: the lower
  box index first, as the reference), written as ``[batch, class, box]`` rows at the
  bound ``batches * classes * boxes`` with their count (:class:`Counted`).
"""

from __future__ import annotations

import numpy as np

from polyfuse.ir.graph import Graph, Node, TensorType, Value
from polyfuse.ir.types import DType
from polyfuse.lowering.ops import Counted, Expanded, OpContext, TCKernel, register, tensor_param
from polyfuse.lowering.ops.counted import PAIRS_MAX, POSITIONS_MAX, check_count, count_statement
from polyfuse.lowering.ops.movement import definition, parameter


def _before(s: str, i: str, j: str) -> str:
    """Box ``i`` comes before box ``j`` in class ``c``'s score order."""
    return f"({s}(b, c, {i}) > {s}(b, c, {j}) || ({s}(b, c, {i}) == {s}(b, c, {j}) && {i} < {j}))"


def _scalar(ctx: OpContext, i: int, name: str) -> str:
    return f"{name}()" if ctx.rank(i, 0, 1) == 0 else f"{name}(0)"


@register("NonMaxSuppression", expands=True)
def _non_max_suppression(ctx: OpContext) -> Expanded:
    batches, boxes, four = ctx.shape(0)
    if four != 4 or ctx.shape(1)[0] != batches or ctx.shape(1)[2] != boxes or ctx.rank(1) != 3:
        raise ctx.malformed(f"boxes {ctx.shape(0)} must be [batches, boxes, 4] and scores "
                            f"{ctx.shape(1)} [batches, classes, boxes]")
    classes = ctx.shape(1)[1]
    check_count(ctx, batches * classes * boxes, "boxes over all batches and classes", POSITIONS_MAX)
    if classes * batches * boxes * boxes > PAIRS_MAX:
        raise ctx.unsupported(f"{batches} batches of {classes} classes of {boxes} boxes; polyfuse "
                              f"compares at most {PAIRS_MAX} pairs of boxes")
    node = ctx.node
    inputs = list(node.inputs) + [""] * (5 - len(node.inputs))
    name = node.name
    cand, pairs, kept, go = f"{name}:candidates", f"{name}:pairs", f"{name}:kept", f"{name}:go"
    kept_in, kept_out, changed = f"{name}/kept", f"{name}/next", f"{name}/changed"
    setup = Node("NonMaxSuppression.setup", f"{name}/setup",
                 (inputs[0], inputs[1], inputs[3], inputs[4]), (cand, pairs),
                 (("center_point_box", ctx.attr("center_point_box", 0)),))
    mask = TensorType(DType.BOOL, (batches, classes, boxes))
    body = Graph(f"{name}/rounds",
                 (Value(f"{name}/iteration", TensorType(DType.INT64, ())),
                  Value(f"{name}/going", TensorType(DType.BOOL, ())), Value(kept_in, mask)),
                 (Value(changed, TensorType(DType.BOOL, (1,))), Value(kept_out, mask)),
                 (Node("NonMaxSuppression.round", f"{name}/round", (kept_in, pairs, cand),
                       (kept_out, changed)),),
                 opset=ctx.opset, captures=(pairs, cand))
    loop = Node("Loop", f"{name}/rounds", ("", go, cand, pairs, cand), (kept,), (("body", body),))
    select = Node("NonMaxSuppression.select", f"{name}/select", (kept, inputs[1], inputs[2]),
                  node.outputs[:1])
    return Expanded((setup, loop, select), {go: np.array(True)})


def _iou_terms(center: bool) -> list[str]:
    """Lets of box ``j`` (1) against box ``i`` (2): the intersection ``w``, ``h``, its
    area ``n``, the areas ``a1``, ``a2`` and the union ``u``, as the reference computes them."""
    def box(k: str, v: str) -> str:
        return f"X(b, {v}, {k})"
    lets = []
    for n, v in (("1", "j"), ("2", "i")):
        for axis, (first, second) in (("x", "13"), ("y", "02")):
            if center:   # centre first, then size: x is (0, 2), y is (1, 3)
                mid, half = box(str(int(axis == "y")), v), f"{box(str(2 + int(axis == 'y')), v)} / 2.0"
                lets += [f"{axis}{n}a = {mid} - {half}", f"{axis}{n}b = {mid} + {half}"]
            else:
                a, b = box(first, v), box(second, v)
                lets += [f"{axis}{n}a = min({a}, {b})", f"{axis}{n}b = max({a}, {b})"]
    return lets + ["w = min(x1b, x2b) - max(x1a, x2a)", "h = min(y1b, y2b) - max(y1a, y2a)",
                   "n = w * h", "a1 = (x1b - x1a) * (y1b - y1a)", "a2 = (x2b - x2a) * (y2b - y2a)",
                   "u = a1 + a2 - n"]


@register("NonMaxSuppression.setup", internal=True)
def _setup(ctx: OpContext) -> TCKernel:
    batches, classes, boxes = ctx.shape(1)
    center = ctx.attr("center_point_box", 0)
    if center not in (0, 1):
        raise ctx.malformed(f"center_point_box is {center!r}; it must be 0 or 1")
    dt = ctx.dtype(0)
    given = [i for i in (2, 3) if ctx.has(i)]
    iou = _scalar(ctx, 2, "T") if ctx.has(2) else f"{dt}(0.0)"
    candidate = f"S(b, c, j) > {_scalar(ctx, 3, 'Q')}" if ctx.has(3) else "bool(1)"
    zero = f"{dt}(0.0)"
    overlap = (f"w > {zero} && h > {zero} && n > {zero} && a1 > {zero} && a2 > {zero} && u > {zero} "
               f"&& n / u > {iou}")
    lets = ", ".join(_iou_terms(center == 1))
    lines = [f"K(b, c, j) = {candidate} where b in 0:{batches}, c in 0:{classes}, j in 0:{boxes}",
             f"M(b, c, i, j) = K(b, c, i) && {_before('S', 'i', 'j')} && {overlap} where b in 0:{batches}, "
             f"c in 0:{classes}, i in 0:{boxes}, j in 0:{boxes}, {lets}"]
    params = [parameter(ctx, 0, "X"), parameter(ctx, 1, "S")] + \
        [parameter(ctx, i, name) for i, name in ((2, "T"), (3, "Q")) if i in given]
    outputs = [tensor_param("K", (DType.BOOL, [batches, classes, boxes])),
               tensor_param("M", (DType.BOOL, [batches, classes, boxes, boxes]))]
    return TCKernel(definition(params, outputs, lines), (0, 1, *given), (0, 1))


@register("NonMaxSuppression.round", internal=True)
def _round(ctx: OpContext) -> TCKernel:
    batches, classes, boxes = ctx.shape(0)
    every = f"b in 0:{batches}, c in 0:{classes}, j in 0:{boxes}"
    lines = [f"H(b, c, j) +=! (M(b, c, i, j) && G(b, c, i)) ? 1 : 0 where {every}, i in 0:{boxes}",
             f"Y(b, c, j) = K(b, c, j) && H(b, c, j) == 0 where {every}",
             f"D(z) +=! Y(b, c, j) != G(b, c, j) ? 1 : 0 where z in 0:1, {every}",
             "C(z) = D(z) > 0 where z in 0:1"]
    params = [parameter(ctx, 0, "G"), parameter(ctx, 1, "M"), parameter(ctx, 2, "K")]
    outputs = [parameter(ctx, 0, "Y"), tensor_param("C", (DType.BOOL, [1])),
               tensor_param("H", (DType.INT32, [batches, classes, boxes])),
               tensor_param("D", (DType.INT32, [1]))]
    return TCKernel(definition(params, outputs, lines), (0, 1, 2), (0, 1))


@register("NonMaxSuppression.select", internal=True)
def _select(ctx: OpContext) -> Counted:
    batches, classes, boxes = ctx.shape(0)
    total = batches * classes * boxes
    check_count(ctx, total, "boxes over all batches and classes", POSITIONS_MAX)
    every = f"b in 0:{batches}, c in 0:{classes}, j in 0:{boxes}"
    limit = _scalar(ctx, 2, "L") if ctx.has(2) else "int64(0)"
    pairs = batches * classes
    lines = [
        # R: the kept boxes before j in its class; F: j is among the first `limit` kept
        f"R(b, c, j) +=! (G(b, c, i) && {_before('S', 'i', 'j')}) ? int64(1) : int64(0) "
        f"where {every}, i in 0:{boxes}",
        f"F(b, c, j) = G(b, c, j) && R(b, c, j) < {limit} where {every}",
        f"E(b, c) +=! F(b, c, j) ? int64(1) : int64(0) where {every}",
        # O: the rows of the batches and classes before (b, c)
        f"O(b, c) +=! (q * {classes} + p < b * {classes} + c) ? E(q, p) : int64(0) "
        f"where b in 0:{batches}, c in 0:{classes}, q in 0:{batches}, p in 0:{classes}",
        # row m: the batch and class g whose rows hold it (those ending at or before m
        # precede it), then the box of g numbered m
        f"A(m) +=! (O(q, p) + E(q, p) <= m) ? int64(1) : int64(0) "
        f"where m in 0:{total}, q in 0:{batches}, p in 0:{classes}",
        f"P(m) +=! (F(g / {classes}, g % {classes}, j) && O(g / {classes}, g % {classes}) + "
        f"R(g / {classes}, g % {classes}, j) == m) ? g * {boxes} + j : int64(0) "
        f"where m in 0:{total}, j in 0:{boxes}, g = min(A(m), int64({pairs - 1}))",
        f"Y(m, k) = k == 0 ? P(m) / {classes * boxes} : (k == 1 ? P(m) / {boxes} % {classes} : "
        f"P(m) % {boxes}) where m in 0:{total}, k in 0:3",
    ]
    count = count_statement(lines, "F(b, c, j)", [every])
    given = (0, 1, 2) if ctx.has(2) else (0, 1)
    params = [parameter(ctx, i, name) for i, name in zip(given, "GSL")]
    mask = [batches, classes, boxes]
    outputs = [tensor_param("Y", (DType.INT64, [total, 3])), count,
               tensor_param("R", (DType.INT64, mask)), tensor_param("F", (DType.BOOL, mask)),
               tensor_param("E", (DType.INT64, [batches, classes])),
               tensor_param("O", (DType.INT64, [batches, classes])),
               tensor_param("A", (DType.INT64, [total])), tensor_param("P", (DType.INT64, [total]))]
    return Counted(TCKernel(definition(params, outputs, lines), given), ((0, 0),))
