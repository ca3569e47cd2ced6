"""Matrix tiles on x86 (AMX): the code of a :class:`~polyfuse.ir.loops.TileProduct`.

A tile is 16 rows of 64 bytes; ``tdpbf16ps`` adds to a tile of 16 x 16 float32 the
products of a tile of 16 rows of 16 words (2 bfloat16 each) and a tile of 16 words of 16
columns (``tdpbusd``: int32 sums, words of 4 unsigned and 4 signed bytes, ``dot4``'s).
A block of up to 32 x 32 outputs is 2 x 2 accumulator tiles, loaded once, updated over
the whole depth 16 words at a time (2 tiles of each operand per step, 8 tiles in all),
and stored once. Tiles at the block's edges take fewer rows or bytes:
shapes are operands of LLVM's tile intrinsics, and LLVM configures the tiles
(``ldtilecfg``) from them. A depth that is not whole steps ends in a step of fewer words
(a function of its own).

The kernel's emitter calls a function per block shape (:func:`calls`), ``polyfuse_tiles_
<builtin>_<rows>x<cols>x<depth>_<ldc>_<lda>_<ldb>(acc, a, b)`` of the block's first
element of each operand (the steps between rows in elements are part of the name); its
body is written here in LLVM's text (llvmlite has no ``x86_amx`` type) and linked into
the optimized module (:func:`link_tile_products`). It is not inlined: each call configures the tiles
for its own shapes (``ldtilecfg``, ``tilerelease`` on return), a few cycles against the
hundreds of a block's products, while blocks of several shapes inlined into one kernel
made LLVM's allocator spill tiles to the stack around every product (5x slower).
Linux lets a process use the tiles once it asks (:func:`polyfuse.targets.cpu.native_tiles`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import llvmlite.binding as llvm
from llvmlite import ir

ROWS, BYTES = 16, 64      # a tile
WORD = 4                  # bytes of an accumulator (float32, int32) and of a word
# arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): Linux's permission to use the tiles
PERMISSION = (158, 0x1023, 18)


@dataclass(frozen=True)
class Tiles:
    """The tile instruction that sums ``builtin``'s words, and the CPU feature it needs."""

    builtin: str
    feature: str
    instruction: str


TILES: dict[str, Tiles] = {t.builtin: t for t in (Tiles("bfdot2", "amx-bf16", "tdpbf16ps"),
                                                   Tiles("dot4", "amx-int8", "tdpbusd"))}

_NAME = re.compile(r"polyfuse_tiles_(\w+?)_(\d+)x(\d+)x(\d+)_(\d+)_(\d+)_(\d+)")


