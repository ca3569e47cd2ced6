"""The parts the recurrent ops expand into, besides their steps (polyfuse's own ops,
made only by :mod:`polyfuse.lowering.ops.recurrent_nets`):

* ``RecurrentProjection``: every time step's input times W for every direction, one
  contraction ``XW(d, t, b, g) = sum_k X(t, b, k) W(d, g, k)`` with the biases added;
  constant weights are transposed at compile time (as Gemm does), so the product reads
  rows of output columns;
* ``TimeSlice``: a view of a value's storage from an offset (one time step of XW, one
  direction's weights or state): no copy;
* ``RecurrentMask``: ``M(t, b) = 1`` while batch b's sequence runs (``t < L(b)``);
* ``RecurrentReverse``: one direction of XW with each batch's first ``L(b)`` steps
  reversed (a reverse direction with ``sequence_lens`` starts at its own last step);
* ``RecurrentChunk`` and ``RecurrentStack``: the steps' outputs, in parts of
  consecutive steps, as Y (or the last states as Y_h, Y_c) in the op's layout;
* ``RecurrentUnreverse``: Y's reverse direction put back in time order, per batch length;
* ``RecurrentZeros``: a zero initial state.
"""

from __future__ import annotations

import math

import numpy as np

from polyfuse.lowering.ops import (INDEX, Folded, OpContext, TCKernel, View, register,
                                   tensor_param)
from polyfuse.lowering.ops.movement import definition, statement


def _cast(expr: str, dt: object, acc: object) -> str:
    return expr if dt == acc else f"{acc}({expr})"


@register("RecurrentProjection", internal=True)
def _projection(ctx: OpContext) -> TCKernel:
    """Inputs X, W and B (optional); ``layout`` 1 reads X as (batch, time, input);
    ``folded`` is how many leading columns of the gates take R's bias (B's second half)
    too: a GRU with ``linear_before_reset`` adds its h gate's inside the step."""
    (dirs, width, size), x = ctx.shape(1), ctx.shape(0)
    layout = int(ctx.attr("layout", 0))
    steps, batch = (x[1], x[0]) if layout else (x[0], x[1])
    dt, acc = ctx.dtype(0), ctx.dtype(0).compute
    out = [dirs, steps, batch, width]
    params, inputs = [tensor_param("X", ctx.type(0))], [0]
    xr = _cast("X(i2, i1, k)" if layout else "X(i1, i2, k)", dt, acc)
    constants: tuple[np.ndarray, ...] = ()
    if ctx.values[1] is not None and steps * batch >= 8:
        constants = (np.ascontiguousarray(ctx.values[1].transpose(0, 2, 1)),)
        wr = "W(i0, k, i3)"
    else:
        params.append(tensor_param("W", ctx.type(1)))
        inputs.append(1)
        wr = "W(i0, i3, k)"
    lines = [statement("XW", INDEX[:4], f"{xr} * {_cast(wr, dt, acc)}", out,
                       [f"k in 0:{size}"], op="+=!")]
    if ctx.has(2):
        params.append(tensor_param("B", ctx.type(2)))
        inputs.append(2)
        folded = int(ctx.attr("folded", width))
        rb = _cast(f"B(i0, i3 + {width})", dt, acc)
        if folded < width:
            rb = f"(i3 < {folded} ? {rb} : {acc}(0))"
        lines.append(statement("XW", INDEX[:4], f"XW(i0, i1, i2, i3) + "
                               f"{_cast('B(i0, i3)', dt, acc)} + {rb}", out))
    if constants:
        params.append(tensor_param("W", (ctx.dtype(1), constants[0].shape)))
    return TCKernel(definition(params, [tensor_param("XW", (acc, out))], lines), tuple(inputs),
                    constants=constants)


@register("TimeSlice", internal=True)
def _time_slice(ctx: OpContext) -> View:
    shape = tuple(int(d) for d in ctx.attr("shape"))
    start = int(ctx.attr("offset"))
    if start < 0 or start + math.prod(shape) > math.prod(ctx.shape(0)):
        raise ctx.malformed(f"a slice of shape {shape} at {start} reads past its input's "
                            f"{ctx.shape(0)}")
    return View(0, shape, start)


@register("RecurrentMask", internal=True)
def _mask(ctx: OpContext) -> TCKernel:
    steps, batch = int(ctx.attr("steps")), ctx.shape(0)[0]
    acc = ctx.element_type("dtype")
    assert acc is not None
    line = statement("M", ["i0", "i1"], f"i0 < L(i1) ? {acc}(1) : {acc}(0)", [steps, batch])
    return TCKernel(definition([tensor_param("L", ctx.type(0))],
                               [tensor_param("M", (acc, (steps, batch)))], [line]), (0,))


def _reversed(data: str, at: list[str], time: int, batch: int) -> str:
    """``data`` read at ``at`` with index ``time`` reversed within each batch's length."""
    length = f"L({at[batch]})"
    flipped = list(at)
    flipped[time] = f"{length} - 1 - {at[time]}"
    return f"{at[time]} < {length} ? {data}({', '.join(flipped)}) : {data}({', '.join(at)})"


