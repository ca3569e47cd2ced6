"""Split-k: a long sum shared by several blocks per output tile (the GPU option ``split_k``).

A contraction whose outputs are few (a 128 x 256 product fills a couple of dozen
blocks of a GPU with a hundred multiprocessors) but whose reduction is deep leaves most
of the GPU idle. As CUTLASS's split-k and TVM's ``rfactor`` do, the definition is
rewritten before scheduling: a sum ``C(m, n) +=! rhs`` over ``k in 0:K`` becomes

    C_parts(m, n, s) +=! rhs[k := s * (K / parts) + k]    where s in 0:parts, k in 0:K / parts
    C(m, n) +=! C_parts(m, n, s)

so the first statement's blocks also run over ``s`` (each summing a slice of ``k``) and
the second adds the slices, in a second launch, in a fixed order: the result does not
depend on which block finishes first. The partial sums are in the compute precision
(float32 for 16-bit outputs) and live in a scratch buffer the kernel's caller provides
(:data:`~polyfuse.ir.loops.BufferRole.TEMP`: device memory of the call, or a region of a
model's arena). ``s`` comes after the output's indices, so both statements' loops are
the original ones with ``s`` inserted before the reduction: the options' tile sizes and
orders for the original band fit both bands once a tile of 1 is inserted there
(:func:`split_options`).

Only sums whose one reduction index runs from 0 over a multiple of ``parts`` with at
least :data:`MIN_SLICE` steps per slice are split, into exactly ``parts``; every other
statement stays as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from polyfuse.ir.comprehension import (Binary, BinaryOp, Definition, IndexVar, Literal, Range, Read, ReduceOp,
                                       Statement, TensorDecl, map_expr, walk)
from polyfuse.ir.loops import fresh_name
from polyfuse.ir.symbolic import evaluate_int
from polyfuse.ir.types import DType
from polyfuse.scheduler.options import MappingOptions

MIN_SLICE = 16   # steps of the reduction each slice sums at least


def split_reductions(d: Definition, sizes: Mapping[str, int],
                     parts: int) -> tuple[Definition, tuple[str, ...], int]:
    """``d`` with each sum it can split into ``parts`` slices rewritten (see the module
    docstring), the names of the scratch tensors added to its outputs, and where the
    slices' index joins the first split statement's loops (its output's rank)."""
    if parts <= 1:
        return d, (), 0
    taken = {p.name for p in d.params} | {t.name for t in d.outputs}
    statements: list[Statement] = []
    scratch: list[TensorDecl] = []
    for st in d.statements:
        depth = _splittable(d, st, sizes, parts)
        if depth is None:
            statements.append(st)
            continue
        (k,) = st.reduction_indices
        part = fresh_name(f"{k}_part", {r.index for r in st.ranges})
        name = fresh_name(f"{st.tensor}_parts", taken)
        out = d.tensor(st.tensor)
        parts_decl = TensorDecl(name, out.dtype.compute, (*out.shape, _int(parts)))
        scratch.append(parts_decl)
        slice_start = Binary(BinaryOp.MUL, IndexVar(part), _int(depth), DType.INT32)
        moved = Binary(BinaryOp.ADD, slice_start, IndexVar(k), DType.INT32)
        rhs = map_expr(st.rhs, lambda e: moved if isinstance(e, IndexVar) and e.name == k else e)
        own = tuple(r for r in st.ranges if r.index != k)
        statements.append(Statement(name, (*st.indices, part), ReduceOp.ADD, True, rhs,
                                    (*own, Range(part, _int(0), _int(parts)), Range(k, _int(0), _int(depth))),
                                    st.loc))
        total = Read(name, (*(IndexVar(i) for i in st.indices), IndexVar(part)), parts_decl.dtype)
        statements.append(Statement(st.tensor, st.indices, ReduceOp.ADD, True, total,
                                    (*own, Range(part, _int(0), _int(parts))), st.loc))
    if not scratch:
        return d, (), 0
    return replace(d, outputs=d.outputs + tuple(scratch), statements=tuple(statements)), \
        tuple(t.name for t in scratch), len(scratch[0].shape) - 1


def split_options(options: MappingOptions, position: int) -> MappingOptions:
    """``options`` for bands with a member inserted at ``position`` (the slices' index):
    a tile of 1 there (each block one slice), no register tile, the orders keeping the
    other members' order with the new one in place."""
    def order(o: tuple[int, ...]) -> tuple[int, ...]:
        if not o:
            return o
        moved = [j + (j >= position) for j in o]
        at = next((k for k, j in enumerate(o) if j >= position), len(o))
        return (*moved[:at], position, *moved[at:])

    def insert(values: tuple[int, ...], value: int) -> tuple[int, ...]:
        return (*values[:position], value, *values[position:]) if len(values) >= position else values
    return replace(options, tile_sizes=insert(options.tile_sizes, 1), register_tile=insert(options.register_tile, 0),
                   tile_order=order(options.tile_order), point_order=order(options.point_order))


def _splittable(d: Definition, st: Statement, sizes: Mapping[str, int], parts: int) -> int | None:
    """The steps of each slice where ``st`` is a float sum over one reduction index
    from 0 that ``parts`` slices of at least :data:`MIN_SLICE` steps cover; else None."""
    if st.op is not ReduceOp.ADD or not st.init or len(st.reduction_indices) != 1 \
            or not d.tensor(st.tensor).dtype.is_float \
            or any(isinstance(e, Read) and e.tensor == st.tensor for e in walk(st.rhs)):
        return None
    r = st.range_of(st.reduction_indices[0])
    try:
        lo, hi = evaluate_int(r.lo, sizes), evaluate_int(r.hi, sizes)
    except (KeyError, ValueError):
        return None
    if lo != 0 or hi % parts or hi // parts < MIN_SLICE:
        return None
    return hi // parts


def _int(value: int) -> Literal:
    return Literal(value, DType.INT32)
