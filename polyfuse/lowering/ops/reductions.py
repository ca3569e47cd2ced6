"""Reductions: Reduce*, ArgMax/ArgMin, the softmax family (Softmax, LogSoftmax,
Hardmax), CumSum and CumProd.

Each is a statement reducing the input over reduction indices ``r<d>`` (``op=!``, so
an empty reduction gives the identity), then elementwise statements on the result.
Every output and temporary is declared with its type and shape: a keepdims dimension
then gets its range 0:1 from the declaration, as range inference needs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import INDEX, OpContext, TCKernel, access, literal, register, tensor_param


@dataclass(frozen=True)
class Reduced:
    """The index names of a reduction of a rank-``rank`` tensor over ``axes``."""

    rank: int
    axes: tuple[int, ...]
    keepdims: bool

    @property
    def lhs(self) -> list[str]:
        """Indices of the reduced tensor (keepdims dimensions have range 0:1)."""
        return [INDEX[d] for d in range(self.rank) if self.keepdims or d not in self.axes]

    @property
    def reduction(self) -> list[str]:
        """Indices reading the input inside the reducing statement."""
        return [f"r{d}" if d in self.axes else INDEX[d] for d in range(self.rank)]

    @property
    def spread(self) -> list[str]:
        """Indices reading the reduced tensor (keepdims layout) at every input element."""
        return ["0" if d in self.axes else INDEX[d] for d in range(self.rank)]

    def shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        return tuple(1 if d in self.axes else int(n) for d, n in enumerate(shape)
                     if self.keepdims or d not in self.axes)

    def count(self, shape: Sequence[int]) -> int:
        return math.prod(int(shape[d]) for d in self.axes)

    def linear(self, names: Sequence[str], shape: Sequence[int]) -> str:
        """The row-major position of ``names`` among the reduced dimensions."""
        terms, stride = [], 1
        for d in reversed(self.axes):
            terms.append(names[d] if stride == 1 else f"{names[d]} * {stride}")
            stride *= int(shape[d])
        return " + ".join(reversed(terms)) or "0"


def tc_kernel(params: Sequence[str], outputs: Sequence[str], lines: Sequence[str],
           inputs: tuple[int, ...], positions: tuple[int, ...] = (0,)) -> TCKernel:
    """A TC definition named ``k``; ``outputs`` lists the node outputs, then temporaries."""
    body = "".join(f"  {line}\n" for line in lines)
    return TCKernel(f"def k({', '.join(params)}) -> ({', '.join(outputs)}) {{\n{body}}}\n",
                    inputs, positions)


def _reduced_axes(ctx: OpContext, rank: int) -> tuple[int, ...]:
    if ctx.has(1):
        raw = ctx.const(1, "axes")
    else:
        raw = ctx.attr("axes")
    values = [] if raw is None else ctx.ints(raw, "axes")
    if not values:
        return () if ctx.flag("noop_with_empty_axes", 0) else tuple(range(rank))
    return tuple(sorted(ctx.axes(values, rank)))


# op -> (reduction operator, input element from {x}, result from the reduction {y})
_REDUCE = {
    "ReduceSum": ("+", "{x}", "{y}"),
    "ReduceMean": ("+", "{x}", "{y} / {n}"),
    "ReduceMax": ("max", "{x}", "{y}"),
    "ReduceMin": ("min", "{x}", "{y}"),
    "ReduceProd": ("*", "{x}", "{y}"),
    "ReduceL1": ("+", "abs({x})", "{y}"),
    "ReduceL2": ("+", "{x} * {x}", "sqrt({y})"),
    "ReduceSumSquare": ("+", "{x} * {x}", "{y}"),
    "ReduceLogSum": ("+", "{x}", "log({y})"),
}


@register(*_REDUCE)
def _reduce(ctx: OpContext) -> TCKernel:
    shape, dt = ctx.shape(0), ctx.dtype(0)
    red = Reduced(len(shape), _reduced_axes(ctx, len(shape)), ctx.flag("keepdims", 1))
    op, element, finish = _REDUCE[ctx.node.op]
    # 16-bit floats accumulate in float32; integer means divide in float64 and truncate;
    # booleans (max: any, min: all) reduce as 0/1 in int32, which every target supports
    acc = DType.FLOAT64 if dt.is_int and ctx.node.op == "ReduceMean" else dt.compute
    if dt.is_bool:
        acc = DType.INT32
    out_shape = red.shape(shape)
    y = access("Y", red.lhs)
    a = access("A", red.lhs) if acc is not dt else y
    lines = [f"{a} {op}=! {element.format(x=access('X', red.reduction))}"]
    result = finish.format(y=a, n=literal(red.count(shape), acc))
    if dt.is_bool:
        lines.append(f"{y} = {a} > 0")
    elif acc is not dt:
        lines.append(f"{y} = {dt}({result})")
    elif result != a:
        lines.append(f"{y} = {result}")
    outputs = [tensor_param("Y", (dt, out_shape))]
    if acc is not dt:
        outputs.append(tensor_param("A", (acc, out_shape)))
    return tc_kernel([tensor_param("X", (dt, shape))], outputs, lines, (0,))


@register("ReduceLogSumExp")
def _reduce_log_sum_exp(ctx: OpContext) -> TCKernel:
    shape, dt = ctx.shape(0), ctx.dtype(0)
    red = Reduced(len(shape), _reduced_axes(ctx, len(shape)), ctx.flag("keepdims", 1))
    acc = dt.compute if dt.is_float else DType.FLOAT64
    x, y, m, s = access("X", red.reduction), access("Y", red.lhs), access("M", red.lhs), \
        access("S", red.lhs)
    # shift by the maximum when it is finite (m - m == 0), so that all -inf, any +inf
    # and an empty reduction come out as -inf, +inf and -inf
    lines = [f"{m} max=! {acc}({x})",
             f"{m} = ({m} - {m} == {literal(0, acc)}) ? {m} : {literal(0, acc)}",
             f"{s} +=! exp({acc}({x}) - {m})",
             f"{y} = {dt}(log({s}) + {m})"]
    out_shape = red.shape(shape)
    outputs = [tensor_param("Y", (dt, out_shape)), tensor_param("M", (acc, out_shape)),
               tensor_param("S", (acc, out_shape))]
    return tc_kernel([tensor_param("X", (dt, shape))], outputs, lines, (0,))


def _extreme(ctx: OpContext, red: Reduced, shape: Sequence[int], *, largest: bool,
             last: bool) -> list[str]:
    """Statements setting ``M`` to the extreme and ``A`` to the (row-major) position
    of its first or last occurrence among the reduced dimensions."""
    x, m, a = access("X", red.reduction), access("M", red.lhs), access("A", red.lhs)
    hit = f"{x} == {m}"
    if ctx.dtype(0).is_float:  # a NaN extreme is where the first/last NaN is
        hit += f" || {x} != {x}"
    none = -1 if last else red.count(shape)
    position = red.linear(red.reduction, shape)
    return [f"{m} {'max' if largest else 'min'}=! {x}",
            f"{a} {'max' if last else 'min'}=! ({hit}) ? int64({position}) : int64({none})"]


@register("ArgMax", "ArgMin")
def _arg(ctx: OpContext) -> TCKernel:
    shape, dt = ctx.shape(0), ctx.dtype(0)
    axis = ctx.axis(ctx.attr("axis", 0), len(shape))
    red = Reduced(len(shape), (axis,), ctx.flag("keepdims", 1))
    lines = _extreme(ctx, red, shape, largest=ctx.node.op == "ArgMax",
                     last=ctx.flag("select_last_index", 0))
    out_shape = red.shape(shape)
    outputs = [tensor_param("A", (DType.INT64, out_shape)), tensor_param("M", (dt, out_shape))]
    return tc_kernel([tensor_param("X", (dt, shape))], outputs, lines, (0,))


def _softmax_axes(ctx: OpContext, rank: int) -> tuple[int, ...]:
    """Opset 13 normalizes along ``axis``; earlier opsets over the input coerced to 2-D
    at ``axis`` (every dimension from ``axis`` on)."""
    if ctx.opset >= 13:
        return (ctx.axis(ctx.attr("axis", -1), rank),)
    return tuple(range(ctx.axis(ctx.attr("axis", 1), rank), rank))


@register("Softmax", "LogSoftmax")
def _softmax(ctx: OpContext) -> TCKernel:
    shape, dt = ctx.shape(0), ctx.dtype(0)
    red = Reduced(len(shape), _softmax_axes(ctx, len(shape)), True)
    acc = dt.compute
    full = INDEX[:len(shape)]
    x, y = access("X", full), access("Y", full)
    m, s = access("M", red.spread), access("S", red.spread)
    # 16-bit floats compute in float32 but, for Softmax, round where ONNX's reference
    # (numpy in the input type) rounds: after the shift, the exponential and the sum
    narrow = dt if dt is not acc and ctx.node.op == "Softmax" else None

    def rounded(e: str) -> str:  # exp of a float16 is typed float16 yet unrounded: widen first
        return f"{narrow}({acc}({e}))" if narrow else e

    def exp_shifted(xs: str, ms: str) -> str:
        return rounded(f"exp({rounded(f'{xs} - {ms}')})")

    lines = [f"{access('M', red.lhs)} max=! {access('X', red.reduction)}"]
    if ctx.node.op == "Softmax" and not narrow:
        # each exponential once: stored in Y, summed from there, then scaled in place by
        # the sum's reciprocal (a division per element cost a ViT's softmax a third of
        # its time; the product is within an ulp or two of the quotient)
        lines += [f"{y} = {exp_shifted(x, m)}", f"{access('S', red.lhs)} +=! {access('Y', red.reduction)}",
                  f"{y} = {y} * ({literal(1, acc)} / {s})"]
    else:
        lines.append(f"{access('S', red.lhs)} +=! "
                     f"{exp_shifted(access('X', red.reduction), access('M', red.lhs))}")
        if narrow:
            lines.append(f"{access('S', red.lhs)} = {rounded(access('S', red.lhs))}")
        lines.append(f"{y} = {dt}({exp_shifted(x, m)} / {s})" if ctx.node.op == "Softmax"
                     else f"{y} = {dt}({x} - {m} - log({s}))")
    temp = red.shape(shape)
    outputs = [tensor_param("Y", (dt, shape)), tensor_param("M", (acc, temp)),
               tensor_param("S", (acc, temp))]
    return tc_kernel([tensor_param("X", (dt, shape))], outputs, lines, (0,))


@register("Hardmax")
def _hardmax(ctx: OpContext) -> TCKernel:
    shape, dt = ctx.shape(0), ctx.dtype(0)
    red = Reduced(len(shape), _softmax_axes(ctx, len(shape)), True)
    full = INDEX[:len(shape)]
    lines = _extreme(ctx, red, shape, largest=True, last=False)
    lines.append(f"{access('Y', full)} = (int64({red.linear(full, shape)}) == "
                 f"{access('A', red.spread)}) ? {literal(1, dt)} : {literal(0, dt)}")
    temp = red.shape(shape)
    outputs = [tensor_param("Y", (dt, shape)), tensor_param("M", (dt, temp)),
               tensor_param("A", (DType.INT64, temp))]
    return tc_kernel([tensor_param("X", (dt, shape))], outputs, lines, (0,))


@register("CumSum", "CumProd")
def _cumulative(ctx: OpContext) -> TCKernel:
    shape, dt = ctx.shape(0), ctx.dtype(0)
    op, identity = ("+", 0) if ctx.node.op == "CumSum" else ("*", 1)
    axis = ctx.axis(ctx.ints(ctx.const(1, "axis"), "axis", 1)[0], len(shape))
    exclusive, reverse = ctx.flag("exclusive", 0), ctx.flag("reverse", 0)
    full = INDEX[:len(shape)]
    source = [("j" if d == axis else i) for d, i in enumerate(full)]
    compare = (">" if reverse else "<") + ("" if exclusive else "=")
    # quadratic in the axis length, but one statement any target vectorizes
    lines = [f"{access('Y', full)} {op}=! (j {compare} {full[axis]}) ? "
             f"{access('X', source)} : {literal(identity, dt)}"]
    return tc_kernel([tensor_param("X", (dt, shape))], [tensor_param("Y", (dt, shape))],
                  lines, (0,))
