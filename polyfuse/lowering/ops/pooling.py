"""Pooling: MaxPool (with its Indices output), AveragePool, LpPool and the global pools.

Each pool is one reduction over the window (``max=!`` or ``+=!``) followed, where
needed, by a statement finishing each output element (the division of an average,
the root of an Lp norm). Window positions in the padding are not read (see conv.py).
"""

from __future__ import annotations

import math

import numpy as np

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import OpContext, TCKernel, literal, register, tensor_param
from polyfuse.lowering.ops.conv import WindowAxis, affine, guarded, where, window_axes


class _Window:
    """Index names and text shared by the statements of one pool."""

    def __init__(self, ctx: OpContext, axes: list[WindowAxis]) -> None:
        self.o = [f"o{i}" for i in range(len(axes))]
        k = [f"k{i}" for i in range(len(axes))]
        batch, channels = ctx.shape(0)[:2]
        self.extents = ([("n", batch), ("c", channels)] + [(o, a.out) for o, a in zip(self.o, axes)]
                        + [(ki, a.kernel) for ki, a in zip(k, axes)])
        self.positions = [a.position(o, ki) for a, o, ki in zip(axes, self.o, k)]
        self.inside = [c for a, o, ki in zip(axes, self.o, k) for c in a.inside(o, ki)]

    def out(self, name: str) -> str:
        return f"{name}(n, c, {', '.join(self.o)})"

    def read(self) -> str:
        return f"X(n, c, {', '.join(self.positions)})"

    def reduce(self, name: str, op: str, value: str, pad_value: str) -> str:
        """``name(n, c, o...) op value`` over the window, ``pad_value`` in the padding."""
        body = guarded(self.inside, value, pad_value)
        return f"  {self.out(name)} {op} {body}{where(self.extents)}"

    def finish(self, name: str, expr: str) -> str:
        return f"  {self.out(name)} = {expr}"


def _source(ctx: OpContext, name: str, outputs: str, lines: list[str]) -> str:
    param = tensor_param("X", ctx.types[0])  # type: ignore[arg-type]
    return f"def {name}({param}) -> ({outputs}) {{\n" + "\n".join(lines) + "\n}\n"


def _pool_axes(ctx: OpContext) -> list[WindowAxis]:
    kernel = ctx.attr("kernel_shape")
    if kernel is None:
        raise ctx.unsupported("the kernel_shape attribute is required")
    return window_axes(ctx, ctx.ints(kernel, "kernel_shape"),
                       ceil_mode=ctx.flag("ceil_mode", 0))


def _global_axes(ctx: OpContext) -> list[WindowAxis]:
    ctx.rank(0, least=2)
    return [WindowAxis(s, s, 1, 1, 0, 0, 1) for s in ctx.shape(0)[2:]]


def _lowest(dt: DType) -> str:
    if dt.is_float:
        return literal(-math.inf, dt)
    return literal(int(np.iinfo(dt.numpy).min), dt)


# --- max ---------------------------------------------------------------------------------

def _max_pool(ctx: OpContext, axes: list[WindowAxis]) -> TCKernel:
    win = _Window(ctx, axes)
    dt = ctx.dtype(0)
    lines = [win.reduce("Y", "max=!", win.read(), _lowest(dt))]
    wants_indices = len(ctx.node.outputs) > 1 and bool(ctx.node.outputs[1])
    if not wants_indices:
        return TCKernel(_source(ctx, "max_pool", "Y", lines), (0,))
    column_major = int(ctx.attr("storage_order", 0)) == 1
    lines += _argmax(ctx, win, column_major=column_major)
    outputs = "Y, I, L" if column_major else "Y, I"
    return TCKernel(_source(ctx, "max_pool", outputs, lines), (0,), (0, 1))


def _argmax(ctx: OpContext, win: _Window, *, column_major: bool) -> list[str]:
    """Statements computing ``I``, the flat input index of each maximum: the first in
    the window's row-major order, as the ONNX reference picks it (column-major numbering
    goes through the temporary ``L``)."""
    batch, channels, *spatial = ctx.shape(0)
    plane = math.prod(spatial)
    row_major = [math.prod(spatial[i + 1:]) for i in range(len(spatial))]
    offset = f"int64({affine([('n', channels), ('c', 1)])}) * {plane}"
    in_plane = affine([(f"({p})" if " " in p else p, s) for p, s in zip(win.positions, row_major)])
    never = literal(batch * channels * plane, DType.INT64)

    def first_max(name: str, key: str) -> str:
        is_max = f"({win.read()} == {win.out('Y')} ? {key} : {never})"
        return win.reduce(name, "min=!", is_max, never)

    if not column_major:
        return [first_max("I", f"{offset} + int64({in_plane})")]
    # storage_order=1 numbers the element column-major (the first spatial axis fastest)
    column = [math.prod(spatial[:i]) for i in range(len(spatial))]
    parts = [f"(L(n, c, {', '.join(win.o)}) / {r}) % {size}" for r, size in zip(row_major, spatial)]
    index = " + ".join(p if c == 1 else f"{p} * {c}" for p, c in zip(parts, column))
    return [first_max("L", f"int64({in_plane})"), win.finish("I", f"{offset} + int64({index})")]


