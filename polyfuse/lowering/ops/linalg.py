"""MatMul (numpy semantics, batch broadcasting), Gemm and Einsum."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polyfuse.errors import ArgumentError
from polyfuse.frontends.einsum import einsum_source
from polyfuse.lowering.ops import (INDEX, OpContext, TCKernel, access, broadcast_indices,
                                   View, broadcast_shape, register, tensor_param)


@dataclass(frozen=True)
class Product:
    """numpy's matmul of node inputs ``inputs`` as indices: ``Y(out) +=! A(a) * B(b)``,
    with ``k`` summed and ``out`` ranging over ``extents``; ``m`` and ``n`` index A's rows
    and B's columns (also where a vector has none)."""

    inputs: tuple[int, int]
    a: list[str]
    b: list[str]
    out: list[str]
    extents: list[int]
    m: str
    n: str

    @property
    def where(self) -> str:
        ranges = ", ".join(f"{i} in 0:{e}" for i, e in zip(self.out, self.extents))
        return f" where {ranges}" if ranges else ""


def matmul_product(ctx: OpContext, ia: int = 0, ib: int = 1) -> Product:
    """The product of node inputs ``ia`` and ``ib``, checked to multiply."""
    ctx.rank(ia, least=1)
    ctx.rank(ib, least=1)
    a, b = ctx.shape(ia), ctx.shape(ib)
    a2 = (1,) + a if len(a) == 1 else a    # numpy: promote vectors, drop the dimension later
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ctx.malformed(f"shapes {a} and {b} do not multiply: A's last dimension ({a2[-1]}) "
                            f"must equal B's {'only' if len(b) == 1 else 'second-to-last'} ({b2[-2]})")
    batch = broadcast_shape(a2[:-2], b2[:-2])
    nb = len(batch)
    m, n = INDEX[nb], INDEX[nb + 1]
    read_a = broadcast_indices(a2[:-2], batch) + [m, "k"]
    read_b = broadcast_indices(b2[:-2], batch) + ["k", n]
    if len(a) == 1:
        read_a = read_a[:-2] + ["k"]
    if len(b) == 1:
        read_b = read_b[:-2] + ["k"]
    out = list(INDEX[:nb]) + ([m] if len(a) > 1 else []) + ([n] if len(b) > 1 else [])
    extents = list(batch) + ([a2[-2]] if len(a) > 1 else []) + ([b2[-1]] if len(b) > 1 else [])
    return Product((ia, ib), read_a, read_b, out, extents, m, n)


@register("MatMul")
def _matmul(ctx: OpContext) -> TCKernel:
    p, dt = matmul_product(ctx), ctx.dtype(0)
    params = f"{tensor_param('A', (dt, ctx.shape(0)))}, {tensor_param('B', (dt, ctx.shape(1)))}"
    src = (f"def k({params}) -> (Y) {{\n"
           f"  Y({', '.join(p.out)}) +=! {access('A', p.a)} * {access('B', p.b)}{p.where}\n}}\n")
    return TCKernel(src, (0, 1))


TRANSPOSE_ROWS = 8   # rows of A from which Gemm multiplies constant weights' transpose


@register("Gemm")
def _gemm(ctx: OpContext) -> TCKernel:
    ta, tb, m_ext, n_ext = gemm_shape(ctx)
    a = "A(k, m)" if ta else "A(m, k)"
    b = "B(n, k)" if tb else "B(k, n)"
    params = [tensor_param("A", ctx.types[0]), tensor_param("B", ctx.types[1])]  # type: ignore[arg-type]
    constants: tuple[np.ndarray, ...] = ()
    weights = ctx.values[1]
    if tb and weights is not None and m_ext >= TRANSPOSE_ROWS:
        # constant weights (n, k), as torch's Linear exports them: transposed once at
        # compile time, so the product reads rows of output columns (the register-blocked
        # micro-kernel) instead of a dot product per output; a few rows (a classifier
        # head on one image) keep the dot products, which read each weight row in order
        constants = (np.ascontiguousarray(weights.T),)
        params[1] = tensor_param("B", (ctx.dtype(1), constants[0].shape))
        b = "B(k, n)"
    lines = [f"  Y(m, n) +=! {a} * {b} where m in 0:{m_ext}, n in 0:{n_ext}"]
    inputs: tuple[int, ...] = (0, 1)
    epilogue, more, read = gemm_epilogue(ctx, m_ext, n_ext)
    params += more
    inputs += read
    if constants:   # B follows the node inputs, as the kernel's last parameter
        params.append(params.pop(1))
        inputs = tuple(i for i in inputs if i != 1)
    src = f"def k({', '.join(params)}) -> (Y) {{\n" + "\n".join(lines + epilogue) + "\n}\n"
    return TCKernel(src, inputs, constants=constants)


def gemm_shape(ctx: OpContext) -> tuple[bool, bool, int, int]:
    """Gemm's ``transA``, ``transB`` and the product's rows and columns, checked."""
    ta, tb = ctx.flag("transA", 0), ctx.flag("transB", 0)
    ctx.rank(0, 2)
    ctx.rank(1, 2)
    if ctx.shape(0)[0 if ta else 1] != ctx.shape(1)[1 if tb else 0]:
        raise ctx.malformed(f"A {ctx.shape(0)} (transA={int(ta)}) and B {ctx.shape(1)} "
                            f"(transB={int(tb)}) do not multiply: their inner dimensions differ")
    return ta, tb, ctx.shape(0)[1 if ta else 0], ctx.shape(1)[0 if tb else 1]


def gemm_epilogue(ctx: OpContext, m_ext: int, n_ext: int) -> tuple[list[str], list[str],
                                                                   tuple[int, ...]]:
    """The statements scaling the product ``Y(m, n)`` by alpha and adding ``beta * C``,
    with the parameter and node input (C's, if read) they add."""
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    dt = ctx.dtype(0)
    lines = [f"  Y(m, n) = Y(m, n) * {dt}({alpha!r})"] if alpha != 1.0 else []
    if not ctx.has(2) or beta == 0.0:
        return lines, [], ()
    if broadcast_shape(ctx.shape(2), (m_ext, n_ext)) != (m_ext, n_ext):
        raise ctx.malformed(f"C has shape {ctx.shape(2)}, which does not broadcast to the "
                            f"result's {(m_ext, n_ext)}")
    c = access("C", broadcast_indices(ctx.shape(2), (m_ext, n_ext), ["m", "n"]))
    scale = "" if beta == 1.0 else f" * {dt}({beta!r})"
    lines.append(f"  Y(m, n) = Y(m, n) + {c}{scale}")
    return lines, [tensor_param("C", ctx.types[2])], (2,)  # type: ignore[arg-type]


@register("Einsum")
def _einsum(ctx: OpContext) -> TCKernel | View:
    equation = ctx.attr("equation")
    if equation is None:
        raise ctx.unsupported("the equation attribute is required")
    terms, _, output = str(equation).replace(" ", "").partition("->")
    if "," not in terms and terms == output and "." not in terms and len(set(terms)) == len(terms) \
            and len(terms) == len(ctx.shape(0)):
        return View(0, ctx.shape(0))  # the identity: no statement (none at all for scalars)
    positions = tuple(range(len(ctx.types)))
    try:
        source = einsum_source(str(equation), [ctx.dtype(i) for i in positions],
                               [len(ctx.shape(i)) for i in positions])
    except ArgumentError as err:   # the equation does not fit the inputs
        raise ctx.malformed(str(err)) from None
    return TCKernel(source, positions)
