"""Conv and ConvTranspose, and the sliding-window arithmetic the pooling ops share.

Tensors are ONNX's ``(N, C, D1, ..., Dk)``. Along a window axis, output position ``o``
and kernel position ``k`` read input position ``o * stride + k * dilation - pad``. Reads
that can land in the padding sit under a select (``inside ? read : 0``), which reads
only the chosen side; every index then gets its range from a ``where`` clause, since
range inference would shrink the output to the unpadded windows. Conv moves that select
out of its reduction where it can: a first statement copies the input into a padded
temporary, which the reduction then reads unguarded.
"""

from __future__ import annotations

from collections.abc import Sequence
import math
from dataclasses import dataclass, replace

import numpy as np

from polyfuse.ir.types import DType
from polyfuse.lowering.layout import CHANNELS_LAST, grouped_channels_last
from polyfuse.lowering.ops import OpContext, TCKernel, literal, register, tensor_param

_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
CHANNELS_LAST_ROWS = 32     # output rows narrower than this accumulate channels-last
CHANNELS_LAST_DEPTH = 64    # so do reductions this deep


def affine(terms: Sequence[tuple[str, int]], const: int = 0) -> str:
    """``sum(coef * index) + const`` as TC text, leaving out unit factors and zero terms."""
    text = ""
    for name, coef in terms:
        if coef == 0:
            continue
        term = name if abs(coef) == 1 else f"{abs(coef)} * {name}"
        text = (("-" if coef < 0 else "") + term if not text
                else f"{text} {'-' if coef < 0 else '+'} {term}")
    if not text:
        return str(const)
    return text if const == 0 else f"{text} {'-' if const < 0 else '+'} {abs(const)}"


def where(extents: Sequence[tuple[str, int]]) -> str:
    """A where clause giving every index its range ``0:extent``."""
    return " where " + ", ".join(f"{i} in 0:{e}" for i, e in extents) if extents else ""


def guarded(conditions: Sequence[str], value: str, otherwise: str) -> str:
    """``value`` where every condition holds, else ``otherwise`` (read only if chosen)."""
    if not conditions:
        return value
    return f"({' && '.join(conditions)}) ? {value} : {otherwise}"


