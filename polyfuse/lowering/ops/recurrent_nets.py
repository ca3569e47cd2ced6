"""RNN, GRU and LSTM as scheduled recurrences.

A recurrence cannot be one TC statement (a statement never reads what it writes at other
indices), and unrolling every step into one definition makes kernels whose scheduling
grows with the sequence. So each node expands, per input shapes, into nodes of its own
(:class:`~polyfuse.lowering.ops.Expanded`, parts in :mod:`.recurrent_parts` and
:mod:`.recurrent_cells`):

1. one ``RecurrentProjection``: X times W for every time step and direction, biases
   folded in, as one contraction (the big product, which the matmul schedule makes
   fast), into XW (directions, time, batch, gates * hidden);
2. per time step and direction one step node (``LSTMStep``, ``GRUStep``, ``RNNStep``):
   one kernel doing the product of the state with R and the gates' update. It reads
   its rows of XW, its direction's weights and the previous state through views at an
   offset (no copies) and names no time step, so all steps have one TC text and the
   runtime compiles it once;
3. ``RecurrentStack`` nodes assembling Y, Y_h and Y_c (only those the node's outputs use).

With ``sequence_lens`` a mask stops each batch's state at its length and zeroes its
outputs after it; a reverse direction reads XW reversed per batch length (its sequence
starts at its own last step) and its Y is put back in time order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from polyfuse.ir.graph import Node
from polyfuse.lowering.ops import Expanded, OpContext, register
from polyfuse.lowering.ops.recurrent_cells import FUNCTIONS

X, W, R, B, LENS, H0, C0, P = range(8)

# op -> (gates, default activations per direction)
_CELLS = {"RNN": (1, ("Tanh",)), "GRU": (3, ("Sigmoid", "Tanh")),
          "LSTM": (4, ("Sigmoid", "Tanh", "Tanh"))}
_CHUNK = 16   # steps stacked by one kernel, at least
_DIRECTIONS = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}


@dataclass(frozen=True)
class _Shape:
    steps: int
    batch: int
    hidden: int
    reverse: tuple[bool, ...]   # per direction
    layout: int


def _activations(ctx: OpContext, defaults: tuple[str, ...], dirs: int) -> list[tuple]:
    """``(name, alpha, beta)`` per function of each direction; alphas and betas are
    taken in order by the functions that use them (others keep their defaults), as
    onnxruntime reads them."""
    names = list(ctx.attr("activations", defaults * dirs))
    if len(names) == len(defaults) and dirs == 2:
        names *= 2
    if len(names) != len(defaults) * dirs:
        raise ctx.malformed(f"activations {names} must name {len(defaults) * dirs} functions "
                            f"({len(defaults)} per direction)")
    alphas = [float(a) for a in ctx.attr("activation_alpha", ())]
    betas = [float(b) for b in ctx.attr("activation_beta", ())]
    canonical = {name.lower(): name for name in FUNCTIONS}
    out = []
    for name in names:
        key = canonical.get(str(name).lower())
        if key is None:
            raise ctx.unsupported(f"activation '{name}' is not one of {sorted(FUNCTIONS)}")
        defaults_of = FUNCTIONS[key][1]
        alpha = alphas.pop(0) if "alpha" in defaults_of and alphas else defaults_of.get("alpha", 0.0)
        beta = betas.pop(0) if "beta" in defaults_of and betas else defaults_of.get("beta", 0.0)
        out.append((key, alpha, beta))
    return out


def _shape(ctx: OpContext, gates: int) -> _Shape:
    """The sizes, every input's shape checked against them."""
    direction = ctx.attr("direction", "forward")
    if direction not in _DIRECTIONS:
        raise ctx.malformed(f"direction '{direction}' is not one of {sorted(_DIRECTIONS)}")
    reverse = _DIRECTIONS[direction]
    layout = int(ctx.flag("layout", 0))
    for i in (X, W, R):
        ctx.rank(i, 3)
    x, dirs = ctx.shape(X), len(reverse)
    steps, batch = (x[1], x[0]) if layout else (x[0], x[1])
    hidden = ctx.shape(R)[2]
    if ctx.attr("hidden_size") is not None and int(ctx.attr("hidden_size")) != hidden:
        raise ctx.malformed(f"hidden_size {ctx.attr('hidden_size')} disagrees with R's shape "
                            f"{ctx.shape(R)}")
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    want = {W: (dirs, gates * hidden, x[2]), R: (dirs, gates * hidden, hidden),
            B: (dirs, 2 * gates * hidden), LENS: (batch,), H0: state, C0: state,
            P: (dirs, 3 * hidden)}
    for i, shape in want.items():
        if ctx.has(i) and ctx.shape(i) != shape:
            raise ctx.malformed(f"input {i} has shape {ctx.shape(i)}; with direction "
                                f"'{direction}', hidden size {hidden} and X {x} (layout "
                                f"{layout}) it must have shape {shape}")
    if steps < 1 or batch < 1 or hidden < 1:
        raise ctx.unsupported(f"X {x} and R {ctx.shape(R)}: polyfuse needs at least one "
                              "time step, batch and hidden unit")
    return _Shape(steps, batch, hidden, reverse, layout)


