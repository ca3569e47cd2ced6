"""The dot-product builtins on CPUs: ``dot4`` (4 unsigned bytes times 4 signed bytes,
summed in int32) and ``bfdot2`` (2 bfloat16 times 2 bfloat16, summed in float32).

Where the target has the instruction (:data:`ISAS`: AVX512-VNNI's ``vpdpbusd``,
AVX512-BF16's ``vdpbf16ps``, NEON's ``usdot`` with I8MM, its ``sdot`` with DotProd, the
unsigned bytes offset), a dot product added to an accumulator (``acc + dot4(a, b)``,
what a register block of a product sums) is a call of an opaque function of
``(acc, a, b)`` (:attr:`Dot.scalar`). The call names vector versions of it (LLVM's
``vector-function-abi-variant``, plain and masked, 16 lanes on AVX-512, 4 on NEON), so
LLVM's loop vectorizer widens a loop of such calls over output channels into calls of
the vector versions, an instruction or a few each, while the accumulators stay in
registers around them (the functions read no memory). Their bodies are linked and
inlined once the module is optimized (:func:`inline_dot_products`): defined from the
start, the inliner would expand the scalar version before the vectorizer saw the call.

Elsewhere (no such instruction; bfloat16 on aarch64) a dot product is straight-line
arithmetic, which vectorizes like any other: bytes in int32, or bfloat16 halves widened
to float32 (exactly: a bfloat16 is a float32's upper half) and added to the accumulator
in ``vdpbf16ps``'s order, the upper halves' product first, so both forms round alike.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import llvmlite.binding as llvm
from llvmlite import ir

_I32, _I64, _F32 = ir.IntType(32), ir.IntType(64), ir.FloatType()


@dataclass(frozen=True)
class Isa:
    """An instruction that sums dot products into ``lanes`` int32 or float32
    accumulators: ``instruction`` (an LLVM intrinsic of the accumulators and the words
    as ``operand``) of architecture ``arch`` (the triple's first part) with ``feature``.
    ``body``: the vector version's instructions of %acc, %a and %b (``{v}``: the
    accumulators' type, ``{w}``: the words'), ending in %r; by default the instruction
    applied to them."""

    builtin: str
    arch: str
    feature: str
    lanes: int
    instruction: str
    operand: str
    body: str = field(repr=False, default="""  %av = bitcast {w} %a to {operand}
  %bv = bitcast {w} %b to {operand}
  %r = call {v} @{instruction}({v} %acc, {operand} %av, {operand} %bv)""")


@dataclass(frozen=True)
class Dot:
    """A dot-product builtin of two int32 words summed into an accumulator of type ``acc``
    (LLVM's name of it), as a call of :attr:`scalar` where an :class:`Isa` sums it."""

    builtin: str
    acc: str
    scalar_body: str   # of %acc, %a and %b, ending in %r
    fallback: Callable[[ir.Value, ir.Value, ir.Value, ir.IRBuilder], ir.Value]
    intrinsics: str = ""   # declarations the scalar body needs

    @property
    def scalar(self) -> str:
        return f"polyfuse_{self.builtin}"

    def vector(self, isa: Isa) -> str:
        return f"{self.scalar}_v{isa.lanes}"

    def masked(self, isa: Isa) -> str:
        return f"{self.scalar}_m{isa.lanes}"

    def declarations(self, isa: Isa, attrs: int) -> str:
        """What replaces the plain declaration llvmlite prints: the variants the vectorizer
        may use."""
        n = isa.lanes
        v, w = f"<{n} x {self.acc}>", f"<{n} x i32>"
        return f"""declare {self.acc} @{self.scalar}({self.acc}, i32, i32) #{attrs}
declare {v} @{self.vector(isa)}({v}, {w}, {w}) #{attrs + 1}
declare {v} @{self.masked(isa)}({v}, {w}, {w}, <{n} x i1>) #{attrs + 1}
attributes #{attrs} = {{ nounwind willreturn memory(none) "vector-function-abi-variant"="_ZGV_LLVM_N{n}vvv_{self.scalar}({self.vector(isa)}),_ZGV_LLVM_M{n}vvv_{self.scalar}({self.masked(isa)})" }}
attributes #{attrs + 1} = {{ nounwind willreturn memory(none) }}"""

    def definitions(self, isa: Isa) -> str:
        n = isa.lanes
        v, w = f"<{n} x {self.acc}>", f"<{n} x i32>"
        body = isa.body.format(v=v, w=w, operand=isa.operand, instruction=isa.instruction)
        return f"""
define linkonce_odr {self.acc} @{self.scalar}({self.acc} %acc, i32 %a, i32 %b) #0 {{
{self.scalar_body}
  ret {self.acc} %r
}}
define linkonce_odr {v} @{self.vector(isa)}({v} %acc, {w} %a, {w} %b) #0 {{
{body}
  ret {v} %r
}}
define linkonce_odr {v} @{self.masked(isa)}({v} %acc, {w} %a, {w} %b, <{n} x i1> %mask) #0 {{
  %r = call {v} @{self.vector(isa)}({v} %acc, {w} %a, {w} %b)
  %m = select <{n} x i1> %mask, {v} %r, {v} %acc
  ret {v} %m
}}
declare {v} @{isa.instruction}({v}, {isa.operand}, {isa.operand})
{self.intrinsics}
attributes #0 = {{ alwaysinline nounwind willreturn memory(none) }}
"""


def _bytes(acc: ir.Value, a: ir.Value, b: ir.Value, builder: ir.IRBuilder) -> ir.Value:
    """``acc + dot4(a, b)`` in int32 byte arithmetic."""
    total = acc
    for shift in range(0, 32, 8):
        unsigned = builder.and_(builder.lshr(a, ir.Constant(_I32, shift)), ir.Constant(_I32, 255))
        signed = builder.ashr(builder.shl(b, ir.Constant(_I32, 24 - shift)), ir.Constant(_I32, 24))
        total = builder.add(total, builder.mul(unsigned, signed))
    return total


def _halves(word: ir.Value, builder: ir.IRBuilder) -> tuple[ir.Value, ir.Value]:
    """The upper and lower bfloat16 of an int32 word, as float32."""
    upper = builder.and_(word, ir.Constant(_I32, -65536))
    lower = builder.shl(word, ir.Constant(_I32, 16))
    return builder.bitcast(upper, _F32), builder.bitcast(lower, _F32)


def _bfloats(acc: ir.Value, a: ir.Value, b: ir.Value, builder: ir.IRBuilder) -> ir.Value:
    """``acc + bfdot2(a, b)`` in float32, ``vdpbf16ps``'s order (products are exact)."""
    (a1, a0), (b1, b0) = _halves(a, builder), _halves(b, builder)
    return builder.fadd(builder.fadd(acc, builder.fmul(a1, b1)), builder.fmul(a0, b0))


DOTS: dict[str, Dot] = {d.builtin: d for d in (
    Dot("dot4", "i32", """  %av = bitcast i32 %a to <4 x i8>
  %bv = bitcast i32 %b to <4 x i8>
  %az = zext <4 x i8> %av to <4 x i32>
  %bs = sext <4 x i8> %bv to <4 x i32>
  %m = mul <4 x i32> %az, %bs
  %s = call i32 @llvm.vector.reduce.add.v4i32(<4 x i32> %m)
  %r = add i32 %acc, %s""", _bytes, "declare i32 @llvm.vector.reduce.add.v4i32(<4 x i32>)"),
    Dot("bfdot2", "float", """  %a1 = and i32 %a, -65536
  %b1 = and i32 %b, -65536
  %a0 = shl i32 %a, 16
  %b0 = shl i32 %b, 16
  %fa1 = bitcast i32 %a1 to float
  %fb1 = bitcast i32 %b1 to float
  %fa0 = bitcast i32 %a0 to float
  %fb0 = bitcast i32 %b0 to float
  %p1 = fmul float %fa1, %fb1
  %s1 = fadd float %acc, %p1
  %p0 = fmul float %fa0, %fb0
  %r = fadd float %s1, %p0""", _bfloats),
)}


# SDOT sums signed bytes only: the unsigned ones are offset, a = (a ^ 0x80) + 128 as
# signed bytes, so acc + dot4(a, b) = sdot(acc, a ^ 0x80808080, b) + 128 sdot(0, 0x01010101, b)
_SDOT_BODY = """  %ax = xor {w} %a, splat (i32 -2139062144)
  %av = bitcast {w} %ax to {operand}
  %bv = bitcast {w} %b to {operand}
  %s = call {v} @{instruction}({v} %acc, {operand} %av, {operand} %bv)
  %t = call {v} @{instruction}({v} zeroinitializer, {operand} splat (i8 1), {operand} %bv)
  %t128 = shl {v} %t, splat (i32 7)
  %r = add {v} %s, %t128"""

# by preference: the first an architecture's target has is used
ISAS: tuple[Isa, ...] = (
    Isa("dot4", "x86_64", "avx512vnni", 16, "llvm.x86.avx512.vpdpbusd.512", "<64 x i8>"),
    Isa("bfdot2", "x86_64", "avx512bf16", 16, "llvm.x86.avx512bf16.dpbf16ps.512", "<32 x bfloat>"),
    Isa("dot4", "aarch64", "i8mm", 4, "llvm.aarch64.neon.usdot.v4i32.v16i8", "<16 x i8>"),
    Isa("dot4", "aarch64", "dotprod", 4, "llvm.aarch64.neon.sdot.v4i32.v16i8", "<16 x i8>", _SDOT_BODY),
)


def dot(fn: str, module: ir.Module, acc: ir.Value, a: ir.Value, b: ir.Value,
        builder: ir.IRBuilder, native: bool) -> ir.Value:
    """``acc + fn(a, b)`` of registers (i64 integers or a float), ``native``: as the call
    the vectorizer widens into the target's instruction."""
    d = DOTS[fn]
    a32, b32 = builder.trunc(a, _I32), builder.trunc(b, _I32)
    integer = d.acc == "i32"
    acc = builder.trunc(acc, _I32) if integer else acc
    if native:
        ty = acc.type
        f = module.globals.get(d.scalar) or ir.Function(module, ir.FunctionType(ty, [ty, _I32, _I32]),
                                                        d.scalar)
        total = builder.call(f, [acc, a32, b32])
    else:
        total = d.fallback(acc, a32, b32, builder)
    return builder.sext(total, _I64) if integer else total


def zero(fn: str) -> ir.Constant:
    """The accumulator of a dot product standing alone."""
    return ir.Constant(_I64, 0) if DOTS[fn].acc == "i32" else ir.Constant(_F32, 0.0)


def declare_variants(text: str, native: Mapping[str, Isa]) -> str:
    """Module text whose plain declarations of the dot products' scalar functions (if
    any) name their vector variants for the instructions ``native`` (builtin -> ISA)
    (llvmlite cannot print the attributes), which llvm.compiler.used keeps alive until
    the vectorizer has had its chance."""
    kept = []
    for fn, isa in native.items():
        d = DOTS[fn]
        attrs = 1 + max((int(n) for n in re.findall(r"^attributes #(\d+)", text, re.M)), default=0)
        declaration = re.compile(rf'^declare {d.acc} @"?{d.scalar}"?\(.*\)$', re.M)
        text, found = declaration.subn(lambda _, d=d, isa=isa, attrs=attrs: d.declarations(isa, attrs), text)
        kept += [d.vector(isa), d.masked(isa)] * found
    if not kept:
        return text
    pointers = ", ".join(f"ptr @{name}" for name in kept)
    return (f"{text}\n@llvm.compiler.used = appending global [{len(kept)} x ptr] [{pointers}], "
            'section "llvm.metadata"\n')


def inline_dot_products(module: llvm.ModuleRef, tm: llvm.TargetMachine, native: Mapping[str, Isa]) -> None:
    """Link the bodies of the dot products' scalar functions and vector versions (for
    the instructions ``native``) into an optimized ``module`` that calls them, and
    inline them."""
    names = {f.name for f in module.functions}
    # (the optimizer drops a scalar version where every call was widened)
    used = [(DOTS[fn], isa) for fn, isa in native.items()
            if names & {DOTS[fn].scalar, DOTS[fn].vector(isa), DOTS[fn].masked(isa)}]
    if not used:
        return
    for d, isa in used:
        module.link_in(llvm.parse_assembly(d.definitions(isa)))
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
    passes = llvm.create_new_module_pass_manager()
    passes.add_always_inliner_pass()
    passes.add_instruction_combine_pass()
    passes.add_simplify_cfg_pass()
    passes.add_global_dead_code_eliminate_pass()
    passes.run(module, pb)
