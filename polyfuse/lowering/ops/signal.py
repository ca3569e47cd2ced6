"""Signal processing: DFT and STFT, the window functions and MelWeightMatrix.

Complex tensors are real ones with a trailing dimension of 2 (real, imaginary); a
trailing 1 is a real signal. A transform of length ``N`` is a contraction with a
table ``T(k, co, n, ci)``: output bin ``k``, component ``co``, reading sample ``n``,
component ``ci``. The table holds the cosines and sines of ``2 pi (k n mod N) / N``,
computed at compile time in float64 (the reduced angle keeps them exact to the last
bit), and the sums run in float64, so a float32 transform meets the tolerances of a
reference FFT. Zero padding to ``dft_length`` is a shorter reduction; truncation
reads fewer samples. The windows and the mel matrix are kernels of their own, folded
at compile time when their inputs are constants.
"""

from __future__ import annotations

import math

import numpy as np

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import (INDEX, OpContext, TCKernel, access, literal, register,
                                   tensor_param)
from polyfuse.lowering.ops.movement import definition, parameter, statement

F64 = DType.FLOAT64


def _table(n: int, rows: int, cols: int, ci: int, co: int, *, inverse: bool,
           hermitian: bool) -> np.ndarray:
    """``T(row, co, col, ci)`` of a transform of length ``n``. ``hermitian``: the columns
    are the first bins of a one-sided spectrum and the output is the real inverse."""
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    angle = 2 * np.pi * ((r * c) % n) / n
    cos, sin = np.cos(angle), np.sin(angle) * (1 if inverse else -1)
    if hermitian:  # bins 1..n/2-1 stand for their mirror too; the imaginary parts of
        edge = (c == 0) | (2 * c == n)  # bin 0 and the Nyquist bin are ignored
        cos = cos * np.where(edge, 1, 2)
        sin = sin * np.where(edge, 0, 2)
    if inverse:
        cos, sin = cos / n, sin / n
    table = np.zeros((rows, co, cols, ci))
    for o in range(co):
        for i in range(ci):
            table[:, o, :, i] = cos if o == i else -sin if o == 0 else sin
    return table


def _float_input(ctx: OpContext, i: int) -> DType:
    dt = ctx.dtype(i)
    if not dt.is_float:
        raise ctx.unsupported(f"a {dt} signal; polyfuse transforms floating-point ones")
    return dt


def _contraction(dt: DType, out: list[int], read: str, reduce: list[str]) -> tuple[list[str], list[str]]:
    """(temporaries, statements) summing ``read`` (a float64 product) into ``Y`` in float64."""
    y = INDEX[:len(out)]
    if dt is F64:
        return [], [statement("Y", y, read, out, reduce, "+=!")]
    return [tensor_param("A", (F64, out))], [statement("A", y, read, out, reduce, "+=!"),
                                             statement("Y", y, f"{dt}({access('A', y)})", out)]


def _scalar(ctx: OpContext, i: int, what: str) -> int:
    value = ctx.const(i, what)
    if value.size != 1:
        raise ctx.malformed(f"{what} (input {i}) must be a scalar, got shape {value.shape}")
    return ctx.ints(value, what)[0]


