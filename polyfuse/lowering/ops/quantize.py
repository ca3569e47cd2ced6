"""The quantization ops: QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear, and
the integer products MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv.

Integer arithmetic is exact: zero points are subtracted and products summed in int32.
A float becomes an integer as ONNX's reference makes one: rounded half to even
(``rint``), the zero point added, then clamped to the type's range while still a float
(a cast of a float outside the range would wrap). The narrow types (int4, uint4, int2,
uint2, float8, float4 e2m1) are held in their storage types (see
:mod:`polyfuse.ir.types`): int4 and int2 quantize like int8 to their own range; a float
type rounds ``x / scale`` to its values (:mod:`.narrow`), with no zero point (ONNX asks
it to be 0 for float8; float4 adds it first, as the reference does). Requantization multiplies the int32
sum by the factor ``scale_a * scale_b / scale_y`` (rounded to the scales' type) in
float64, where that product is exact, so only ``rint`` rounds it.

Every kernel names node input ``i`` ``I<i>``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import ml_dtypes
import numpy as np

from polyfuse.ir.types import DType, promote
from polyfuse.lowering.ops import (INDEX, OpContext, TCKernel, access, holding, literal, register,
                                   tensor_param)
from polyfuse.lowering.layout import CHANNELS_LAST
from polyfuse.lowering.ops.conv import (WindowAxis, affine, guarded, pad_input, where, window_axes,
                                        window_names)
from polyfuse.lowering.ops.linalg import Product, matmul_product
from polyfuse.lowering.ops.narrow import narrowed
from polyfuse.lowering.ops.words import packed_word, weight_words

QUANTIZED = (DType.UINT8, DType.INT8, DType.UINT16, DType.INT16, DType.UINT4, DType.INT4,
             DType.UINT2, DType.INT2, DType.FLOAT8E4M3FN, DType.FLOAT8E4M3FNUZ, DType.FLOAT8E5M2,
             DType.FLOAT8E5M2FNUZ, DType.FLOAT4E2M1)


Declared = tuple[str, DType, Sequence[int]]   # a TC output: name, type, shape


def _kernel(ctx: OpContext, lines: Sequence[str], outputs: Sequence[Declared], count: int = 1,
            constants: Sequence[tuple[str, np.ndarray]] = (), unread: Sequence[int] = ()) -> TCKernel:
    """A TC def reading every given node input but those ``unread`` as ``I<i>``, then the
    ``constants`` (arrays made at compile time) as named; the first ``count`` of
    ``outputs`` are the node's outputs, the rest temporaries."""
    inputs = tuple(i for i in range(len(ctx.types)) if ctx.has(i) and i not in unread)
    params = ", ".join([*(tensor_param(f"I{i}", ctx.type(i)) for i in inputs),
                        *(tensor_param(name, (DType.from_numpy(a.dtype), a.shape))
                          for name, a in constants)])
    decls = ", ".join(tensor_param(name, (dt, shape)) for name, dt, shape in outputs)
    body = "".join(f"  {line}\n" for line in lines)
    return TCKernel(f"def k({params}) -> ({decls}) {{\n{body}}}\n", inputs, tuple(range(count)),
                    constants=tuple(a for _, a in constants))


def _saturated(value: str, dt: DType, f: DType) -> str:
    """``value`` (a float of type ``f``, already whole) clamped to ``dt``'s range, then cast
    (to its storage type)."""
    info = ml_dtypes.iinfo(dt.numpy)
    return f"{dt.storage}(min(max({value}, {literal(int(info.min), f)}), {literal(int(info.max), f)}))"


def _requantized(acc: str, factor: str, zero: str, dt: DType) -> str:
    """The int32 sum ``acc`` in the output's quantization: ``acc * factor + zero``, saturated."""
    return _saturated(f"rint(float64({acc}) * float64({factor})) + float64({zero})", dt,
                      DType.FLOAT64)


def _shifted(read: str, zero: str) -> str:
    """An integer read as int32, less its zero point (if any)."""
    return f"(int32({read}) - int32({zero}))" if zero else f"int32({read})"


def _nonzero(ctx: OpContext, i: int, read: str) -> str:
    """``read`` (how zero point input ``i`` is read), or nothing when it is a constant 0
    (symmetric int8 weights): no subtraction in the product's inner loop."""
    value = ctx.values[i] if ctx.has(i) else None
    return "" if value is not None and not np.any(value) else read