@register("RecurrentReverse", internal=True)
def _reverse(ctx: OpContext) -> TCKernel:
    """XW (directions, time, batch, gates), lengths -> the last direction, each batch's
    sequence reversed: what that direction reads at each of its steps."""
    dirs, steps, batch, width = ctx.shape(0)
    rhs = _reversed("XW", [str(dirs - 1), "i0", "i1", "i2"], 1, 2)
    line = statement("Y", INDEX[:3], rhs, [steps, batch, width])
    return TCKernel(definition([tensor_param("XW", ctx.type(0)), tensor_param("L", ctx.type(1))],
                               [tensor_param("Y", (ctx.dtype(0), (steps, batch, width)))], [line]),
                    (0, 1))


def _axes(layout: int) -> tuple[int, int, int]:
    """The time, direction and batch axes of Y in ``layout``."""
    return (1, 2, 0) if layout else (0, 1, 2)


@register("RecurrentChunk", internal=True)
def _chunk(ctx: OpContext) -> TCKernel:
    """Inputs (batch, hidden), consecutive steps of one direction -> (steps, batch,
    hidden): a part of Y, so that no kernel stacks a whole long sequence (a definition
    of hundreds of statements takes long to schedule)."""
    params, lines = [], []
    batch, hidden = ctx.shape(0)
    for k in range(len(ctx.types)):
        params.append(tensor_param(f"X{k}", ctx.type(k)))
        lines.append(statement("Y", INDEX[:3], f"X{k}(i1, i2)", [f"{k}:{k + 1}", batch, hidden]))
    out = (ctx.dtype(0), (len(ctx.types), batch, hidden))
    return TCKernel(definition(params, [tensor_param("Y", out)], lines), tuple(range(len(ctx.types))))


@register("RecurrentStack", internal=True)
def _stack(ctx: OpContext) -> TCKernel | View:
    """Parts of the output, each one step's (batch, hidden) or consecutive steps' (n,
    batch, hidden) of one direction, ``parts`` giving each one's first step and direction
    -> Y: (steps, directions, batch, hidden) or, with ``layout`` 1, (batch, steps,
    directions, hidden); ``flip`` says per direction whether its steps run back in time.
    With ``state`` (the last states: one step) the time axis is left out: Y_h and Y_c."""
    steps, dirs, layout = int(ctx.attr("steps")), int(ctx.attr("directions")), int(ctx.attr("layout"))
    flip, state = [int(f) for f in ctx.attr("flip")], int(ctx.attr("state", 0))
    batch, hidden = ctx.shape(0)[-2:]
    axes = ["b", "t", "d", "h"] if layout else ["t", "d", "b", "h"]
    if state:
        axes.remove("t")
    extent = {"t": steps, "d": dirs, "b": batch, "h": hidden}
    out = [extent[a] for a in axes]
    if len(ctx.types) == 1 and len(ctx.shape(0)) == 2:
        return View(0, tuple(out))
    at = {a: INDEX[k] for k, a in enumerate(axes)}
    params, lines = [], []
    for k, (first, d) in enumerate(ctx.attr("parts")):
        shape = ctx.shape(k)
        count = shape[0] if len(shape) == 3 else 1
        # the part's steps first..first+count-1 at these times; its index of time t
        start, index = ((steps - first - count, f"{steps - 1 - first} - {at.get('t')}") if flip[d]
                        else (first, f"{at.get('t')} - {first}"))
        place = {"t": (start, start + count), "d": (d, d + 1)}
        extents: list[int | str] = [f"{place[a][0]}:{place[a][1]}" if a in place and a in at
                                    else extent[a] for a in axes]
        read = [index] if len(shape) == 3 else []
        params.append(tensor_param(f"X{k}", ctx.type(k)))
        lines.append(statement("Y", INDEX[:len(axes)],
                               f"X{k}({', '.join(read + [at['b'], at['h']])})", extents))
    return TCKernel(definition(params, [tensor_param("Y", (ctx.dtype(0), out))], lines),
                    tuple(range(len(ctx.types))))


@register("RecurrentUnreverse", internal=True)
def _unreverse(ctx: OpContext) -> TCKernel:
    """Y (in ``layout``) and the lengths -> Y with its last direction's steps, which ran
    in each batch's reversed order, back in time order."""
    shape = list(ctx.shape(0))
    time, direction, b = _axes(int(ctx.attr("layout")))
    dirs = shape[direction]
    lines = []
    if dirs > 1:
        kept: list[int | str] = list(shape)
        kept[direction] = f"0:{dirs - 1}"
        lines.append(statement("Y", INDEX[:4], f"Ys({', '.join(INDEX[:4])})", kept))
    last: list[int | str] = list(shape)
    last[direction] = f"{dirs - 1}:{dirs}"
    lines.append(statement("Y", INDEX[:4], _reversed("Ys", list(INDEX[:4]), time, b), last))
    return TCKernel(definition([tensor_param("Ys", ctx.type(0)), tensor_param("L", ctx.type(1))],
                               [tensor_param("Y", ctx.type(0))], lines), (0, 1))


@register("RecurrentZeros", internal=True)
def _zeros(ctx: OpContext) -> Folded:
    dt = ctx.element_type("dtype")
    assert dt is not None
    return Folded((np.zeros(tuple(int(d) for d in ctx.attr("shape")), dt.numpy),))