class _Builder:
    """The nodes of one expansion; values are named after the node (``lstm:xw``)."""

    def __init__(self, ctx: OpContext) -> None:
        self.ctx = ctx
        self.name = ctx.node.name
        self.nodes: list[Node] = []

    def add(self, op: str, label: str, inputs: tuple[str, ...], outputs: int = 1,
            names: tuple[str, ...] = (), **attrs: object) -> tuple[str, ...]:
        """A node ``op`` reading ``inputs``; its outputs, named ``names`` or after ``label``."""
        names = names or tuple(f"{self.name}:{label}" + (f".{k}" if outputs > 1 else "")
                               for k in range(outputs))
        self.nodes.append(Node(op, f"{self.name}/{label}", inputs, names, tuple(attrs.items())))
        return names

    def view(self, source: str, label: str, offset: int, shape: tuple[int, ...]) -> str:
        return self.add("TimeSlice", label, (source,), offset=offset, shape=shape)[0]

    def input(self, i: int) -> str:
        return self.ctx.node.inputs[i] if self.ctx.has(i) else ""

    def output(self, i: int) -> str:
        return self.ctx.node.outputs[i] if i < len(self.ctx.node.outputs) else ""


def _initial(b: _Builder, s: _Shape, i: int, label: str) -> list[str]:
    """Each direction's initial state (batch, hidden): views of input ``i``, or zeros."""
    dirs, size = len(s.reverse), s.batch * s.hidden
    if not b.ctx.has(i):
        zero = b.add("RecurrentZeros", f"{label}0", (), shape=(s.batch, s.hidden),
                     dtype=b.ctx.dtype(X).value)[0]
        return [zero] * dirs
    source = b.input(i)
    if s.layout:   # (batch, directions, hidden) -> (directions, batch, hidden)
        source = b.add("Transpose", f"{label}_t", (source,), perm=(1, 0, 2))[0]
    return [b.view(source, f"{label}0.{d}", d * size, (s.batch, s.hidden)) for d in range(dirs)]


def _weights(b: _Builder, s: _Shape, gates: int, lbr: bool) -> list[tuple[str, str, str]]:
    """Per direction: R (as the step reads it), the peepholes and the GRU's h-gate
    recurrent bias (or "")."""
    dirs, n, width = len(s.reverse), s.hidden, gates * s.hidden
    # transposed (at compile time when constant): the product with the state reads rows
    # of its output columns, vectors of the gates (register blocks: R is small and stays
    # in cache from step to step); one batch row is a vector times R, dot products
    r = b.input(R) if _dot(s) else b.add("Transpose", "rt", (b.input(R),), perm=(0, 2, 1))[0]
    out = []
    for d in range(dirs):
        rd = b.view(r, f"r.{d}", d * n * width, (width, n) if _dot(s) else (n, width))
        p = b.view(b.input(P), f"p.{d}", d * 3 * n, (3 * n,)) if gates == 4 and b.ctx.has(P) else ""
        rb = b.view(b.input(B), f"rb.{d}", d * 2 * width + width + 2 * n, (n,)) \
            if lbr and b.ctx.has(B) else ""
        out.append((rd, p, rb))
    return out


def _dot(s: _Shape) -> bool:
    return s.batch == 1


