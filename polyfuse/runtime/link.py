"""A program's kernels linked into one LLVM module with one entry point.

``int ENTRY(const uint8_t *weights, uint8_t *activations, const void *const *inputs,
void *const *outputs)`` runs the code of a :class:`~polyfuse.runtime.program.ProgramLayout`
(its calls, with its loops and branches as jumps between blocks): what ahead-of-time bundles (:mod:`polyfuse.runtime.bundle`) export, and what
programs run under an emulator (:mod:`polyfuse.runtime.cross`) call.
"""

from __future__ import annotations

from collections.abc import Callable

import llvmlite.binding as llvm
from llvmlite import ir

from polyfuse.runtime.instructions import Copy, Increment, Instruction, Jump, JumpIfAtLeast, JumpUnless, Location, Run, Set
from polyfuse.runtime.program import ARENA, CONSTANT, ERROR, INPUT, OUTPUT, ProgramLayout
from polyfuse.targets import Target
from polyfuse.targets.cpu import parse_module, target_machine
from polyfuse.targets.llvm_kernel import PARALLEL_FOR
from polyfuse.targets.llvm_tiles import ask_for_tiles, uses_tiles

_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
_PTR = _I8.as_pointer()


def link_program(layout: ProgramLayout, target: Target, entry: str,
                 weight_offsets: dict[str, int], threads: bool = False) -> llvm.ModuleRef:
    """The kernels of ``layout`` and an entry point named ``entry`` in one LLVM module
    for ``target``; the parallel-for is a serial loop unless ``threads`` (then the
    module leaves it to polyfuse's thread pool, linked beside it)."""
    tm = target_machine(target)
    module = parse_module(_entry_module(layout, entry, weight_offsets, tm, threads),
                          f"the entry point of '{entry}'")
    kernels = []
    for j, call in enumerate(layout.calls):
        kernel = parse_module(call.stages["llvm_opt"], f"kernel '{call.label}'")
        name = call.executable.layout.name
        for fn in kernel.functions:
            if fn.is_declaration or fn.linkage != llvm.Linkage.external:
                continue
            fn.name = f"{entry}.k{j}" if fn.name == name else f"{entry}.k{j}.{fn.name}"
            kernels.append(fn.name)
        module.link_in(kernel)
    for fn in module.functions:   # only the entry point (and the pool's ABI) stay visible
        if fn.name in kernels or fn.name == PARALLEL_FOR and not threads:
            fn.linkage = llvm.Linkage.internal
    module.verify()
    return module


