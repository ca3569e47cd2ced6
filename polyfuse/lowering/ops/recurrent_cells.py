"""One time step of RNN, GRU and LSTM as one kernel: ``RNNStep``, ``GRUStep``, ``LSTMStep``.

These are polyfuse's own ops, made only by the expansion of the ONNX recurrent ops
(:mod:`polyfuse.lowering.ops.recurrent_nets`). A step node reads, in this order:

    XW (batch, gates * hidden)    the step's input projection, biases folded in
    Hp (batch, hidden)            the hidden state before the step
    Cp (batch, hidden)            the cell state before it (LSTM)
    R  (hidden, gates * hidden)   the direction's recurrent weights, transposed (the
                                  product reads rows of its output columns), or with
                                  ``dot`` as ONNX gives them (gates * hidden, hidden)
    P  (3 * hidden)               the peepholes i, o, f (LSTM, optional)
    Rb (hidden)                   the recurrent bias of the GRU's h gate (GRU with
                                  ``linear_before_reset``, optional)
    M  (batch)                    1 where the batch's sequence is still running, else 0
                                  (with ``sequence_lens``, optional)

(an absent one is ""), and defines H, C (LSTM) and, with M, the step's output O (H where
the sequence runs, else 0; H and C keep the old state there). The TC definition is the
product with R (a reduction over the hidden size) then the gates, their activations and
the state update, in that order. Nothing in it names the time step, so every step of a
sequence has the same text and the runtime compiles it once.

Gate activations come from the node's ``activations`` attribute: ``(name, alpha, beta)``
per function, ``clip`` bounds every gate's input when it is above 0.
"""

from __future__ import annotations

import re

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import OpContext, TCKernel, register, tensor_param
from polyfuse.lowering.ops.activations import ACTIVATIONS
from polyfuse.lowering.ops.elementwise import number
from polyfuse.lowering.ops.movement import definition, statement

# the activation functions ONNX lists for its recurrent ops (ONNX's spelling) ->
# (expression over x with {alpha} and {beta}, their defaults)
FUNCTIONS: dict[str, tuple[str, dict[str, float]]] = {
    "Tanh": ("tanh(x)", {}),
    "Sigmoid": ("sigmoid(x)", {}),
    "Affine": ("{alpha} * x + {beta}", {"alpha": 1.0, "beta": 0.0}),
    "ScaledTanh": ("{alpha} * tanh({beta} * x)", {"alpha": 1.0, "beta": 1.0}),
    **{name: ACTIVATIONS[name] for name in ("Relu", "LeakyRelu", "ThresholdedRelu",
                                            "HardSigmoid", "Elu", "Softsign", "Softplus")},
}

XW, HP, CP, R, P, RB, M = range(7)


def apply(function: tuple[str, float, float], x: str, dt: DType) -> str:
    """``function`` (name, alpha, beta) applied to the expression ``x``."""
    name, alpha, beta = function
    template = FUNCTIONS[name][0].format(alpha=number(alpha, dt), beta=number(beta, dt))
    return "(" + re.sub(r"\bx\b", f"({x})", template) + ")"


class _Step:
    """What every step's TC shares: the declarations, the reads and the lets."""

    def __init__(self, ctx: OpContext, gates: int) -> None:
        self.ctx = ctx
        self.batch, width = ctx.shape(XW)
        self.hidden = ctx.shape(HP)[1]
        self.dot = bool(ctx.attr("dot", 0))
        r = (width, self.hidden) if self.dot else (self.hidden, width)
        if width != gates * self.hidden or ctx.shape(R) != r:
            raise ctx.malformed(f"XW {ctx.shape(XW)} and R {ctx.shape(R)} do not hold "
                                f"{gates} gates of hidden size {self.hidden}")
        self.acc = ctx.dtype(HP).compute
        self.functions = [tuple(f) for f in ctx.attr("activations")]
        self.clip = float(ctx.attr("clip", 0.0))
        self.masked = ctx.has(M)
        names = {XW: "XW", HP: "Hp", CP: "Cp", R: "R", P: "P", RB: "Rb", M: "M"}
        self.inputs = tuple(i for i in range(7) if ctx.has(i))
        self.params = [tensor_param(names[i], ctx.type(i)) for i in self.inputs]
        self.outs: list[str] = []
        self.temps: list[str] = []
        self.lines: list[str] = []

    def read(self, name: str, *indices: str) -> str:
        return f"{self.acc}({name}({', '.join(indices)}))"

    def gate(self, k: int, extra: str = "") -> str:
        """The pre-activation of gate ``k`` at (i0, i1): the input projection plus the
        recurrent product (``G``), ``extra`` added, clipped."""
        h = f"i1 + {k * self.hidden}" if k else "i1"
        x = f"{self.read('XW', 'i0', h)} + G(i0, {h}){extra}"
        if self.clip > 0:
            c = number(self.clip, self.acc)
            x = f"min(max({x}, -{c}), {c})"
        return x

    def product(self, columns: int, out: str = "G", left: str = "Hp(i0, j)", start: int = 0) -> None:
        """``out(b, g) = sum_j left(b, j) * R(j, start + g)`` over ``columns`` columns."""
        g = f"i1 + {start}" if start else "i1"
        r = self.read("R", g, "j") if self.dot else self.read("R", "j", g)
        self.lines.append(statement(out, ["i0", "i1"], f"{self.acc}({left}) * {r}",
                                    [self.batch, columns], [f"j in 0:{self.hidden}"], op="+=!"))
        self.temps.append(tensor_param(out, (self.acc, (self.batch, columns))))

    def state(self, name: str, new: str, old: str, lets: list[str]) -> None:
        """State ``name`` = ``new`` (with ``lets``), or ``old`` where the sequence ended."""
        value = f"M(i0) > 0 ? {new} : {self.read(old, 'i0', 'i1')}" if self.masked else new
        dt = self.ctx.dtype(HP)
        self.lines.append(statement(name, ["i0", "i1"], f"{dt}({value})",
                                    [self.batch, self.hidden], lets))
        self.outs.append(tensor_param(name, (dt, (self.batch, self.hidden))))

    def kernel(self) -> TCKernel:
        if self.masked:   # the step's output: its new state, 0 past the sequence's end
            dt = self.ctx.dtype(HP)
            self.lines.append(statement("O", ["i0", "i1"], f"M(i0) > 0 ? H(i0, i1) : {dt}(0)",
                                        [self.batch, self.hidden]))
            self.outs.append(tensor_param("O", (dt, (self.batch, self.hidden))))
        # node outputs: H, then C (LSTM), then O; an LSTM defines C before H
        order = [decl.rsplit(" ", 1)[1] for decl in self.outs]
        place = {"H": 0, "C": 1, "O": len(order) - 1}
        outputs = tuple(place[name] for name in order)
        return TCKernel(definition(self.params, self.outs + self.temps, self.lines), self.inputs,
                        outputs)