@register("RNN", "GRU", "LSTM", expands=True)
def _expand(ctx: OpContext) -> Expanded:
    op = ctx.node.op
    gates, defaults = _CELLS[op]
    s = _shape(ctx, gates)
    dirs, width, per = len(s.reverse), gates * s.hidden, len(defaults)
    functions = _activations(ctx, defaults, dirs)
    lbr = op == "GRU" and int(ctx.attr("linear_before_reset", 0)) != 0
    b = _Builder(ctx)
    xw = b.add("RecurrentProjection", "xw", (b.input(X), b.input(W), b.input(B)),
               layout=s.layout, folded=2 * s.hidden if lbr else width)[0]
    lens = b.input(LENS)
    mask = b.add("RecurrentMask", "mask", (lens,), steps=s.steps,
                 dtype=ctx.dtype(X).compute.value)[0] if lens else ""
    # the reverse direction's rows, each batch's reversed within its length
    reversed_xw = b.add("RecurrentReverse", "xw_reversed", (xw, lens))[0] \
        if lens and s.reverse[-1] else ""
    h = _initial(b, s, H0, "h")
    c = _initial(b, s, C0, "c") if op == "LSTM" else [""] * dirs
    weights = _weights(b, s, gates, lbr)
    attrs = {"clip": float(ctx.attr("clip", 0.0) or 0.0), "linear_before_reset": int(lbr),
             "input_forget": int(ctx.attr("input_forget", 0) or 0), "dot": int(_dot(s))}
    rows = s.batch * width
    outputs: list[str] = []
    for step in range(s.steps):
        for d in range(dirs):
            label = f"step{step}" + (f".{'rf'[d == 0]}" if dirs > 1 else "")
            if s.reverse[d] and lens:
                part = b.view(reversed_xw, f"{label}.xw", step * rows, (s.batch, width))
            else:
                t = s.steps - 1 - step if s.reverse[d] else step
                part = b.view(xw, f"{label}.xw", (d * s.steps + t) * rows, (s.batch, width))
            m = b.view(mask, f"{label}.m", step * s.batch, (s.batch,)) if mask else ""
            results = b.add(f"{op}Step", label, (part, h[d], c[d], *weights[d], m),
                            outputs=1 + (op == "LSTM") + bool(mask),
                            activations=tuple(functions[d * per:(d + 1) * per]), **attrs)
            h[d] = results[0]
            c[d] = results[1] if op == "LSTM" else ""
            outputs.append(results[-1] if mask else results[0])
    _outputs(b, s, outputs, h, c, lens)
    return Expanded(tuple(b.nodes))


def _outputs(b: _Builder, s: _Shape, outputs: list[str], h: list[str], c: list[str],
             lens: str) -> None:
    """Y, Y_h and Y_c from the steps' outputs and last states: those the node defines.
    A long sequence's outputs are stacked in chunks of about sqrt(steps) consecutive
    steps (each chunk of one size has one text), then the chunks into Y."""
    dirs = len(s.reverse)
    if b.output(0):
        parts, firsts = outputs, [(step, d) for step in range(s.steps) for d in range(dirs)]
        size = max(_CHUNK, math.isqrt(s.steps - 1) + 1)
        if s.steps > size:
            parts, firsts = [], []
            for d in range(dirs):
                for first in range(0, s.steps, size):
                    steps = range(first, min(first + size, s.steps))
                    parts += b.add("RecurrentChunk", f"y{first}.{d}",
                                   tuple(outputs[step * dirs + d] for step in steps))
                    firsts.append((first, d))
        unreverse = bool(lens) and s.reverse[-1]
        y = b.add("RecurrentStack", "y", tuple(parts), names=() if unreverse else (b.output(0),),
                  steps=s.steps, directions=dirs, layout=s.layout, parts=tuple(firsts),
                  flip=tuple(int(r and not lens) for r in s.reverse))[0]
        if unreverse:
            b.add("RecurrentUnreverse", "y_ordered", (y, lens), names=(b.output(0),), layout=s.layout)
    for i, states in ((1, h), (2, c)):
        if b.output(i):
            b.add("RecurrentStack", f"y{'hc'[i - 1]}", tuple(states), names=(b.output(i),), steps=1,
                  directions=dirs, layout=s.layout, flip=(0,) * dirs, state=1,
                  parts=tuple((0, d) for d in range(dirs)))