def _entry_module(layout: ProgramLayout, entry: str, weight_offsets: dict[str, int],
                  tm: llvm.TargetMachine, threads: bool) -> str:
    """``int entry(weights, activations, inputs, outputs)``: the calls in order, each
    with its zero-fills and argument array, then the outputs that are copies."""
    module = ir.Module(name=entry)
    module.triple = tm.triple
    module.data_layout = str(tm.target_data)
    fn = ir.Function(module, ir.FunctionType(_I32, [_PTR, _PTR, _PTR.as_pointer(), _PTR.as_pointer()]), entry)
    weights, activations, inputs, outputs = fn.args
    for arg, name in zip(fn.args, ("weights", "activations", "inputs", "outputs")):
        arg.name = name
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    memset = ir.Function(module, ir.FunctionType(ir.VoidType(), [_PTR, _I8, _I64, ir.IntType(1)]),
                         "llvm.memset.p0.i64")
    memcpy = ir.Function(module, ir.FunctionType(ir.VoidType(), [_PTR, _PTR, _I64, ir.IntType(1)]),
                         "llvm.memcpy.p0.p0.i64")
    memmove = ir.Function(module, ir.FunctionType(ir.VoidType(), [_PTR, _PTR, _I64, ir.IntType(1)]),
                          "llvm.memmove.p0.p0.i64")
    if any(uses_tiles(c.stages["llvm_opt"]) for c in layout.calls):
        ask_for_tiles(b)
    error = b.alloca(_I64, name="error")
    b.store(ir.Constant(_I64, 0), error)
    most = max((len(c.args) for c in layout.calls), default=1)
    args = b.alloca(ir.ArrayType(_PTR, most), name="args")
    slot_output = {what: k for k, (_, how, what) in enumerate(layout.results) if how == "slot"}

    def pointer(base: int, index: object, offset: int) -> ir.Value:
        if base == ARENA:
            return b.gep(activations, [ir.Constant(_I64, offset)])
        if base == CONSTANT:
            return b.gep(weights, [ir.Constant(_I64, weight_offsets[index] + offset)])
        if base == ERROR:
            return b.bitcast(error, _PTR)
        start = b.load(b.gep(inputs, [ir.Constant(_I64, index)])) if base == INPUT \
            else output(slot_output[index])
        return b.gep(start, [ir.Constant(_I64, offset)]) if offset else start

    def output(k: int) -> ir.Value:
        return b.load(b.gep(outputs, [ir.Constant(_I64, k)]))

    kernels = [ir.Function(module, ir.FunctionType(ir.VoidType(), [_PTR.as_pointer()]), f"{entry}.k{j}")
               for j in range(len(layout.calls))]
    # a block per instruction (jumps land on them), and one after the last
    blocks = [fn.append_basic_block(f"i{k}") for k in range(len(layout.code) + 1)]
    b.branch(blocks[0])
    for k, ins in enumerate(layout.code):
        b.position_at_end(blocks[k])
        after = blocks[k + 1]
        if isinstance(ins, Run):
            call = layout.calls[ins.call]
            places = [pointer(*a) for a in call.args]
            for position, nbytes in call.zero:
                b.call(memset, [places[position], ir.Constant(_I8, 0), ir.Constant(_I64, nbytes),
                                ir.Constant(ir.IntType(1), 0)])
            for j, p in enumerate(places):
                b.store(p, b.gep(args, [ir.Constant(_I32, 0), ir.Constant(_I32, j)]))
            b.call(kernels[ins.call], [b.gep(args, [ir.Constant(_I32, 0), ir.Constant(_I32, 0)])])
            if any(base == ERROR for base, _, _ in call.args):
                failed = b.icmp_signed("!=", b.load(error), ir.Constant(_I64, 0))
                with b.if_then(failed, likely=False):
                    b.ret(ir.Constant(_I32, ins.call + 1))
            b.branch(after)
        else:
            jumps = isinstance(ins, (Jump, JumpUnless, JumpIfAtLeast))
            _instruction(b, ins, pointer, blocks[ins.target] if jumps else after, after, memmove)
    b.position_at_end(blocks[-1])
    for k, (t, (name, how, what)) in enumerate(zip(layout.outputs, layout.results)):
        source = {"copy-slot": (OUTPUT, what, 0), "copy-input": (INPUT, what, 0),
                  "constant": (CONSTANT, what, 0)}.get(how)
        if source is not None:
            b.call(memcpy, [output(k), pointer(*source),
                            ir.Constant(_I64, t.nbytes), ir.Constant(ir.IntType(1), 0)])
    b.ret(ir.Constant(_I32, 0))
    if not threads:
        _serial_parallel_for(module)
    return str(module)


def _instruction(b: ir.IRBuilder, ins: Instruction, pointer: Callable[..., ir.Value], target: ir.Block,
                 after: ir.Block, memmove: ir.Function) -> None:
    """One instruction other than a call (see :mod:`polyfuse.runtime.instructions`), ending
    its block with a branch to ``after`` or to the block of its ``target``."""
    def load(location: Location, bits: int) -> ir.Value:
        return b.load(b.bitcast(pointer(*location), ir.IntType(bits).as_pointer()))

    if isinstance(ins, Copy):
        dst = pointer(*ins.dst)
        if ins.row is not None:
            dst = b.gep(dst, [b.mul(load(ins.row, 64), ir.Constant(_I64, ins.nbytes))])
        b.call(memmove, [dst, pointer(*ins.src), ir.Constant(_I64, ins.nbytes), ir.Constant(ir.IntType(1), 0)])
    elif isinstance(ins, Set):
        kind = ir.IntType(8 * ins.nbytes)
        b.store(ir.Constant(kind, ins.value), b.bitcast(pointer(*ins.dst), kind.as_pointer()))
    elif isinstance(ins, Increment):
        at = b.bitcast(pointer(*ins.counter), _I64.as_pointer())
        b.store(b.add(b.load(at), ir.Constant(_I64, 1)), at)
    elif isinstance(ins, JumpUnless):
        b.cbranch(b.icmp_unsigned("!=", load(ins.cond, 8), ir.Constant(_I8, 0)), after, target)
        return
    elif isinstance(ins, JumpIfAtLeast):
        b.cbranch(b.icmp_signed(">=", load(ins.counter, 64), load(ins.limit, 64)), target, after)
        return
    b.branch(target)


def _serial_parallel_for(module: ir.Module) -> None:
    """The parallel-for ABI as a plain call of the body over the whole range."""
    body_type = ir.FunctionType(ir.VoidType(), [_I64, _I64, _PTR]).as_pointer()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [body_type, _I64, _PTR, _I64]), PARALLEL_FOR)
    body, n, ctx, _ = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    with b.if_then(b.icmp_signed(">", n, ir.Constant(_I64, 0))):
        b.call(body, [ir.Constant(_I64, 0), n, ctx])
    b.ret_void()
