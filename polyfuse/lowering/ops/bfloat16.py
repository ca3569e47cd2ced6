"""BFloat16MatMul, BFloat16Gemm and BFloat16Conv: the products the graph pass
``use_bfloat16_products`` (:mod:`polyfuse.lowering.bfloat16`) gives bfloat16 operands.

Each sums 2 reduction elements per step, one ``bfdot2`` (AVX512-BF16's ``vdpbf16ps``:
2 bfloat16 products added to a float32 lane): ``Y(...) +=! bfdot2(Ap(..., k2), Wt(k2,
n))``, with ``Ap`` the input rounded to bfloat16 (to nearest even) and copied into int32
words of 2 consecutive reduction elements, and ``Wt`` the constant weights rounded and
packed the same way at compile time, words of one output column contiguous (the
operand one instruction reads 16 outputs of). A reduction of odd length ends in a word
whose upper half is 0. The sums, bias, alpha and beta are float32, as in the float
ops; a convolution accumulates channels-last as Conv does with constant weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import INDEX, OpContext, TCKernel, access, register, tensor_param
from polyfuse.lowering.ops.conv import (affine, channels_last_kernel, check_bias, kernel_shape,
                                        where, window_axes, window_names)
from polyfuse.lowering.ops.linalg import gemm_epilogue, gemm_shape, matmul_product
from polyfuse.lowering.ops.words import packed_word, weight_words


def _pairs(reads: Sequence[str], index: str, count: int, inside: Sequence[str] = ()) -> str:
    """The word of 2 float32 ``reads`` rounded to bfloat16 (see :func:`packed_word`)."""
    halves = [f"uint32(as_uint16(bfloat16({read})))" for read in reads]
    return packed_word(halves, index, count, inside, "uint32(0)")


def _weights(ctx: OpContext, i: int) -> np.ndarray:
    """Node input ``i``: constant float32 weights (what the graph pass asked for)."""
    if ctx.dtype(0) is not DType.FLOAT32 or ctx.dtype(i) is not DType.FLOAT32:
        raise ctx.malformed(f"bfloat16 products take float32 operands, got {ctx.dtype(0)} "
                            f"and {ctx.dtype(i)}")
    return ctx.const(i, "weights")


def _rows(lead: list[tuple[str, int]], read: str, depth: int) -> str:
    """``Ap(lead..., k2)``: words of the input's rows, ``read`` with ``{k}`` for the
    reduction index."""
    words = -(-depth // 2)
    word = _pairs([read.format(k=affine([("k2", 2)], j)) for j in range(2)], "k2", depth)
    return f"  Ap({', '.join([i for i, _ in lead] + ['k2'])}) = {word}{where(lead + [('k2', words)])}"


def _packed(columns: np.ndarray) -> np.ndarray:
    """Weights ``(N, K)``, one row per output column, as words ``(K2, N)``."""
    return weight_words(columns.astype(ml_dtypes.bfloat16))


@register("BFloat16MatMul", internal=True)
def _matmul(ctx: OpContext) -> TCKernel:
    p = matmul_product(ctx)
    weights = _weights(ctx, 1)
    shape = ctx.shape(0)
    lead = list(zip(INDEX[:len(shape) - 1], shape[:-1]))
    read = access("A", [i for i, _ in lead] + ["{k}"])
    packed = _packed(weights.T)
    out = list(zip(p.out, p.extents)) + [("k2", packed.shape[0])]
    lines = [_rows(lead, read, shape[-1]),
             f"  {access('Y', p.out)} +=! bfdot2({access('Ap', [*p.a[:-1], 'k2'])}, "
             f"Wt(k2, {p.n})){where(out)}"]
    params = [tensor_param("A", ctx.types[0]), tensor_param("Wt", (DType.INT32, packed.shape))]  # type: ignore[arg-type]
    return TCKernel(f"def k({', '.join(params)}) -> (Y, Ap) {{\n" + "\n".join(lines) + "\n}\n",
                    (0,), constants=(packed,))


@register("BFloat16Gemm", internal=True)
def _gemm(ctx: OpContext) -> TCKernel:
    ta, tb, m_ext, n_ext = gemm_shape(ctx)
    weights = _weights(ctx, 1)
    packed = _packed(weights if tb else weights.T)
    depth = ctx.shape(0)[0 if ta else 1]
    out = [("m", m_ext), ("n", n_ext), ("k2", packed.shape[0])]
    lines = [_rows([("m", m_ext)], "A({k}, m)" if ta else "A(m, {k})", depth),
             f"  Y(m, n) +=! bfdot2(Ap(m, k2), Wt(k2, n)){where(out)}"]
    epilogue, more, read = gemm_epilogue(ctx, m_ext, n_ext)
    params = [tensor_param("A", ctx.types[0]), *more,  # type: ignore[arg-type]
              tensor_param("Wt", (DType.INT32, packed.shape))]
    return TCKernel(f"def k({', '.join(params)}) -> (Y, Ap) {{\n" + "\n".join(lines + epilogue)
                    + "\n}\n", (0, *read), constants=(packed,))


@register("BFloat16Conv", internal=True)
def _conv(ctx: OpContext) -> TCKernel:
    """Channels-last over ``P(n, h..., c2)``, the input padded and copied into words of 2
    channels, as the integer convolutions copy theirs into words of 4."""
    x, w = ctx.shape(0), ctx.shape(1)
    axes = window_axes(ctx, kernel_shape(ctx))
    weights = _weights(ctx, 1)
    if w[1] != x[1]:
        raise ctx.malformed(f"the weights have {w[1]} input channels; the input has {x[1]}")
    check_bias(ctx, w[0])
    h = [f"h{d}" for d in range(len(axes))]
    inside = [cond for hi, a in zip(h, axes) for cond in
              ([f"{hi} >= {a.pad}"] if a.pad > 0 else [])
              + ([f"{hi} < {a.pad + a.size}"] if a.span > a.pad + a.size else [])]
    position = ", ".join(affine([(hi, 1)], -a.pad) for hi, a in zip(h, axes))
    word = _pairs([f"X(n, {affine([('c2', 2)], j)}, {position})" for j in range(2)], "c2", x[1],
                  inside)
    words = -(-x[1] // 2)
    extents = [("n", x[0])] + [(hi, a.span) for hi, a in zip(h, axes)] + [("c2", words)]
    padding = f"  P(n, {', '.join(h)}, c2) = {word}{where(extents)}"
    padded = [a.padded() for a in axes]
    o, k = window_names(len(axes))
    window = ", ".join(a.position(oi, ki) for a, oi, ki in zip(padded, o, k))
    product = f"bfdot2(P(n, {window}, c2), Wt(c2, {', '.join(k)}, m))"
    return channels_last_kernel(ctx, padded, "conv", padding, product, [("c2", words)],
                                weight_words(weights.astype(ml_dtypes.bfloat16)))
