"""The ``dot4`` builtin (4 unsigned bytes times 4 signed bytes, summed) on CPUs.

Where the target has AVX512-VNNI, a dot product added to an accumulator (``acc +
dot4(a, b)``, what a register block of an integer product sums) is a call of
:data:`SCALAR`, an opaque function of ``(acc, a, b)``. The call names vector versions
of it (LLVM's ``vector-function-abi-variant``, plain and masked, 16 lanes), so LLVM's
loop vectorizer widens a loop of such calls over output channels into calls of the
vector versions, one ``vpdpbusd`` each, while the accumulators stay in registers around
them (the functions read no memory). Their bodies are linked and inlined once the module
is optimized (:func:`inline_dot_products`): defined from the start, the inliner would
expand the scalar version before the vectorizer saw the call.

Elsewhere (no VNNI, aarch64) ``dot4`` is straight-line byte arithmetic in int32, which
vectorizes like any other.
"""

from __future__ import annotations

import re

import llvmlite.binding as llvm
from llvmlite import ir

SCALAR = "polyfuse_dot4"
LANES = 16
_VECTOR, _MASKED = f"{SCALAR}_v{LANES}", f"{SCALAR}_m{LANES}"
_I32 = ir.IntType(32)
_VNNI = f"llvm.x86.avx512.vpdpbusd.{32 * LANES}"

# what replaces the plain declaration llvmlite prints: the variants the vectorizer may use
# (kept alive until then by llvm.compiler.used)
_DECLARATIONS = f"""declare i32 @{SCALAR}(i32, i32, i32) #{{attrs}}
declare <{LANES} x i32> @{_VECTOR}(<{LANES} x i32>, <{LANES} x i32>, <{LANES} x i32>) #{{pure}}
declare <{LANES} x i32> @{_MASKED}(<{LANES} x i32>, <{LANES} x i32>, <{LANES} x i32>, <{LANES} x i1>) #{{pure}}
@llvm.compiler.used = appending global [2 x ptr] [ptr @{_VECTOR}, ptr @{_MASKED}], section "llvm.metadata"
attributes #{{attrs}} = {{ nounwind willreturn memory(none) "vector-function-abi-variant"="_ZGV_LLVM_N{LANES}vvv_{SCALAR}({_VECTOR}),_ZGV_LLVM_M{LANES}vvv_{SCALAR}({_MASKED})" }}
attributes #{{pure}} = {{ nounwind willreturn memory(none) }}
"""

_DEFINITIONS = f"""
define linkonce_odr i32 @{SCALAR}(i32 %acc, i32 %a, i32 %b) #0 {{
  %av = bitcast i32 %a to <4 x i8>
  %bv = bitcast i32 %b to <4 x i8>
  %az = zext <4 x i8> %av to <4 x i32>
  %bs = sext <4 x i8> %bv to <4 x i32>
  %m = mul <4 x i32> %az, %bs
  %s = call i32 @llvm.vector.reduce.add.v4i32(<4 x i32> %m)
  %r = add i32 %acc, %s
  ret i32 %r
}}
define linkonce_odr <{LANES} x i32> @{_VECTOR}(<{LANES} x i32> %acc, <{LANES} x i32> %a, <{LANES} x i32> %b) #0 {{
  %av = bitcast <{LANES} x i32> %a to <{4 * LANES} x i8>
  %bv = bitcast <{LANES} x i32> %b to <{4 * LANES} x i8>
  %r = call <{LANES} x i32> @{_VNNI}(<{LANES} x i32> %acc, <{4 * LANES} x i8> %av, <{4 * LANES} x i8> %bv)
  ret <{LANES} x i32> %r
}}
define linkonce_odr <{LANES} x i32> @{_MASKED}(<{LANES} x i32> %acc, <{LANES} x i32> %a, <{LANES} x i32> %b, <{LANES} x i1> %mask) #0 {{
  %r = call <{LANES} x i32> @{_VECTOR}(<{LANES} x i32> %acc, <{LANES} x i32> %a, <{LANES} x i32> %b)
  %m = select <{LANES} x i1> %mask, <{LANES} x i32> %r, <{LANES} x i32> %acc
  ret <{LANES} x i32> %m
}}
declare i32 @llvm.vector.reduce.add.v4i32(<4 x i32>)
declare <{LANES} x i32> @{_VNNI}(<{LANES} x i32>, <{4 * LANES} x i8>, <{4 * LANES} x i8>)
attributes #0 = {{ alwaysinline nounwind willreturn memory(none) }}
"""


def dot4(module: ir.Module, acc: ir.Value, a: ir.Value, b: ir.Value, builder: ir.IRBuilder,
         vnni: bool) -> ir.Value:
    """``acc + dot4(a, b)`` in int32 (wrapping), of and to i64 registers."""
    acc32, a32, b32 = (builder.trunc(v, _I32) for v in (acc, a, b))
    if vnni:
        fn = module.globals.get(SCALAR) or ir.Function(
            module, ir.FunctionType(_I32, [_I32] * 3), SCALAR)
        total = builder.call(fn, [acc32, a32, b32])
    else:
        total = acc32
        for shift in range(0, 32, 8):
            unsigned = builder.and_(builder.lshr(a32, ir.Constant(_I32, shift)), ir.Constant(_I32, 255))
            signed = builder.ashr(builder.shl(b32, ir.Constant(_I32, 24 - shift)), ir.Constant(_I32, 24))
            total = builder.add(total, builder.mul(unsigned, signed))
    return builder.sext(total, ir.IntType(64))


def declare_variants(text: str) -> str:
    """Module text whose plain declaration of :data:`SCALAR` (if any) names its vector
    variants (llvmlite cannot print the attributes)."""
    attrs = 1 + max((int(n) for n in re.findall(r"^attributes #(\d+)", text, re.M)), default=0)
    declaration = re.compile(rf'^declare i32 @"?{SCALAR}"?\(.*\)$', re.M)
    text_of = _DECLARATIONS.replace("{attrs}", str(attrs)).replace("{pure}", str(attrs + 1))
    return declaration.sub(lambda _: text_of.rstrip(), text)


def inline_dot_products(module: llvm.ModuleRef, tm: llvm.TargetMachine) -> None:
    """Link the bodies of :data:`SCALAR` and its vector versions into an optimized
    ``module`` that calls them, and inline them."""
    if not {f.name for f in module.functions} & {SCALAR, _VECTOR, _MASKED}:
        return   # (the optimizer drops the scalar version where every call was widened)
    module.link_in(llvm.parse_assembly(_DEFINITIONS))
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
    passes = llvm.create_new_module_pass_manager()
    passes.add_always_inliner_pass()
    passes.add_instruction_combine_pass()
    passes.add_simplify_cfg_pass()
    passes.add_global_dead_code_eliminate_pass()
    passes.run(module, pb)