@register("DFT")
def _dft(ctx: OpContext) -> TCKernel:
    shape = ctx.shape(0)
    rank = ctx.rank(0, least=2)
    dt = _float_input(ctx, 0)
    ci = shape[-1]
    if ci not in (1, 2):
        raise ctx.malformed(f"input shape {shape} must end in 1 (real) or 2 (complex)")
    if ctx.opset >= 20:
        axis = _scalar(ctx, 2, "axis") if ctx.has(2) else -2
    else:
        axis = int(ctx.attr("axis", 1))
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise ctx.malformed(f"axis {axis} must name a signal axis of shape {shape}: in "
                            f"[{-rank}, -2] or [0, {rank - 2}]")
    axis %= rank
    inverse, onesided = ctx.flag("inverse", 0), ctx.flag("onesided", 0)
    hermitian = inverse and onesided
    given = ctx.has(1) and math.prod(ctx.shape(1)) > 0
    n = _scalar(ctx, 1, "dft_length") if given else \
        2 * (shape[axis] - 1) if hermitian else shape[axis]
    if n < 1:
        raise ctx.malformed(f"dft_length {n} must be >= 1")
    co = 1 if hermitian else 2
    bins = n // 2 + 1 if onesided and not inverse else n
    cols = min(shape[axis], n // 2 + 1 if hermitian else n)
    table = _table(n, bins, cols, ci, co, inverse=inverse, hermitian=hermitian)
    out = list(shape)
    out[axis], out[-1] = bins, co
    y = list(INDEX[:rank])
    src = list(y)
    src[axis], src[-1] = "n", "c"
    read = f"float64({access('X', src)}) * {access('T', [y[axis], y[-1], 'n', 'c'])}"
    temps, lines = _contraction(dt, out, read, [f"n in 0:{cols}", f"c in 0:{ci}"])
    params = [parameter(ctx, 0, "X"), tensor_param("T", (F64, table.shape))]
    return TCKernel(definition(params, [tensor_param("Y", (dt, out))] + temps, lines), (0,),
                    constants=(table,))


@register("STFT")
def _stft(ctx: OpContext) -> TCKernel:
    shape = ctx.shape(0)
    ctx.rank(0, 3)
    dt = _float_input(ctx, 0)
    batch, length, ci = shape
    if ci not in (1, 2):
        raise ctx.malformed(f"signal shape {shape} must end in 1 (real) or 2 (complex)")
    step = _scalar(ctx, 1, "frame_step")
    window = ctx.has(2) and math.prod(ctx.shape(2)) > 0
    if window:
        ctx.rank(2, 1)
    size = ctx.shape(2)[0] if window else None
    if ctx.has(3):
        given = _scalar(ctx, 3, "frame_length")
        if size is not None and given != size:
            raise ctx.malformed(f"frame_length {given} and a window of {size} values disagree")
        size = given
    size = length if size is None else size
    if step < 1 or not 1 <= size <= length:
        raise ctx.malformed(f"frame_step {step} must be >= 1 and the frame length {size} "
                            f"in [1, {length}] (the signal's length)")
    onesided = ctx.flag("onesided", 1)
    frames, bins = 1 + (length - size) // step, size // 2 + 1 if onesided else size
    table = _table(size, bins, size, ci, 2, inverse=False, hermitian=False)
    out = [batch, frames, bins, 2]
    y = INDEX[:4]
    read = (f"float64(X({y[0]}, {step} * {y[1]} + n, c)) * "
            f"{'float64(W(n)) * ' if window else ''}T({y[2]}, {y[3]}, n, c)")
    temps, lines = _contraction(dt, out, read, [f"n in 0:{size}", f"c in 0:{ci}"])
    params = [parameter(ctx, 0, "X")] + ([parameter(ctx, 2, "W")] if window else []) + \
        [tensor_param("T", (F64, table.shape))]
    return TCKernel(definition(params, [tensor_param("Y", (dt, out))] + temps, lines),
                    (0, 2) if window else (0,), constants=(table,))


def _f64(value: float) -> str:
    return literal(value, F64)


# the window w(n) in terms of t = 2 pi n / N (N the size, or size - 1 if symmetric)
_WINDOWS = {
    "HannWindow": "0.5 - 0.5 * cos(t)",
    "HammingWindow": f"{_f64(25 / 46)} - {_f64(21 / 46)} * cos(t)",
    "BlackmanWindow": "0.42 - 0.5 * cos(t) + 0.08 * cos(2.0 * t)",
}


@register(*_WINDOWS)
def _window(ctx: OpContext) -> TCKernel:
    size = _scalar(ctx, 0, "size")
    if size < 0:
        raise ctx.malformed(f"size {size} must be >= 0")
    dt = ctx.element_type("output_datatype") or DType.FLOAT32
    period = size if ctx.flag("periodic", 1) else size - 1
    # a symmetric window of one value divides 0 by 0, as the reference does
    lets = [f"t = float64(n) * {_f64(2 * math.pi)} / {_f64(period)}"]
    line = statement("Y", ["n"], f"{dt}({_WINDOWS[ctx.node.op]})", [size], lets)
    return TCKernel(definition([], [tensor_param("Y", (dt, [size]))], [line]), ())


@register("MelWeightMatrix")
def _mel_weight_matrix(ctx: OpContext) -> TCKernel:
    mels, length = _scalar(ctx, 0, "num_mel_bins"), _scalar(ctx, 1, "dft_length")
    if mels < 1 or length < 1:
        raise ctx.malformed(f"num_mel_bins {mels} and dft_length {length} must be >= 1")
    for i in (2, 3, 4):
        ctx.rank(i, 0, 1)
    dt = ctx.element_type("output_datatype") or DType.FLOAT32
    ft = ctx.dtype(3)
    log10 = _f64(math.log(10))

    def mel(name: str) -> str:  # the reference's mel scale: log1p in the input's type
        return f"float64({ft}(2595.0) * log1p({name} / {ft}(700.0))) / {log10}"

    lo, hi, rate = (f"{name}({'0' if ctx.shape(i) else ''})"
                    for i, name in ((3, "L"), (4, "H"), (2, "R")))
    edges = [f"lo = {mel(lo)}", f"step = ({mel(hi)} - lo) / {_f64(mels + 2)}",
             f"hz = 700.0 * expm1((float64(b) * step + lo) / 2595.0 * {log10})"]
    bins = [length // 2 + 1, mels]
    # the triangle of mel bin i over spectrogram bin j: rising on [l, c], falling on (c, h)
    lets = ["l = E(i)", "c = E(i + 1)", "h = E(i + 2)"]
    rise = "j >= l && j <= c && c > l ? float64(j - l) / float64(c - l) : " \
           "j == c && c == l ? 1.0 : 0.0"
    value = f"h > c && j >= c && j < h ? float64(h - j) / float64(h - c) : {rise}"
    lines = [statement("E", ["b"], f"int64(floor({_f64(length + 1)} * hz / float64({rate})))",
                       [mels + 2], edges),
             statement("Y", ["j", "i"], f"{dt}({value})", bins, lets)]
    params = [parameter(ctx, 2, "R"), parameter(ctx, 3, "L"), parameter(ctx, 4, "H")]
    outputs = [tensor_param("Y", (dt, bins)), tensor_param("E", (DType.INT64, [mels + 2]))]
    return TCKernel(definition(params, outputs, lines), (2, 3, 4))