def calls(builtin: str, shape: tuple[int, int, int], steps: tuple[int, int, int]) -> list[tuple[str, int, int]]:
    """The block functions that sum a block of ``shape``, each with the elements its ``a``
    and ``b`` start after the block's: one for the whole steps of 16 words, one for a
    last, partial step. (In one function, the partial step's tiles of other shapes ran
    LLVM's allocator out of tiles: it configures the tiles once, on entry.)"""
    rows, cols, depth = shape
    whole = depth - depth % (BYTES // WORD)
    parts = [(0, whole)] if whole else []
    parts += [(whole, depth - whole)] if depth > whole else []
    return [(f"polyfuse_tiles_{builtin}_{rows}x{cols}x{words}_{'_'.join(map(str, steps))}", k, k * steps[2])
            for k, words in parts]


def definition(name: str) -> str:
    """The LLVM text of the block function ``name`` (see the module docstring)."""
    m = _NAME.fullmatch(name)
    assert m is not None, name
    op = TILES[m.group(1)].instruction
    rows, cols, depth, ldc, lda, ldb = (int(g) for g in m.groups()[1:])
    row_tiles = [min(ROWS, rows - i) for i in range(0, rows, ROWS)]
    col_bytes = [WORD * min(ROWS, cols - j) for j in range(0, cols, ROWS)]
    steps, rest = divmod(depth, BYTES // WORD)
    assert not (steps and rest), name   # see calls()
    lines = [f"define linkonce_odr void @{name}(ptr %c, ptr %a, ptr %b) #0 {{", "entry:"]

    def at(base: str, offset: str, out: str) -> None:   # offset: in elements of 4 bytes
        lines.append(f"  %{out} = getelementptr inbounds i32, ptr %{base}, i64 {offset}")

    def load(out: str, shape: tuple[int, int], ptr: str, stride: int) -> None:
        lines.append(f"  %{out} = call x86_amx @llvm.x86.tileloadd64.internal(i16 {shape[0]}, "
                     f"i16 {shape[1]}, ptr %{ptr}, i64 {stride * WORD})")

    def product(out: str, m: int, n: int, k: int, acc: str, a: str, b: str) -> None:
        lines.append(f"  %{out} = call x86_amx @llvm.x86.{op}.internal(i16 {m}, i16 {n}, i16 {k}, "
                     f"x86_amx %{acc}, x86_amx %{a}, x86_amx %{b})")

    def step(k: str, words: int, tag: str, accs: dict[tuple[int, int], str]) -> dict[tuple[int, int], str]:
        """One step of ``words`` words at word ``k`` (an i64 value's text): the new
        accumulators. Whole steps load each operand tile once for 2 products; the last,
        partial one loads them for each product (tiles of other shapes than the loop's
        ran LLVM's allocator out of tiles)."""
        out = {}
        for (i, j), acc in accs.items():
            a, b = (f"{tag}{i}", f"{tag}{j}") if tag == "l" else (f"{tag}{i}{j}", f"{tag}{i}{j}")
            if tag != "l" or j == 0:
                lines.append(f"  %ak{a} = add i64 {k}, {ROWS * i * lda}")
                at("a", f"%ak{a}", f"pa{a}")
                load(f"ta{a}", (row_tiles[i], WORD * words), f"pa{a}", lda)
            if tag != "l" or i == 0:
                lines.append(f"  %bk{b} = mul i64 {k}, {ldb}")
                lines.append(f"  %bj{b} = add i64 %bk{b}, {ROWS * j}")
                at("b", f"%bj{b}", f"pb{b}")
                load(f"tb{b}", (words, col_bytes[j]), f"pb{b}", ldb)
            out[i, j] = f"d{tag}{i}{j}"
            product(out[i, j], row_tiles[i], col_bytes[j], WORD * words, acc, f"ta{a}", f"tb{b}")
        return out

    accs = {}
    for i, r in enumerate(row_tiles):
        for j, n in enumerate(col_bytes):
            at("c", str(ROWS * i * ldc + ROWS * j), f"pc{i}{j}")
            load(f"c{i}{j}", (r, n), f"pc{i}{j}", ldc)
            accs[i, j] = f"c{i}{j}"
    if steps:
        lines += ["  br label %loop", "loop:", "  %s = phi i64 [0, %entry], [%s1, %loop]"]
        phis = {key: f"acc{key[0]}{key[1]}" for key in accs}
        for key, name_ in phis.items():
            lines.append(f"  %{name_} = phi x86_amx [%{accs[key]}, %entry], [%dl{key[0]}{key[1]}, %loop]")
        lines.append(f"  %k = mul i64 %s, {BYTES // WORD}")
        accs = step("%k", BYTES // WORD, "l", phis)
        lines += ["  %s1 = add i64 %s, 1", f"  %more = icmp ult i64 %s1, {steps}",
                  "  br i1 %more, label %loop, label %done", "done:"]
    else:
        accs = step("0", rest, "r", accs)
    for (i, j), acc in accs.items():
        at("c", str(ROWS * i * ldc + ROWS * j), f"qc{i}{j}")
        lines.append(f"  call void @llvm.x86.tilestored64.internal(i16 {row_tiles[i]}, i16 {col_bytes[j]}, "
                     f"ptr %qc{i}{j}, i64 {ldc * WORD}, x86_amx %{acc})")
    lines += ["  ret void", "}", f"declare x86_amx @llvm.x86.{op}.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)",
              "declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)",
              "declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)",
              "attributes #0 = { noinline nounwind }"]
    return "\n".join(lines) + "\n"


def uses_tiles(llvm_text: str) -> bool:
    """Whether a kernel's optimized LLVM text calls a block function."""
    return _NAME.search(llvm_text) is not None


def ask_for_tiles(b: ir.IRBuilder) -> None:
    """Code that asks Linux for the tiles (:data:`PERMISSION`, through libc's ``syscall``):
    what an ahead-of-time bundle's entry point does before its kernels run, in a program
    that polyfuse's runtime never asked for it. Asking again when granted is harmless."""
    i64 = ir.IntType(64)
    module = b.module
    syscall = module.globals.get("syscall") or ir.Function(module, ir.FunctionType(i64, [i64], var_arg=True),
                                                           "syscall")
    b.call(syscall, [ir.Constant(i64, v) for v in PERMISSION])


def link_tile_products(module: llvm.ModuleRef) -> None:
    """Link the bodies of the block functions an optimized ``module`` calls."""
    for name in sorted(f.name for f in module.functions if _NAME.fullmatch(f.name)):
        module.link_in(llvm.parse_assembly(definition(name)))
