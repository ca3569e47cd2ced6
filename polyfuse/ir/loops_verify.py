"""Invariants of the loop IR; raises IRVerificationError naming the kernel and the problem."""

from __future__ import annotations

from polyfuse.errors import IRVerificationError
from polyfuse.ir.comprehension import Expr, IndexVar, LocalRef, Read, ScalarRef, walk
from polyfuse.ir.loops import Assign, BufferRole, For, If, LoopKernel, Stmt, Store, TileProduct, numbers


def verify_kernel(k: LoopKernel) -> None:
    def fail(message: str) -> IRVerificationError:
        return IRVerificationError(f"in loop kernel '{k.name}': {message}")

    names = [b.name for b in k.buffers] + [s.name for s in k.scalars]
    if len(set(names)) != len(names):
        raise fail(f"parameter names repeat: {names}")
    buffers = {b.name: b for b in k.buffers}
    scalars = {s.name for s in k.scalars}
    for b in k.buffers:
        p = b.packing
        if p is None:
            continue
        source = buffers.get(p.source)
        if b.role is not BufferRole.IN or source is None or source.role is not BufferRole.IN \
                or source.packing is not None or source.dtype is not b.dtype:
            raise fail(f"packed buffer {b} must be an input packed from an unpacked input of its type")
        if len(p.offsets) != len(source.shape) or any(len(row) != len(b.shape) for row in p.coefs):
            raise fail(f"packed buffer {b}: its packing does not match the ranks of {source} and itself")
        if not (b.fixed and source.fixed):
            raise fail(f"packed buffer {b}: a packing needs extents that are numbers, not sizes of the call")
        if not p.padded and not p.inside(numbers(b.shape), numbers(source.shape)):
            raise fail(f"packed buffer {b} reads {source} outside its bounds")

    def check_expr(e: Expr, loops: set[str], locals_: set[str]) -> None:
        for n in walk(e):
            if isinstance(n, Read):
                b = buffers.get(n.tensor)
                if b is None:
                    raise fail(f"'{n}' reads an unknown buffer")
                if len(n.indices) != len(b.shape) or n.dtype is not b.dtype:
                    raise fail(f"'{n}' does not match buffer {b}")
            elif isinstance(n, IndexVar) and n.name not in loops:
                raise fail(f"'{n.name}' is used outside a loop over it")
            elif isinstance(n, LocalRef) and n.name not in locals_:
                raise fail(f"local '{n.name}' is read before it is set")
            elif isinstance(n, ScalarRef) and n.name not in scalars:
                raise fail(f"unknown scalar '{n.name}'")

    def check(body: tuple[Stmt, ...], loops: set[str], locals_: set[str]) -> None:
        for s in body:
            if isinstance(s, For):
                if s.var in loops:
                    raise fail(f"loop variable '{s.var}' is reused by a nested loop")
                if s.step < 1 or s.vector < 1 or s.unroll < 1:
                    raise fail(f"loop '{s.var}' has step {s.step}, vector {s.vector}, unroll {s.unroll}")
                check_expr(s.lo, loops, locals_)
                check_expr(s.hi, loops, locals_)
                check(s.body, loops | {s.var}, locals_)
            elif isinstance(s, If):
                check_expr(s.cond, loops, locals_)
                check(s.then, loops, set(locals_))
                check(s.other, loops, set(locals_))
            elif isinstance(s, Assign):
                check_expr(s.value, loops, locals_)
                locals_.add(s.var)
            elif isinstance(s, TileProduct):
                for operand in s.operands:
                    check_expr(operand, loops, locals_)
                check(s.nest, loops, set(locals_))
            elif isinstance(s, Store):
                b = buffers.get(s.buffer)
                if b is None or b.role is BufferRole.IN:
                    raise fail(f"store to '{s.buffer}', which is not a writable buffer")
                if len(s.indices) != len(b.shape):
                    raise fail(f"store to '{s.buffer}' with {len(s.indices)} indices")
                for e in (*s.indices, s.value):
                    check_expr(e, loops, locals_)

    check(k.body, set(), set())