@register("RNNStep", internal=True)
def _rnn_step(ctx: OpContext) -> TCKernel:
    """``H = f(XW + Hp R)``."""
    s = _Step(ctx, 1)
    s.product(s.hidden)
    s.state("H", apply(s.functions[0], s.gate(0), s.acc), "Hp", [])
    return s.kernel()


@register("GRUStep", internal=True)
def _gru_step(ctx: OpContext) -> TCKernel:
    """Gates z, r, h: ``H = (1 - z) n + z Hp`` with ``n = g(XW_h + (r Hp) R_h)``, or
    with ``linear_before_reset`` ``n = g(XW_h + r (Hp R_h + Rb_h))``."""
    s = _Step(ctx, 3)
    f, g = s.functions
    n = s.hidden
    z = f"gz = {apply(f, s.gate(0), s.acc)}"
    r = apply(f, s.gate(1), s.acc)
    if ctx.attr("linear_before_reset", 0):
        s.product(3 * n)
        bias = f" + {s.read('Rb', 'i1')}" if ctx.has(RB) else ""
        h = f"{s.read('XW', 'i0', f'i1 + {2 * n}')} + gr * (G(i0, i1 + {2 * n}){bias})"
        lets = [z, f"gr = {r}"]
    else:   # the reset gate scales the state before the product: a second reduction
        s.product(2 * n)
        s.lines.append(statement("Reset", ["i0", "i1"], f"{r} * {s.read('Hp', 'i0', 'i1')}",
                                 [s.batch, n]))
        s.temps.append(tensor_param("Reset", (s.acc, (s.batch, n))))
        s.product(n, "Gh", "Reset(i0, j)", 2 * n)
        h = f"{s.read('XW', 'i0', f'i1 + {2 * n}')} + Gh(i0, i1)"
        lets = [z]
    if s.clip > 0:
        c = number(s.clip, s.acc)
        h = f"min(max({h}, -{c}), {c})"
    lets.append(f"gn = {apply(g, h, s.acc)}")
    s.state("H", f"(1 - gz) * gn + gz * {s.read('Hp', 'i0', 'i1')}", "Hp", lets)
    return s.kernel()


@register("LSTMStep", internal=True)
def _lstm_step(ctx: OpContext) -> TCKernel:
    """Gates i, o, f, c: ``C = f Cp + i g(c)``, ``H = o h(C)``; peepholes add ``P_i Cp``
    and ``P_f Cp`` to i and f and ``P_o C`` to o; ``input_forget`` makes f = 1 - i."""
    s = _Step(ctx, 4)
    f, g, h = s.functions
    n = s.hidden

    def peep(k: int, cell: str) -> str:
        return f" + {s.read('P', f'i1 + {k * n}' if k else 'i1')} * {cell}" if ctx.has(P) else ""

    cp = s.read("Cp", "i0", "i1")
    s.product(4 * n)
    forget = "1 - gi" if ctx.attr("input_forget", 0) else apply(f, s.gate(2, peep(2, "cp")), s.acc)
    s.state("C", "gf * cp + gi * gc", "Cp",
            [f"cp = {cp}", f"gi = {apply(f, s.gate(0, peep(0, 'cp')), s.acc)}",
             f"gf = {forget}", f"gc = {apply(g, s.gate(3), s.acc)}"])
    cell = s.read("C", "i0", "i1")
    s.state("H", f"{apply(f, s.gate(1, peep(1, cell)), s.acc)} * {apply(h, cell, s.acc)}",
            "Hp", [])
    return s.kernel()