@register("MaxPool")
def _max(ctx: OpContext) -> TCKernel:
    return _max_pool(ctx, _pool_axes(ctx))


@register("GlobalMaxPool")
def _global_max(ctx: OpContext) -> TCKernel:
    return _max_pool(ctx, _global_axes(ctx))


# --- average and Lp ----------------------------------------------------------------------

def _count(a: WindowAxis, o: str, lo: int, hi: int) -> int | str:
    """How many kernel positions of output ``o`` read input positions in ``lo:hi``: a
    number when it is the same at every output position, else TC text.

    Kernel position k counts when ``lo <= start + k * dilation < hi``: k runs from
    ceil((lo - start) / dilation) to ceil((hi - start) / dilation), clipped to the kernel.
    """
    d = a.dilation

    def first(bound: int, out: int) -> int:
        return -((a.start(out) - bound) // d)  # ceil((bound - start) / d)

    begin = [max(0, first(lo, p)) for p in range(a.out)]
    end = [min(a.kernel, first(hi, p)) for p in range(a.out)]
    counts = {e - b for b, e in zip(begin, end)}
    if len(counts) == 1:
        return counts.pop()

    def ceil_text(bound: int) -> str:  # num may be negative: floordiv, not '/' (truncates)
        num = affine([(o, -a.stride)], bound + a.pad + d - 1)
        return f"({num})" if d == 1 else f"floordiv({num}, {d})"

    hi_text = str(a.kernel) if min(end) == a.kernel else f"min({a.kernel}, {ceil_text(hi)})"
    lo_text = "0" if max(begin) == 0 else f"max(0, {ceil_text(lo)})"
    return f"({hi_text} - {lo_text})"


def _average_pool(ctx: OpContext, axes: list[WindowAxis], *, include_pad: bool) -> TCKernel:
    win = _Window(ctx, axes)
    dt = ctx.dtype(0)
    lines = [win.reduce("Y", "+=!", win.read(), literal(0, dt))]
    # padding counts when include_pad, but never the extra room of ceil_mode
    counts = [_count(a, o, -a.pad if include_pad else 0, a.size + (a.pad_end if include_pad else 0))
              for a, o in zip(axes, win.o)]
    divisor = math.prod(c for c in counts if isinstance(c, int))
    varying = [c for c in counts if isinstance(c, str)]
    if varying:
        scale = " * ".join(([str(divisor)] if divisor != 1 else []) + varying)
        lines.append(win.finish("Y", f"{win.out('Y')} / {dt.compute}({scale})"))
    elif divisor != 1:
        lines.append(win.finish("Y", f"{win.out('Y')} / {float(divisor)!r}"))
    return TCKernel(_source(ctx, "average_pool", "Y", lines), (0,))


@register("AveragePool")
def _average(ctx: OpContext) -> TCKernel:
    return _average_pool(ctx, _pool_axes(ctx), include_pad=ctx.flag("count_include_pad", 0))


@register("GlobalAveragePool")
def _global_average(ctx: OpContext) -> TCKernel:
    return _average_pool(ctx, _global_axes(ctx), include_pad=False)


def _lp_pool(ctx: OpContext, axes: list[WindowAxis]) -> TCKernel:
    p = float(ctx.attr("p", 2))
    if not p > 0 or p == float("inf"):
        raise ctx.malformed(f"p = {p} must be a positive finite number")
    win = _Window(ctx, axes)
    x = win.read()
    power = {1.0: f"fabs({x})", 2.0: f"{x} * {x}"}.get(p, f"pow(fabs({x}), {p!r})")
    y = win.out("Y")
    root = {1.0: None, 2.0: f"sqrt({y})"}.get(p, f"pow({y}, {1.0 / p!r})")
    lines = [win.reduce("Y", "+=!", power, literal(0, ctx.dtype(0)))]
    if root is not None:
        lines.append(win.finish("Y", root))
    return TCKernel(_source(ctx, "lp_pool", "Y", lines), (0,))


@register("LpPool")
def _lp(ctx: OpContext) -> TCKernel:
    return _lp_pool(ctx, _pool_axes(ctx))


@register("GlobalLpPool")
def _global_lp(ctx: OpContext) -> TCKernel:
    return _lp_pool(ctx, _global_axes(ctx))
