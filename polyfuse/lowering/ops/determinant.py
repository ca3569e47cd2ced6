"""Det: determinants of (batched) square matrices by Gaussian elimination with partial
pivoting, unrolled over the static size.

Step k reads the trailing ``(n - k) x (n - k)`` matrix ``A{k}``: it picks the first row
of largest magnitude in its first column as the pivot (``P{k}``, value ``D{k}``), swaps
it with the first row, and writes the eliminated trailing matrix ``A{k + 1}``. The
determinant is the product of the pivots, negated once per swap. A zero pivot (a
singular matrix) gives a zero determinant rather than a division by zero. The work is
``n^3 / 3`` per matrix; the statements grow with ``n``, so sizes above ``MAX_SIZE`` are
refused.
"""

from __future__ import annotations

from polyfuse.ir.types import DType
from polyfuse.lowering.ops import (INDEX, OpContext, TCKernel, access, balanced, literal,
                                   register, tensor_param)
from polyfuse.lowering.ops.movement import definition, parameter, statement

MAX_SIZE = 64


def _step(k: int, n: int, batch: list[str], outer: list[int],
          ct: DType) -> tuple[list[str], list[str]]:
    """(statements, temporaries) of elimination step ``k`` of an ``n x n`` matrix."""
    a, m, p, d = f"A{k}", f"M{k}", f"P{k}", f"D{k}"
    size = n - k
    first = f"abs({access(a, batch + ['r', '0'])})"
    lines = [statement(m, batch, first, outer, [f"r in 0:{size}"], "max=!"),
             statement(p, batch, f"{first} == {access(m, batch)} ? int64(r) : int64({size - 1})",
                       outer, [f"r in 0:{size}"], "min=!"),
             statement(d, batch, access(a, batch + [access(p, batch), "0"]), outer)]
    # row r + 1 of the swapped matrix is row 0 where the pivot was taken, else itself
    row = f"(r + 1 == {access(p, batch)} ? {access(a, batch + ['0', 'c + 1'])} : " \
          f"{access(a, batch + ['r + 1', 'c + 1'])})"
    lead = f"(r + 1 == {access(p, batch)} ? {access(a, batch + ['0', '0'])} : " \
           f"{access(a, batch + ['r + 1', '0'])})"
    zero = literal(0, ct)
    factor = f"({access(d, batch)} == {zero} ? {zero} : {lead} / {access(d, batch)})"
    pivot_row = access(a, batch + [access(p, batch), "c + 1"])
    lines.append(statement(f"A{k + 1}", batch + ["r", "c"], f"{row} - {factor} * {pivot_row}",
                           outer + [size - 1, size - 1]))
    return lines, [m, p, d]


@register("Det")
def _det(ctx: OpContext) -> TCKernel:
    shape = ctx.shape(0)
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise ctx.malformed(f"an input of shape {shape} is no (batch of) square matrices")
    n = shape[-1]
    if n > MAX_SIZE:
        raise ctx.unsupported(f"the determinant of {n} x {n} matrices: polyfuse unrolls the "
                              f"elimination and takes sizes up to {MAX_SIZE}")
    dt = ctx.dtype(0)
    ct = dt if dt in (DType.FLOAT32, DType.FLOAT64) else DType.FLOAT32
    outer = list(shape[:-2])
    batch = list(INDEX[:len(outer)])
    y = tensor_param("Y", (dt, outer))
    if n == 0:
        lines = [statement("Y", batch, literal(1, dt), outer)]
        return TCKernel(definition([parameter(ctx, 0, "X")], [y], lines), (0,))
    lines = [statement("A0", batch + ["r", "c"], f"{ct}({access('X', batch + ['r', 'c'])})",
                       outer + [n, n])]
    temps = [tensor_param("A0", (ct, outer + [n, n]))]
    signed = []
    for k in range(n - 1):
        step, (m, p, d) = _step(k, n, batch, outer, ct)
        lines += step
        temps += [tensor_param(m, (ct, outer)), tensor_param(p, (DType.INT64, outer)),
                  tensor_param(d, (ct, outer)),
                  tensor_param(f"A{k + 1}", (ct, outer + [n - k - 1, n - k - 1]))]
        signed.append(f"({access(p, batch)} == 0 ? {access(d, batch)} : -{access(d, batch)})")
    signed.append(access(f"A{n - 1}", batch + ["0", "0"]))
    product = balanced(signed, lambda u, v: f"({u}) * ({v})")
    lines.append(statement("Y", batch, f"{dt}({product})", outer))
    return TCKernel(definition([parameter(ctx, 0, "X")], [y] + temps, lines), (0,))