@dataclass(frozen=True)
class WindowAxis:
    """One spatial axis of a sliding window (Conv and the pools)."""

    size: int       # input extent
    kernel: int
    stride: int
    dilation: int
    pad: int        # padding before the input
    pad_end: int    # padding after it (what count_include_pad counts)
    out: int        # output extent

    def position(self, o: str, k: str) -> str:
        return affine([(o, self.stride), (k, self.dilation)], -self.pad)

    def start(self, o: int) -> int:
        """The input position of kernel position 0 at output position ``o``."""
        return o * self.stride - self.pad

    @property
    def span(self) -> int:
        """The padded input positions the windows cover: ``0:span`` from the padding's start."""
        return (self.out - 1) * self.stride + (self.kernel - 1) * self.dilation + 1

    def inside(self, o: str, k: str) -> list[str]:
        """The conditions keeping the read inside the input; only those that can fail."""
        pos = self.position(o, k)
        return ([f"{pos} >= 0"] if self.pad > 0 else []) + \
               ([f"{pos} < {self.size}"] if self.span - self.pad > self.size else [])

    def padded(self) -> WindowAxis:
        """The same windows over the input copied into ``0:span`` with its padding."""
        return replace(self, size=self.span, pad=0, pad_end=0)

    def reads_inside(self, k: int) -> bool:
        """Whether kernel position ``k`` reads inside the input at some output position."""
        first = max(0, -(-(self.pad - k * self.dilation) // self.stride))   # the first o at or past 0
        return first < self.out and first * self.stride + k * self.dilation - self.pad < self.size


def live_taps(axes: list[WindowAxis]) -> tuple[list[WindowAxis], list[int]]:
    """The axes with each window cut to the kernel positions that read inside the input
    at some output position (a convolution dilated past a small map reads only padding
    with its outer taps: DeepLab's rates 24 and 36 on a 14 x 14 map keep 1 of 9), and
    the first position kept on each axis. An axis whose cut would need negative padding
    stays whole."""
    out, first = [], []
    for a in axes:
        live = [k for k in range(a.kernel) if a.reads_inside(k)] or [0, a.kernel - 1]
        lo, hi = live[0], live[-1]
        pad, pad_end = a.pad - lo * a.dilation, a.pad_end - (a.kernel - 1 - hi) * a.dilation
        if (lo, hi) == (0, a.kernel - 1) or pad < 0 or pad_end < 0:
            out.append(a)
            first.append(0)
        else:
            out.append(replace(a, kernel=hi - lo + 1, pad=pad, pad_end=pad_end))
            first.append(lo)
    return out, first


def live_weights(weights: np.ndarray, axes: list[WindowAxis], first: list[int]) -> np.ndarray:
    """``weights`` (output channels, input channels, kernel...) cut to the live taps."""
    return weights[(slice(None), slice(None), *(slice(f, f + a.kernel) for a, f in zip(axes, first)))]


def int_list(ctx: OpContext, name: str, n: int, default: int, least: int | None = None) -> list[int]:
    value = ctx.attr(name)
    if value is None or np.size(value) == 0:
        return [default] * n
    if np.size(value) != n:
        raise ctx.unsupported(f"attribute '{name}' has {np.size(value)} values, expected {n}")
    return ctx.ints(value, name, n, least)


def auto_pad(ctx: OpContext) -> str:
    mode = str(ctx.attr("auto_pad", "NOTSET"))
    if mode not in _AUTO_PADS:
        raise ctx.unsupported(f"auto_pad '{mode}' is not one of {', '.join(_AUTO_PADS)}")
    return mode


def split_padding(total: int, mode: str) -> int:
    """The padding before the input when ``total`` is split as ``mode`` says (SAME_UPPER
    puts the odd one at the end, anything else at the start)."""
    return total // 2 if mode == "SAME_UPPER" else total - total // 2


def window_axes(ctx: OpContext, kernel: Sequence[int], *,
                ceil_mode: bool = False) -> list[WindowAxis]:
    """The axes of input 0's spatial dimensions under the node's ``strides``,
    ``dilations``, ``pads`` and ``auto_pad`` (ONNX's output-size rules)."""
    ctx.rank(0, least=3)
    spatial = ctx.shape(0)[2:]
    n = len(spatial)
    if len(kernel) != n:
        raise ctx.unsupported(f"kernel_shape {tuple(kernel)} does not match {n} spatial dimensions")
    ctx.ints(kernel, "kernel_shape", n, least=1)
    strides = int_list(ctx, "strides", n, 1, least=1)
    dilations = int_list(ctx, "dilations", n, 1, least=1)
    pads = int_list(ctx, "pads", 2 * n, 0, least=0)
    mode = auto_pad(ctx)
    axes = []
    for i, (size, k, s, d) in enumerate(zip(spatial, kernel, strides, dilations)):
        span = (k - 1) * d + 1
        if mode in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-size // s)
            total = max(0, (out - 1) * s + span - size)
            begin = split_padding(total, mode)
            end = total - begin
        elif mode == "VALID":
            out, begin, end = (size - span) // s + 1, 0, 0
        else:
            begin, end = pads[i], pads[n + i]
            room = size + begin + end - span
            out = (-(-room // s) if ceil_mode else room // s) + 1
            if ceil_mode and (out - 1) * s >= size + begin:
                out -= 1  # the last window must start inside the input or its leading pad
        if out < 1:
            raise ctx.unsupported(f"spatial axis {i} of size {size} is smaller than the "
                                  f"window ({span} with padding {begin}+{end})")
        axes.append(WindowAxis(size, k, s, d, begin, end, out))
    return axes


def _channels(ctx: OpContext, channels: int, per_group: int, groups: int) -> None:
    if groups < 1 or channels != per_group * groups:
        raise ctx.unsupported(f"{channels} input channels do not split into {groups} "
                              f"group(s) of {per_group}")


def check_bias(ctx: OpContext, channels: int) -> None:
    if ctx.has(2) and ctx.shape(2) != (channels,):
        raise ctx.malformed(f"the bias has shape {ctx.shape(2)}; it needs one value for each "
                            f"of the {channels} output channels")


def _group_of(m: str, per_group: int) -> str:
    """The group of output channel ``m`` when each group has ``per_group`` outputs."""
    return m if per_group == 1 else f"({m} / {per_group})"


def kernel_shape(ctx: OpContext) -> list[int]:
    ctx.rank(0, least=3)
    w = ctx.shape(1)
    if len(w) != len(ctx.shape(0)):
        raise ctx.malformed(f"the weights have shape {w}, rank {len(w)}; they need the rank of "
                            f"the input {ctx.shape(0)}")
    kernel = ctx.ints(ctx.attr("kernel_shape") or w[2:], "kernel_shape")
    if tuple(kernel) != tuple(w[2:]):
        raise ctx.unsupported(f"kernel_shape {tuple(kernel)} differs from the weights' {w[2:]}")
    return kernel


def _parameters(ctx: OpContext) -> tuple[list[str], tuple[int, ...]]:
    """A convolution's parameters as the node gives them: ``X``, ``W`` and the bias ``B``
    if any, and the node's inputs they take."""
    params = [tensor_param("X", ctx.types[0]), tensor_param("W", ctx.types[1])]  # type: ignore[arg-type]
    if not ctx.has(2):
        return params, (0, 1)
    return params + [tensor_param("B", ctx.types[2])], (0, 1, 2)  # type: ignore[arg-type]


def _convolution(ctx: OpContext, name: str, product: str, inside: list[str],
                 extents: list[tuple[str, int]], padding: str = "") -> TCKernel:
    """One ``+=!`` of ``product`` over ``extents`` (output ``Y(n, m, o...)``); with the
    node's bias ``B(m)``, the sum goes to a temporary ``T`` and ``Y = T + B(m)`` is a
    pointwise statement of its own, which fusion inlines into the epilogue (bias and
    activation in one pass over the result). ``padding``, if any, is a statement
    writing the temporary ``P`` that ``product`` reads."""
    index = ', '.join(i for i, _ in extents[:len(ctx.shape(0))])
    body = guarded(inside, product, literal(0, ctx.dtype(0)))
    params, inputs = _parameters(ctx)
    temporaries = ["P"] if padding else []
    if ctx.has(2):
        lines = [f"  T({index}) +=! {body}{where(extents)}", f"  Y({index}) = T({index}) + B(m)"]
        temporaries.append("T")
    else:
        lines = [f"  Y({index}) +=! {body}{where(extents)}"]
    lines = ([padding] if padding else []) + lines
    outputs = ", ".join(["Y", *temporaries])
    return TCKernel(f"def {name}({', '.join(params)}) -> ({outputs}) {{\n" + "\n".join(lines)
                    + "\n}\n", inputs)


# products that read each input element of a grouped convolution (its group's outputs
# times its taps over its strides) from which a padded copy of the input beats guarded
# reads. ResNeXt-50 on two threads: its 16 x 9 ran 313 -> 117 us with the copy, 32 x 9 / 4
# 284 -> 153, 4 x 9 (ONNX's layout) 417 -> 113; 8 x 9 / 4 ran 391 -> 550 (benchmarks/LOG.md)
GROUPED_PAD_READS = 32
ALIAS_BYTES = 2048   # pixels a multiple of this apart share L1 sets (64 sets of 64 bytes)


def channel_pitch(channels: int, axes: Sequence[WindowAxis], itemsize: int) -> int:
    """The elements between two pixels of a channels-last padded copy: ``channels``, or
    one cache line more where neighbouring outputs' windows read pixels a multiple of
    :data:`ALIAS_BYTES` apart (``stride`` pixels). A register block's rows then read
    their windows' lines from a few L1 sets, which cannot hold them all: 7 jammed
    outputs of a 3x3 window over 3 rows read 27 lines, which 512 channels put in 2 sets
    (16 lines on an 8-way L1, 24 on a 12-way one). The pitch spreads them over more
    sets (measurements in benchmarks/LOG.md)."""
    if axes and (axes[-1].stride * channels * itemsize) % ALIAS_BYTES == 0:
        return channels + 64 // itemsize
    return channels


def pad_input(ctx: OpContext, axes: list[WindowAxis], channels_last: bool = False,
              source: str = "X", fill: str = "", pitch: int = 0) -> str:
    """A statement copying ``source`` (input 0) into ``P``, padded with ``fill`` (by
    default 0) so that every window reads it in bounds: the convolution's reduction then
    needs no select in its inner loop (faster than guarding each read: benchmarks/LOG.md).
    ``channels_last`` puts the channel index last: ``P(n, h..., c)``, with ``pitch``
    elements per pixel if given (the channels past the input's filled too)."""
    batch, channels = ctx.shape(0)[:2]
    pitch = max(pitch, channels)
    h = [f"h{i}" for i in range(len(axes))]
    read = f"{source}(n, c, {', '.join(affine([(hi, 1)], -a.pad) for hi, a in zip(h, axes))})"
    inside = [cond for hi, a in zip(h, axes) for cond in
              ([f"{hi} >= {a.pad}"] if a.pad > 0 else [])
              + ([f"{hi} < {a.pad + a.size}"] if a.span > a.pad + a.size else [])]
    if pitch > channels:
        inside.append(f"c < {channels}")
    spatial = [(hi, a.span) for hi, a in zip(h, axes)]
    extents = [("n", batch)] + (spatial + [("c", pitch)] if channels_last
                                else [("c", channels)] + spatial)
    return (f"  P({', '.join(i for i, _ in extents)}) = "
            f"{guarded(inside, read, fill or literal(0, ctx.dtype(0)))}{where(extents)}")


@register("Conv")
def _conv(ctx: OpContext) -> TCKernel:
    x, w = ctx.shape(0), ctx.shape(1)
    groups = ctx.ints(ctx.attr("group", 1), "group", 1, least=1)[0]
    axes, first = live_taps(window_axes(ctx, kernel_shape(ctx)))
    m_out, c_group = w[0], w[1]
    _channels(ctx, x[1], c_group, groups)
    check_bias(ctx, m_out)
    if m_out % groups:
        raise ctx.unsupported(f"{m_out} output channels do not split into {groups} groups")
    o = [f"o{i}" for i in range(len(axes))]
    k = [f"k{i}" for i in range(len(axes))]
    taps = [f"{ki} + {f}" if f else ki for ki, f in zip(k, first)]   # W's kernel positions
    weights = live_weights(ctx.values[1], axes, first) if ctx.values[1] is not None else None
    # input channel: the first of output channel m's group, plus c
    if groups == 1:
        xc = "c"
    else:
        g = _group_of("m", m_out // groups)
        xc = f"{g} * {c_group} + c" if c_group > 1 else g
    padding, source = "", "X"
    if weights is not None and (ctx.attr(CHANNELS_LAST) or
                                channels_last_pays(axes, c_group * math.prod(weights.shape[2:]))):
        if groups == 1:
            return _conv_channels_last(ctx, axes, weights)
        if groups == m_out == x[1]:
            return _depthwise_channels_last(ctx, axes, weights)
        if grouped_channels_last(groups, w):
            return _grouped_channels_last(ctx, axes, groups, weights)
    if 1 < groups < m_out and c_group > 1 and not ctx.attr(CHANNELS_LAST) \
            and _pads_grouped(m_out // groups, axes):
        return _grouped(ctx, axes, groups, taps)
    if (groups == 1 or m_out == groups) and any(a.inside("o", "k") for a in axes):
        # (isl's scheduler can take minutes over the dependences of P through the
        # quasi-affine channel m / per_group, so those convolutions keep the select)
        padding, source = pad_input(ctx, axes), "P"
        axes = [a.padded() for a in axes]
    read = f"{source}(n, {xc}, {', '.join(a.position(oi, ki) for a, oi, ki in zip(axes, o, k))})"
    inside = [cond for a, oi, ki in zip(axes, o, k) for cond in a.inside(oi, ki)]
    extents = ([("n", x[0]), ("m", m_out)] + [(oi, a.out) for oi, a in zip(o, axes)]
               + [("c", c_group)] + [(ki, a.kernel) for ki, a in zip(k, axes)])
    return _convolution(ctx, "conv", f"{read} * W(m, c, {', '.join(taps)})", inside, extents,
                        padding)


def _pads_grouped(per_group: int, axes: list[WindowAxis]) -> bool:
    """Whether a grouped convolution with ``per_group`` outputs per group reads a padded
    copy of its input: where a window can land in the padding and each input element
    is read by at least :data:`GROUPED_PAD_READS` products (the group's outputs times
    the window's taps over the strides). With fewer, the copy's pass over the input
    costs more than the selects it saves."""
    reads = per_group * math.prod(a.kernel for a in axes) / math.prod(a.stride for a in axes)
    return any(a.inside("o", "k") for a in axes) and reads >= GROUPED_PAD_READS


def _grouped(ctx: OpContext, axes: list[WindowAxis], groups: int, taps: list[str]) -> TCKernel:
    """Grouped Conv in ONNX's layout (groups too narrow to vectorize over their channels,
    :func:`~polyfuse.lowering.layout.grouped_channels_last`) over a padded copy ``P``
    of the input: ``T(n, g, j, o...) +=! P(n, g * CG + c, ...) * W(g * MG + j, c, k...)``,
    the group ``g`` and its output channel ``j`` indices of their own, so the channel
    that each product reads is affine (``m / MG`` would make it quasi-affine, whose
    dependences through ``P`` isl's scheduler takes minutes over), then
    ``Y(n, m, o...) = T(n, m / MG, m % MG, o...)`` with the bias. ResNeXt-50's 4-wide
    groups: 417 -> 113 us against the guarded sum (benchmarks/LOG.md)."""
    x, w = ctx.shape(0), ctx.shape(1)
    per_group, depth = w[0] // groups, w[1]
    o, k = window_names(len(axes))
    padding = pad_input(ctx, axes)
    axes = [a.padded() for a in axes]
    window = ", ".join(a.position(oi, ki) for a, oi, ki in zip(axes, o, k))
    product = f"P(n, g * {depth} + c, {window}) * W(g * {per_group} + j, c, {', '.join(taps)})"
    outs = [(oi, a.out) for oi, a in zip(o, axes)]
    extents = ([("n", x[0]), ("g", groups), ("j", per_group)] + outs
               + [("c", depth)] + [(ki, a.kernel) for ki, a in zip(k, axes)])
    params, inputs = _parameters(ctx)
    bias = " + B(m)" if ctx.has(2) else ""
    lines = [padding, f"  T(n, g, j, {', '.join(o)}) +=! {product}{where(extents)}",
             f"  Y(n, m, {', '.join(o)}) = T(n, m / {per_group}, m % {per_group}, {', '.join(o)}){bias}"
             f"{where([('n', x[0]), ('m', w[0])] + outs)}"]
    return TCKernel(f"def grouped_conv({', '.join(params)}) -> (Y, P, T) {{\n" + "\n".join(lines)
                    + "\n}\n", inputs)


def channels_last_pays(axes: list[WindowAxis], depth: int) -> bool:
    """Whether accumulating channels-last beats ONNX's layout: when output rows are too
    narrow to fill vectors (7, 14, 28) or strided (their vectors would be gathered), or
    when the reduction is deep enough that the extra pass transposing the result costs
    little beside it."""
    return not axes or axes[-1].out < CHANNELS_LAST_ROWS or axes[-1].stride > 1 or \
        depth >= CHANNELS_LAST_DEPTH


def _window_read(ctx: OpContext, axes: list[WindowAxis], channel: str,
                padded: bool) -> tuple[str, str, list[WindowAxis]]:
    """How a channels-last kernel's window reads input channel ``channel`` at ``o + k``:
    the statement writing a padded copy ``P`` of the input where ``padded`` and a window
    can land in the padding or the input's pixels alias in L1 (:func:`channel_pitch`;
    wav2vec2's feature extractor, 512 channels at stride 2 and no padding: its second
    conv 9.2 -> 5.5 ms; benchmarks/LOG.md), else none (the read is of ``X``, which the
    caller guards); the read; and the axes it reads them along (padded where the copy
    is). The copy keeps the layout X is stored in (channels-last once the layout pass
    converted the node), so copying it is no transpose."""
    o, k = window_names(len(axes))
    stored_last = bool(ctx.attr(CHANNELS_LAST))
    channels = ctx.shape(0)[1]
    pitch = channel_pitch(channels, axes, ctx.dtype(0).bits // 8) if stored_last else 0
    # pixels that share L1 sets, each read by several taps of a window (a window of
    # more than one tap, none narrower than its stride): the copy at a wider pitch pays
    # even where no window reaches the padding (a 1x1 convolution reads each pixel once)
    aliased = pitch > channels and all(a.kernel >= a.stride for a in axes) and any(a.kernel > 1 for a in axes)
    if not (padded and (aliased or any(a.inside("o", "k") for a in axes))):
        return "", f"X(n, {channel}, {', '.join(a.position(oi, ki) for a, oi, ki in zip(axes, o, k))})", axes
    padding = pad_input(ctx, axes, channels_last=stored_last, pitch=pitch)
    axes = [a.padded() for a in axes]
    window = ", ".join(a.position(oi, ki) for a, oi, ki in zip(axes, o, k))
    return padding, f"P(n, {window}, {channel})" if stored_last else f"P(n, {channel}, {window})", axes


def _conv_channels_last(ctx: OpContext, axes: list[WindowAxis], weights: np.ndarray) -> TCKernel:
    """Conv with constant weights, accumulated channels-last: ``T(n, o..., m)`` sums
    ``X * Wt(c, k..., m)`` over weights repacked at compile time so that output channels
    are contiguous, which the default schedule vectorizes (every conv of a CNN has a
    multiple of 16 output channels, while its maps are often 7, 14 or 28 wide). Six to
    eight jammed output columns then share each vector of weights (benchmarks/LOG.md)."""
    w = ctx.shape(1)
    k = window_names(len(axes))[1]
    padding, read, axes = _window_read(ctx, axes, "c", padded=True)
    packed = np.ascontiguousarray(weights.transpose(*range(1, len(w)), 0))
    return channels_last_kernel(ctx, axes, "conv", padding, f"{read} * Wt(c, {', '.join(k)}, m)",
                                [("c", w[1])], packed)


def _depthwise_channels_last(ctx: OpContext, axes: list[WindowAxis], weights: np.ndarray) -> TCKernel:
    """Depthwise Conv (one filter per channel) with constant weights, channels-last:
    ``T(n, o..., m)`` sums ``X * Wt(k..., m)`` with channels contiguous in every operand
    (vector loads, no broadcasts). Reads that can land in the padding are guarded where
    they are made, with no padded copy of the input: a 3x3 or 5x5 window does so little
    work per element read that the copy's extra pass over memory costs more than the
    guards (a 56x56 map of 144 channels: 0.50 -> 0.41 ms with a SiLU). A window of more
    taps (ConvNeXt's 7x7) reads a padded copy where :func:`_pads_grouped` says it pays
    (ConvNeXt-T's depthwise convolutions 4.9 -> 2.0 ms; benchmarks/LOG.md)."""
    o, k = window_names(len(axes))
    padding, read, axes = _window_read(ctx, axes, "m", _pads_grouped(1, axes))
    inside = [cond for a, oi, ki in zip(axes, o, k) for cond in a.inside(oi, ki)]
    weights = weights[:, 0]
    packed = np.ascontiguousarray(weights.transpose(*range(1, weights.ndim), 0))
    product = guarded(inside, f"{read} * Wt({', '.join(k)}, m)", literal(0, ctx.dtype(0)))
    return channels_last_kernel(ctx, axes, "depthwise_conv", padding, product, [], packed)


def _grouped_channels_last(ctx: OpContext, axes: list[WindowAxis], groups: int,
                           weights: np.ndarray) -> TCKernel:
    """Grouped Conv with constant weights (groups of at least ``GROUPED_VECTOR`` output
    channels: RegNet's, ResNeXt's wider stages), channels-last:
    ``T(n, o..., g, j) +=! X(n, g * CG + c, ...) * Wt(g, c, k..., j)``: output channel
    ``j`` of group ``g`` contiguous in the sum and in the weights (vectors over the
    group's outputs, each input element a broadcast), then ``Y(n, g * MG + j, o...)`` read
    back in channel order. The window reads a padded copy of the input (``P``, as a
    dense convolution's, so the sum's inner loop has no select) where
    :func:`_pads_grouped` says it pays; else reads that can land in the padding are
    guarded where they are made, as the depthwise kernel's."""
    w = ctx.shape(1)
    per_group, depth = w[0] // groups, w[1]
    o, k = window_names(len(axes))
    padding, read, axes = _window_read(ctx, axes, f"g * {depth} + c", _pads_grouped(per_group, axes))
    inside = [cond for a, oi, ki in zip(axes, o, k) for cond in a.inside(oi, ki)]
    grouped = weights.reshape(groups, per_group, *weights.shape[1:])
    packed = np.ascontiguousarray(grouped.transpose(0, *range(2, grouped.ndim), 1))
    product = guarded(inside, f"{read} * Wt(g, c, {', '.join(k)}, j)", literal(0, ctx.dtype(0)))
    return channels_last_kernel(ctx, axes, "grouped_conv", padding, product, [("c", depth)], packed,
                                channels=[("g", groups), ("j", per_group)],
                                channel=f"m / {per_group}, m % {per_group}")


def window_names(n: int) -> tuple[list[str], list[str]]:
    return [f"o{i}" for i in range(n)], [f"k{i}" for i in range(n)]


def channels_last_kernel(ctx: OpContext, axes: list[WindowAxis], name: str, padding: str,
                         product: str, summed: list[tuple[str, int]], packed: np.ndarray,
                         channels: list[tuple[str, int]] | None = None, channel: str = "m") -> TCKernel:
    """The kernel of a channels-last convolution: ``padding`` (a statement writing ``P``,
    or none), ``T(n, o..., m) +=! product`` over ``summed`` and the window, then ``Y`` in
    ONNX's layout with the bias added. Parameters: X, the bias B if any, then the
    repacked weights Wt (a compile-time constant). ``channels``: T's last indices in
    place of ``m`` (a group and its channel), which ``channel`` gives for output channel
    ``m``."""
    x, m_out = ctx.shape(0), ctx.shape(1)[0]
    o, k = window_names(len(axes))
    outs = [(oi, a.out) for oi, a in zip(o, axes)]
    channels = channels or [("m", m_out)]
    extents = ([("n", x[0])] + outs + channels + summed
               + [(ki, a.kernel) for ki, a in zip(k, axes)])
    params = [tensor_param("X", ctx.types[0]),  # type: ignore[arg-type]
              tensor_param("Wt", (DType.from_numpy(packed.dtype), packed.shape))]
    bias, inputs = "", (0,)
    if ctx.has(2):
        params.insert(1, tensor_param("B", ctx.types[2]))  # type: ignore[arg-type]
        bias, inputs = " + B(m)", (0, 2)
    lines = ([padding] if padding else []) + [
        f"  T(n, {', '.join(o)}, {', '.join(c for c, _ in channels)}) +=! {product}{where(extents)}",
        f"  Y(n, m, {', '.join(o)}) = T(n, {', '.join(o)}, {channel}){bias}"
        f"{where([('n', x[0]), ('m', m_out)] + outs)}"]
    outputs = "Y, P, T" if padding else "Y, T"
    return TCKernel(f"def {name}({', '.join(params)}) -> ({outputs}) {{\n" + "\n".join(lines)
                    + "\n}\n", inputs, constants=(packed,))


@dataclass(frozen=True)
class TransposedAxis:
    """One spatial axis of ConvTranspose: output position ``o`` and kernel position ``k``
    take input position ``i`` with ``i * stride + k * dilation - pad == o``."""

    size: int
    kernel: int
    stride: int
    dilation: int
    pad: int
    out: int

    def numerator(self, o: str, k: str) -> str:
        return affine([(o, 1), (k, -self.dilation)], self.pad)

    def position(self, o: str, k: str) -> str:
        num = self.numerator(o, k)
        return num if self.stride == 1 else f"({num}) / {self.stride}"

    def inside(self, o: str, k: str) -> list[str]:
        num = self.numerator(o, k)
        lowest = self.pad - (self.kernel - 1) * self.dilation
        highest = self.out - 1 + self.pad
        last = (self.size - 1) * self.stride
        return ([f"({num}) % {self.stride} == 0"] if self.stride > 1 else []) + \
               ([f"{num} >= 0"] if lowest < 0 else []) + \
               ([f"{num} <= {last}"] if highest > last else [])


def transposed_axes(ctx: OpContext, kernel: Sequence[int]) -> list[TransposedAxis]:
    """ConvTranspose's output sizes and leading pads (``output_shape`` wins over ``pads``)."""
    spatial = ctx.shape(0)[2:]
    n = len(spatial)
    strides = int_list(ctx, "strides", n, 1, least=1)
    dilations = int_list(ctx, "dilations", n, 1, least=1)
    pads = int_list(ctx, "pads", 2 * n, 0, least=0)
    extra = int_list(ctx, "output_padding", n, 0, least=0)
    mode = auto_pad(ctx)
    shape = ctx.attr("output_shape")
    axes = []
    for i, (size, k, s, d) in enumerate(zip(spatial, kernel, strides, dilations)):
        full = s * (size - 1) + extra[i] + (k - 1) * d + 1
        if shape is not None and len(shape) > 0:
            out = int(shape[len(shape) - n + i])
            begin = split_padding(full - out, mode)
        elif mode in ("SAME_UPPER", "SAME_LOWER"):
            out = size * s
            begin = split_padding(full - out, mode)
        else:
            begin = 0 if mode == "VALID" else pads[i]
            out = full - begin - (0 if mode == "VALID" else pads[n + i])
        if out < 1:
            raise ctx.unsupported(f"spatial axis {i} has output size {out}")
        axes.append(TransposedAxis(size, k, s, d, begin, out))
    return axes


@register("ConvTranspose")
def _conv_transpose(ctx: OpContext) -> TCKernel:
    x, w = ctx.shape(0), ctx.shape(1)
    groups = ctx.ints(ctx.attr("group", 1), "group", 1, least=1)[0]
    axes = transposed_axes(ctx, kernel_shape(ctx))
    c_group, m_group = x[1] // groups, w[1]
    _channels(ctx, x[1], c_group, groups)
    check_bias(ctx, m_group * groups)
    if w[0] != x[1]:
        raise ctx.unsupported(f"weights of shape {w} do not match {x[1]} input channels")
    o = [f"o{i}" for i in range(len(axes))]
    k = [f"k{i}" for i in range(len(axes))]
    # output channel m is channel m % m_group of group m / m_group, whose inputs start at
    # (m / m_group) * c_group
    if groups == 1:
        xc, wm = "c", "m"
    else:
        g = _group_of("m", m_group)
        xc = f"{g} * {c_group} + c" if c_group > 1 else g
        wm = "0" if m_group == 1 else f"m % {m_group}"
    summed = [("c", c_group)] if groups == 1 or c_group > 1 else []
    read = f"X(n, {xc}, {', '.join(a.position(oi, ki) for a, oi, ki in zip(axes, o, k))})"
    inside = [cond for a, oi, ki in zip(axes, o, k) for cond in a.inside(oi, ki)]
    extents = ([("n", x[0]), ("m", m_group * groups)] + [(oi, a.out) for oi, a in zip(o, axes)]
               + summed + [(ki, a.kernel) for ki, a in zip(k, axes)])
    return _convolution(ctx, "conv_transpose", f"{read} * W({xc}, {wm}, {', '.join(k)})",
                        inside, extents)