def _one_or_each(ctx: OpContext, i: int, what: str, index: str, count: int, per: str) -> str:
    """How input ``i`` is read: its one value, or (a vector of ``count``) the one at
    ``index``; nothing if the input is omitted."""
    if not ctx.has(i):
        return ""
    shape = ctx.shape(i)
    if math.prod(shape) == 1:
        return access(f"I{i}", ["0"] * len(shape))
    if shape == (count,):
        return access(f"I{i}", [index])
    raise ctx.malformed(f"the {what} (input {i}) has shape {shape}; it must hold one value or "
                        f"{count}, one per {per}")


# --- QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear ----------------------------------

def _per_element(ctx: OpContext, i: int) -> str:
    """How the scale or zero point input ``i`` is read at element ``INDEX`` of input 0: one
    value for all, one per index along ``axis`` (a vector), or one per ``block_size``
    indices along it (a tensor of input 0's rank)."""
    x, s = ctx.shape(0), ctx.shape(i)
    block = ctx.ints(ctx.attr("block_size", 0), "block_size", 1, least=0)[0]
    if math.prod(s) == 1 and (not block or len(s) <= 1):
        return access(f"I{i}", ["0"] * len(s))
    axis = ctx.axis(ctx.attr("axis", 1), len(x))
    if not block and s == (x[axis],):
        return access(f"I{i}", [INDEX[axis]])
    blocks = x[:axis] + (-(-x[axis] // block),) + x[axis + 1:] if block else None
    if s == blocks:
        return access(f"I{i}", [f"{INDEX[d]} / {block}" if d == axis else INDEX[d]
                                for d in range(len(x))])
    want = (f"{blocks} (blocks of {block} along axis {axis})" if block else
            f"() or ({x[axis]},) (one per index along axis {axis})")
    raise ctx.malformed(f"input {i} has shape {s}; for an input of shape {x} it must be {want}")


def _elementwise(ctx: OpContext, expr: str, dt: DType, more: dict[str, str] | None = None) -> TCKernel:
    """``expr`` of ``x``, ``s`` and (if given) ``z``, inputs 0, 1, 2, at every element of x
    (and of the names ``more`` binds to expressions of those)."""
    shape = ctx.shape(0)
    index = INDEX[:len(shape)]
    lets = [f"{d} in 0:{n}" for d, n in zip(index, shape)] + [f"x = {access('I0', index)}"]
    lets += [f"{name} = {_per_element(ctx, i)}" for i, name in ((1, "s"), (2, "z")) if ctx.has(i)]
    lets += [f"{name} = {e}" for name, e in (more or {}).items()]
    return _kernel(ctx, [f"{access('Y', index)} = {expr} where {', '.join(lets)}"],
                   [("Y", dt.storage, shape)])


def _quantized_type(ctx: OpContext) -> DType:
    """The zero point's type, else ``output_dtype``, else uint8."""
    wanted = ctx.element_type("output_dtype")
    dt = ctx.element(2) if ctx.has(2) else wanted or DType.UINT8
    if wanted is not None and wanted is not dt:
        raise ctx.malformed(f"output_dtype {wanted} differs from the zero point's type {dt}")
    if dt not in QUANTIZED:
        raise ctx.unsupported(f"quantizing to {dt}; polyfuse quantizes to "
                              f"{', '.join(map(str, QUANTIZED))}")
    return dt


@register("QuantizeLinear")
def _quantize_linear(ctx: OpContext) -> TCKernel:
    """``saturate(rint(x / scale) + zero_point)``, x / scale rounded to ``precision`` (by
    default the type of x and the scale together); to a float type, x / scale rounded to
    it (saturating unless ``saturate`` is 0)."""
    dt = _quantized_type(ctx)
    p = ctx.element_type("precision") or promote(ctx.dtype(0), ctx.dtype(1))
    p = p if p.is_float else DType.FLOAT32
    f = p.compute
    q = f"{f}(x) / {f}(s)" if p is f else f"{f}({p}({f}(x) / {f}(s)))"
    if dt.is_float:
        zero = f" + {f}(z)" if ctx.has(2) and dt is DType.FLOAT4E2M1 else ""
        expr, lets = narrowed("n_y", f, dt, saturate=ctx.flag("saturate", 1))
        return holding(_elementwise(ctx, expr, dt, {"n_y": q + zero, **lets}), dt)
    zero = f" + {f}(z)" if ctx.has(2) else ""
    return holding(_elementwise(ctx, _saturated(f"rint({q}){zero}", dt, f), dt), dt)


@register("DequantizeLinear")
def _dequantize_linear(ctx: OpContext) -> TCKernel:
    """``(x - zero_point) * scale``, exact up to the product (int32 inputs in float64)."""
    out = ctx.element_type("output_dtype") or ctx.dtype(1)
    if not out.is_float or out.is_narrow:
        raise ctx.malformed(f"output_dtype {out} is not a float type")
    f = DType.FLOAT64 if ctx.element(0).bits > 16 else DType.FLOAT32
    floats = ctx.element(0).is_float
    if floats and ctx.has(2) and ctx.values[2] is not None and np.any(ctx.values[2]):
        raise ctx.malformed(f"the zero point of {ctx.element(0)} values must be 0")
    x = f"({f}(x) - {f}(z))" if ctx.has(2) and not floats else f"{f}(x)"
    return _elementwise(ctx, f"{out}({x} * {f}(s))", out)


@register("DynamicQuantizeLinear")
def _dynamic_quantize_linear(ctx: OpContext) -> TCKernel:
    """uint8 over the range of x widened to hold 0: ``scale = (hi - lo) / 255`` and the
    zero point that 0 maps to, as ONNX's reference computes them in float32."""
    shape = ctx.shape(0)
    index = INDEX[:len(shape)]
    x = access("I0", index)
    ranges = where(list(zip(index, shape)))
    lines = [f"Lo() min=! I0({', '.join(index)}){ranges}",
             f"Hi() max=! I0({', '.join(index)}){ranges}",
             "Lo() = min(Lo(), 0.0)",
             "Hi() = max(Hi(), 0.0)",
             "S() = (Hi() == Lo() ? 1.0 : Hi() - Lo()) / 255.0",
             f"Z() = {_saturated('rint(0.0 - Lo() / S())', DType.UINT8, DType.FLOAT32)}",
             f"{access('Y', index)} = "
             f"{_saturated(f'rint({x} / S()) + float32(Z())', DType.UINT8, DType.FLOAT32)}"
             f"{ranges}"]
    return _kernel(ctx, lines, [("Y", DType.UINT8, shape), ("S", DType.FLOAT32, ()),
                                ("Z", DType.UINT8, ()), ("Lo", DType.FLOAT32, ()),
                                ("Hi", DType.FLOAT32, ())], count=3)


# --- MatMulInteger, QLinearMatMul ---------------------------------------------------------------

@dataclass(frozen=True)
class _Sums:
    """An integer product's int32 sums: the statements computing them, ``total`` (the
    sum at an output element, zero point corrections and bias added), the output's
    indices with their extents, the temporaries, the arrays made at compile time
    (parameters named as given) and the node input no parameter reads (the weights, when
    a repacked copy replaces them)."""

    lines: list[str]
    total: str
    out: list[tuple[str, int]]
    temporaries: list[Declared]
    constants: list[tuple[str, np.ndarray]] = field(default_factory=list)
    unread: tuple[int, ...] = ()


def _integer_matmul(ctx: OpContext, p: Product, za: int, zb: int, columns: int,
                    bias: str = "") -> _Sums:
    """The sums of ``(A - za) * (B - zb)`` (``p``'s inputs; B has ``columns`` columns),
    plus ``bias``: with B a constant matrix and 8-bit A, 4 rows of B at a time
    (:func:`_dot4_matmul`)."""
    a, b = p.inputs
    zb_read = _nonzero(ctx, zb, _one_or_each(ctx, zb, "zero point of B", p.n, columns, "column of B"))
    za_read = _nonzero(ctx, za, _per_row(ctx, za, "zero point of A", p))
    value = ctx.values[b]
    if value is not None and value.ndim == 2 and len(ctx.shape(a)) >= 2 and \
            ctx.element(a) in (DType.UINT8, DType.INT8) and (not zb_read or ctx.values[zb] is not None):
        # B's rows: output columns first, as a convolution's weights
        weights = (value if p.b[-1] == "k" else value.T).astype(np.int32)
        if zb_read:
            weights -= np.asarray(ctx.values[zb], np.int32).reshape(-1, 1)
        if weights.min() >= -128 and weights.max() <= 127:
            return _dot4_matmul(ctx, p, weights, za_read, bias)
    lhs = _shifted(access(f"I{a}", p.a), za_read)
    rhs = _shifted(access(f"I{b}", p.b), zb_read)
    out = list(zip(p.out, p.extents))
    return _Sums([f"{access('T', p.out)} +=! {lhs} * {rhs}{p.where}"],
                 f"{access('T', p.out)}{bias}", out, [("T", DType.INT32, tuple(p.extents))])


def _dot4_matmul(ctx: OpContext, p: Product, weights: np.ndarray, za: str, bias: str) -> _Sums:
    """``T(out) +=! dot4(Ap(..., k4), Wt(k4, n))``: A copied into words of 4 of its
    columns (or read in place where they are whole words), the constant ``weights`` (one
    row per output column, less B's zero points) as words (:func:`weight_words`), A's
    zero point corrected outside the sum as a convolution's is (:func:`_channels_last_sums`)."""
    a = p.inputs[0]
    shape, depth = ctx.shape(a), weights.shape[1]
    zero = _unsigned_zero(ctx, a, za)
    words = -(-depth // 4)
    lines, temporaries = [], []
    if depth % 4:   # the last word is short: A copied into words, zero past its columns
        lead = list(INDEX[:len(shape) - 1])
        word = _byte_word(ctx, a, [access(f"I{a}", [*lead, affine([("k4", 4)], j)])
                                   for j in range(4)], "k4", depth, [], zero)
        extents = list(zip(lead, shape[:-1])) + [("k4", words)]
        lines.append(f"Ap({', '.join([*lead, 'k4'])}) = {word}{where(extents)}")
        temporaries.append(("Ap", DType.INT32, tuple(e for _, e in extents)))
        word = access("Ap", [*p.a[:-1], "k4"])
    else:           # words of A read in place
        word = _byte_word(ctx, a, [access(f"I{a}", [*p.a[:-1], affine([("k4", 4)], j)])
                                   for j in range(4)], "k4", depth, [], zero)
    lines.append(f"{access('T', p.out)} +=! dot4({word}, Wt(k4, {p.n}))"
                 f"{where(list(zip(p.out, p.extents)) + [('k4', words)])}")
    sums = weights.sum(axis=1, dtype=np.int64).astype(np.int32)
    correction = f" - {zero} * S({p.n})" if zero else ""
    return _Sums(lines, f"{access('T', p.out)}{correction}{bias}", list(zip(p.out, p.extents)),
                 [*temporaries, ("T", DType.INT32, tuple(p.extents))],
                 [("Wt", weight_words(weights.astype(np.int8)))] + ([("S", sums)] if zero else []), (p.inputs[1],))


def _per_row(ctx: OpContext, i: int, what: str, p: Product) -> str:
    a = ctx.shape(p.inputs[0])
    return _one_or_each(ctx, i, what, p.m, a[-2] if len(a) > 1 else 1, "row of A")


def _per_column(ctx: OpContext, i: int, what: str, p: Product) -> str:
    return _one_or_each(ctx, i, what, p.n, ctx.shape(p.inputs[1])[-1], "column of B")


def _product_kernel(ctx: OpContext, sums: _Sums, result: str, dt: DType) -> TCKernel:
    """``Y(out) = result`` (of ``total``, the int32 sum there) after ``sums``."""
    index = ", ".join(i for i, _ in sums.out)
    line = f"Y({index}) = {result.format(total=sums.total)}{where(sums.out)}"
    return _kernel(ctx, [*sums.lines, line], [("Y", dt, [e for _, e in sums.out]), *sums.temporaries],
                   constants=sums.constants, unread=sums.unread)


@register("MatMulInteger")
def _matmul_integer(ctx: OpContext) -> TCKernel:
    p = matmul_product(ctx, 0, 1)
    return _product_kernel(ctx, _integer_matmul(ctx, p, 2, 3, ctx.shape(1)[-1]), "{total}",
                           DType.INT32)


def _factor(ctx: OpContext, a: str, b: str, y: str) -> str:
    """``a * b / y`` of the scales, rounded to their type after each operation."""
    st = ctx.dtype(1)
    return f"{st}({st}({a} * {b}) / {y})"


@register("QLinearMatMul")
def _qlinear_matmul(ctx: OpContext) -> TCKernel:
    if any(ctx.element(i).is_float for i in (0, 3, 7) if ctx.has(i)):
        raise ctx.unsupported("QLinearMatMul of float8 values; polyfuse multiplies integers only")
    p = matmul_product(ctx, 0, 3)
    sums = _integer_matmul(ctx, p, 2, 5, ctx.shape(3)[-1])
    factor = _factor(ctx, _per_row(ctx, 1, "scale of A", p), _per_column(ctx, 4, "scale of B", p),
                     _one_or_each(ctx, 6, "scale of Y", "0", 1, "tensor"))
    zero = _one_or_each(ctx, 7, "zero point of Y", "0", 1, "tensor")
    dt = ctx.dtype(7)
    return _product_kernel(ctx, sums, _requantized("{total}", factor, zero, dt), dt)


# --- ConvInteger, QLinearConv ----------------------------------------------------------------

def _integer_conv(ctx: OpContext, w: int, zx: str, zw: int, bias: int | None) -> _Sums:
    """The sums of ``(X - zx) * (W - zw)`` over each window (module docstring), plus the
    bias, if any: channels-last over repacked weights when they are constants
    (:func:`_channels_last_sums`), else in ONNX's layout."""
    x, ws = ctx.shape(0), ctx.shape(w)
    ctx.rank(0, least=3)
    if len(ws) != len(x):
        raise ctx.malformed(f"the weights have shape {ws}; they need the rank of the input {x}")
    kernel = ctx.ints(ctx.attr("kernel_shape") or ws[2:], "kernel_shape")
    if tuple(kernel) != ws[2:]:
        raise ctx.malformed(f"kernel_shape {tuple(kernel)} differs from the weights' {ws[2:]}")
    axes = window_axes(ctx, kernel)
    groups = ctx.ints(ctx.attr("group", 1), "group", 1, least=1)[0]
    m_out, c_group = ws[0], ws[1]
    if x[1] != c_group * groups or m_out % groups:
        raise ctx.malformed(f"{x[1]} input and {m_out} output channels do not split into "
                            f"{groups} group(s) of {c_group} inputs for weights {ws}")
    zw_read = _nonzero(ctx, zw, _one_or_each(ctx, zw, "zero point of w", "m", m_out,
                                             "output channel"))
    bias_read = f" + {_one_or_each(ctx, bias, 'bias', 'm', m_out, 'output channel')}" \
        if bias is not None else ""
    constant = ctx.values[w] is not None and (not zw_read or ctx.values[zw] is not None)
    if constant and (groups == 1 or groups == m_out == x[1]):
        sums = _channels_last_sums(ctx, axes, w, zx, zw if zw_read else None, bias_read)
        return replace(sums, unread=(w,))   # the repacked weights replace input w
    o, k = window_names(len(axes))
    group = "m" if m_out == groups else f"(m / {m_out // groups})"
    xc = "c" if groups == 1 else group if c_group == 1 else f"{group} * {c_group} + c"
    weights = _shifted(f"I{w}(m, c, {', '.join(k)})", zw_read)
    lines, temporaries = [], []
    if groups in (1, m_out):
        lines.append(_padded_copy(ctx, axes, zx))
        temporaries.append(("P", DType.INT32, x[:2] + tuple(a.span for a in axes)))
        axes = [a.padded() for a in axes]
        inputs = f"P(n, {xc}, {', '.join(a.position(oi, ki) for a, oi, ki in zip(axes, o, k))})"
    else:  # (isl takes minutes over P read through the quasi-affine group m / per_group)
        read = f"I0(n, {xc}, {', '.join(a.position(oi, ki) for a, oi, ki in zip(axes, o, k))})"
        inputs = guarded([c for a, oi, ki in zip(axes, o, k) for c in a.inside(oi, ki)],
                         _shifted(read, zx), "0")
    out = [("n", x[0]), ("m", m_out)] + [(oi, a.out) for oi, a in zip(o, axes)]
    index = ", ".join(i for i, _ in out)
    window = [("c", c_group)] + [(ki, a.kernel) for ki, a in zip(k, axes)]
    lines.append(f"T({index}) +=! ({inputs}) * {weights}{where(out + window)}")
    temporaries.append(("T", DType.INT32, tuple(e for _, e in out)))
    return _Sums(lines, f"T({index}){bias_read}", out, temporaries)


def _channels_last_sums(ctx: OpContext, axes: list[WindowAxis], w: int, zx: str, zw: int | None,
                        bias: str) -> _Sums:
    """The sums of a convolution with constant weights (and weight zero points) the way
    a float one with constant weights runs (:func:`.conv._conv_channels_last`):
    ``T(n, o..., m) +=! int32(X) * int32(Wt(c, k..., m))`` channels-last over the
    weights, less their zero points, repacked at compile time. The input's zero point
    stays out of the reduction: the padding holds it (so it adds nothing once
    corrected), and ``sum (x - zx) * w = sum x * w - zx * S(m)`` with the weights' sums
    ``S`` a constant; the correction and the bias are pointwise, for the epilogue.
    8-bit inputs and weights sum 4 channels at a time (:func:`_dot4_sums`); depthwise
    convolutions guard their reads instead of copying the input padded."""
    x, ws = ctx.shape(0), ctx.shape(w)
    m_out, depthwise = ws[0], ws[1] == 1 and ws[0] == x[1] and ctx.attr("group", 1) != 1
    weights = ctx.values[w].astype(np.int32)  # type: ignore[union-attr]
    if zw is not None:
        weights -= np.asarray(ctx.values[zw], np.int32).reshape((-1,) + (1,) * (weights.ndim - 1))
    sums = weights.reshape(m_out, -1).sum(axis=1, dtype=np.int64).astype(np.int32)
    bytes_ = weights.min() >= -128 and weights.max() <= 127
    if bytes_ and not depthwise and ctx.element(0) in (DType.UINT8, DType.INT8):
        return _dot4_sums(ctx, axes, weights, sums, zx, bias)
    packed = np.moveaxis(weights[:, 0] if depthwise else weights, 0, -1)
    packed = np.ascontiguousarray(packed.astype(np.int8 if bytes_ else np.int16))
    o, k = window_names(len(axes))
    fill = f"{ctx.dtype(0)}({zx})" if zx else ""
    lines, temporaries = [], []
    if depthwise:
        read = f"I0(n, m, {', '.join(a.position(oi, ki) for a, oi, ki in zip(axes, o, k))})"
        inside = [cond for a, oi, ki in zip(axes, o, k) for cond in a.inside(oi, ki)]
        product = (f"int32({guarded(inside, read, fill or literal(0, ctx.dtype(0)))}) * "
                   f"int32(Wt({', '.join(k)}, m))")
        summed = []
    else:
        source, stored_last = "I0", bool(ctx.attr(CHANNELS_LAST))
        if any(a.inside("o", "k") for a in axes):
            lines.append(pad_input(ctx, axes, stored_last, "I0", fill).strip())
            spans = tuple(a.span for a in axes)
            temporaries.append(("P", ctx.dtype(0), (x[0], *spans, x[1]) if stored_last
                                else (*x[:2], *spans)))
            source, axes = "P", [a.padded() for a in axes]
        window = ", ".join(a.position(oi, ki) for a, oi, ki in zip(axes, o, k))
        read = f"P(n, {window}, c)" if stored_last else f"{source}(n, c, {window})"
        product = f"int32({read}) * int32(Wt(c, {', '.join(k)}, m))"
        summed = [("c", ws[1])]
    correction = f" - int32({zx}) * S(m)" if zx else ""
    return _accumulated(ctx, axes, lines, temporaries, product, summed,
                        [("Wt", packed)] + ([("S", sums)] if zx else []), correction + bias)


def _dot4_sums(ctx: OpContext, axes: list[WindowAxis], weights: np.ndarray, sums: np.ndarray,
               zx: str, tail: str) -> _Sums:
    """The sums of 8-bit inputs and weights 4 channels at a time, each step one ``dot4``
    (x86's ``vpdpbusd``: unsigned bytes times signed bytes, summed 4 to an int32 lane):
    ``T(n, o..., m) +=! dot4(P(n, h..., c4), Wt(c4, k..., m))`` with ``P`` the input
    copied into words of 4 channels (padded, channels-last; :func:`_copied_words`), or
    the input itself where it needs no padding, and ``Wt`` the weights as words
    (:func:`weight_words`)."""
    x = ctx.shape(0)
    words = -(-x[1] // 4)
    zero = _unsigned_zero(ctx, 0, zx)
    o, k = window_names(len(axes))
    if x[1] % 4 == 0 and not any(a.inside(oi, ki) for a, oi, ki in zip(axes, o, k)):
        # no padding, no channels past the last word: each word is 4 channels as they lie
        # in memory (channels-last), read in place by the product instead of copied first
        window = ", ".join(a.position(oi, ki) for a, oi, ki in zip(axes, o, k))
        word = _byte_word(ctx, 0, [f"I0(n, {affine([('c4', 4)], j)}, {window})" for j in range(4)],
                          "c4", x[1], [], zero)
        lines: list[str] = []
        temporaries: list[Declared] = []
        padded = axes
    else:
        lines, temporaries, padded = _copied_words(ctx, axes, zero)
        word = f"P(n, {', '.join(a.position(oi, ki) for a, oi, ki in zip(padded, o, k))}, c4)"
    product = f"dot4({word}, Wt(c4, {', '.join(k)}, m))"
    correction = f" - {zero} * S(m)" if zero else ""
    return _accumulated(ctx, padded, lines, temporaries, product, [("c4", words)],
                        [("Wt", weight_words(weights.astype(np.int8)))] + ([("S", sums)] if zero else []),
                        correction + tail)


def _copied_words(ctx: OpContext, axes: list[WindowAxis], zero: str
                  ) -> tuple[list[str], list[Declared], list[WindowAxis]]:
    """``P(n, h..., c4)``: the input copied into words of 4 channels, channels-last, with
    ``zero`` in the padding and past the last channel; the statement, P, and the axes
    over it."""
    x = ctx.shape(0)
    h = [f"h{d}" for d in range(len(axes))]
    spatial = [cond for hi, a in zip(h, axes) for cond in
               ([f"{hi} >= {a.pad}"] if a.pad > 0 else [])
               + ([f"{hi} < {a.pad + a.size}"] if a.span > a.pad + a.size else [])]
    position = ", ".join(affine([(hi, 1)], -a.pad) for hi, a in zip(h, axes))
    word = _byte_word(ctx, 0, [f"I0(n, {affine([('c4', 4)], j)}, {position})" for j in range(4)],
                      "c4", x[1], spatial, zero)
    extents = [("n", x[0])] + [(hi, a.span) for hi, a in zip(h, axes)] + [("c4", -(-x[1] // 4))]
    return ([f"P(n, {', '.join(h)}, c4) = {word}{where(extents)}"],
            [("P", DType.INT32, tuple(e for _, e in extents))], [a.padded() for a in axes])


def _unsigned_zero(ctx: OpContext, i: int, zero: str) -> str:
    """The zero point (read as ``zero``, or none) of input ``i`` as the unsigned bytes
    ``dot4`` reads: an int8 input is made unsigned by adding 128, which its zero point
    takes too."""
    if ctx.element(i) is DType.INT8:
        return f"(int32({zero}) + 128)" if zero else "128"
    return f"int32({zero})" if zero else ""


def _byte_word(ctx: OpContext, i: int, reads: Sequence[str], index: str, count: int,
               inside: Sequence[str], zero: str) -> str:
    """``as_int32`` of 4 bytes, byte j ``reads[j]`` of 8-bit input ``i`` (made unsigned):
    the values at ``4 * index + j`` along an axis of ``count``, where that is inside
    it and ``inside`` holds, else ``zero`` (a padding that adds nothing once the zero
    point is corrected; past ``count`` the weights are 0)."""
    signed = ctx.element(i) is DType.INT8
    values = [f"uint32(int32({read}) + 128)" if signed else f"uint32({read})" for read in reads]
    return packed_word(values, index, count, inside, f"uint32({zero or 0})")


def _accumulated(ctx: OpContext, axes: list[WindowAxis], lines: list[str],
                 temporaries: list[Declared], product: str, summed: list[tuple[str, int]],
                 constants: list[tuple[str, np.ndarray]], tail: str) -> _Sums:
    """``T(n, o..., m) +=! product`` over ``summed`` and the window after ``lines``; the
    total at ``(n, m, o...)`` is T's element plus ``tail``."""
    x, m_out = ctx.shape(0), constants[0][1].shape[-1]
    o, k = window_names(len(axes))
    outs = [(oi, a.out) for oi, a in zip(o, axes)]
    extents = [("n", x[0])] + outs + [("m", m_out)] + summed + \
        [(ki, a.kernel) for ki, a in zip(k, axes)]
    t = f"T(n, {', '.join(o)}, m)"
    temporaries = [*temporaries, ("T", DType.INT32, (x[0], *(e for _, e in outs), m_out))]
    return _Sums([*lines, f"{t} +=! {product}{where(extents)}"], f"{t}{tail}",
                 [("n", x[0]), ("m", m_out)] + outs, temporaries, constants)


def _padded_copy(ctx: OpContext, axes: Sequence[WindowAxis], zero: str) -> str:
    """``P(n, c, h...)``: the input as int32 less its zero point, with 0 in the padding."""
    h = [f"h{d}" for d in range(len(axes))]
    read = f"I0(n, c, {', '.join(affine([(hi, 1)], -a.pad) for hi, a in zip(h, axes))})"
    inside = [cond for hi, a in zip(h, axes) for cond in
              ([f"{hi} >= {a.pad}"] if a.pad > 0 else [])
              + ([f"{hi} < {a.pad + a.size}"] if a.span > a.pad + a.size else [])]
    extents = [("n", ctx.shape(0)[0]), ("c", ctx.shape(0)[1])] + \
        [(hi, a.span) for hi, a in zip(h, axes)]
    return (f"P({', '.join(i for i, _ in extents)}) = "
            f"{guarded(inside, _shifted(read, zero), '0')}{where(extents)}")


@register("ConvInteger")
def _conv_integer(ctx: OpContext) -> TCKernel:
    zx = _nonzero(ctx, 2, _one_or_each(ctx, 2, "zero point of x", "0", 1, "tensor"))
    return _product_kernel(ctx, _integer_conv(ctx, 1, zx, 3, None), "{total}", DType.INT32)


@register("QLinearConv")
def _qlinear_conv(ctx: OpContext) -> TCKernel:
    zx = _nonzero(ctx, 2, _one_or_each(ctx, 2, "zero point of x", "0", 1, "tensor"))
    sums = _integer_conv(ctx, 3, zx, 5, 8 if ctx.has(8) else None)
    m_out = ctx.shape(3)[0]
    factor = _factor(ctx, _one_or_each(ctx, 1, "scale of x", "0", 1, "tensor"),
                     _one_or_each(ctx, 4, "scale of w", "m", m_out, "output channel"),
                     _one_or_each(ctx, 6, "scale of y", "0", 1, "tensor"))
    zero = _one_or_each(ctx, 7, "zero point of y", "0", 1, "tensor")
    dt = ctx.dtype(7)
    return _product_kernel(ctx, sums, _requantized("{total}", factor, zero, dt), dt)


# --- QLinearGemm (what fuse_integer_ops makes of a quantized Gemm) -----------------------------

@register("QLinearGemm", internal=True)
def _qlinear_gemm(ctx: OpContext) -> TCKernel:
    """``Y = requantize(A' B' + bias)`` of 2-D integer operands: inputs A, its scale and zero
    point, B, its scale and zero point (per column of the product, or one), the int32
    bias (one, or one per column; may be omitted), Y's scale and zero point; ``transB``
    multiplies by B's transpose (A is never transposed)."""
    ctx.rank(0, 2)
    ctx.rank(3, 2)
    (m, k), b = ctx.shape(0), ctx.shape(3)
    transposed = ctx.flag("transB", 0)
    n = b[0] if transposed else b[1]
    if (b[1] if transposed else b[0]) != k:
        raise ctx.malformed(f"A of shape {(m, k)} and B of shape {b} do not multiply")
    p = Product((0, 3), ["m", "k"], ["n", "k"] if transposed else ["k", "n"], ["m", "n"], [m, n],
                "m", "n")
    bias = f" + {_one_or_each(ctx, 6, 'bias', 'n', n, 'column')}" if ctx.has(6) else ""
    sums = _integer_matmul(ctx, p, 2, 5, n, bias)
    factor = _factor(ctx, _one_or_each(ctx, 1, "scale of A", "0", 1, "tensor"),
                     _one_or_each(ctx, 4, "scale of B", "n", n, "column"),
                     _one_or_each(ctx, 7, "scale of Y", "0", 1, "tensor"))
    dt = ctx.dtype(8)
    zero = _one_or_each(ctx, 8, "zero point of Y", "0", 1, "tensor")
    return _product_kernel(ctx, sums, _requantized("{total}", factor, zero, dt), dt)
