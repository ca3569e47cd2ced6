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
made LLVM's allocator spill tiles to the stack around every product (benchmarks/LOG.md).
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
    return _Block(name, TILES[m.group(1)].instruction, *(int(g) for g in m.groups()[1:])).text()


class _Block:
    """The text of one block function: accumulator tiles loaded, a loop of whole steps
    (or one partial step), the accumulators stored. Offsets count elements of 4 bytes."""

    def __init__(self, name: str, op: str, rows: int, cols: int, depth: int, ldc: int, lda: int,
                 ldb: int) -> None:
        self.name, self.op, self.ldc, self.lda, self.ldb = name, op, ldc, lda, ldb
        self.rows = [min(ROWS, rows - i) for i in range(0, rows, ROWS)]          # per row tile
        self.bytes = [WORD * min(ROWS, cols - j) for j in range(0, cols, ROWS)]  # per column tile
        self.steps, self.rest = divmod(depth, BYTES // WORD)
        assert not (self.steps and self.rest), name   # see calls()
        self.lines = [f"define linkonce_odr void @{name}(ptr %c, ptr %a, ptr %b) #0 {{", "entry:"]

    def text(self) -> str:
        accs = {(i, j): self.load(f"c{i}{j}", "c", str(ROWS * (i * self.ldc + j)), (r, n), self.ldc)
                for i, r in enumerate(self.rows) for j, n in enumerate(self.bytes)}
        accs = self.loop(accs) if self.steps else self.step("0", self.rest, "r", accs)
        for (i, j), acc in accs.items():
            self.emit(f"%qc{i}{j} = getelementptr inbounds i32, ptr %c, i64 {ROWS * (i * self.ldc + j)}",
                      f"call void @llvm.x86.tilestored64.internal(i16 {self.rows[i]}, i16 {self.bytes[j]}, "
                      f"ptr %qc{i}{j}, i64 {self.ldc * WORD}, x86_amx %{acc})")
        self.emit("ret void")
        return "\n".join(self.lines + ["}", f"declare x86_amx @llvm.x86.{self.op}.internal(i16, i16, i16, "
                                             "x86_amx, x86_amx, x86_amx)",
                                        "declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)",
                                        "declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)",
                                        "attributes #0 = { noinline nounwind }"]) + "\n"

    def emit(self, *lines: str) -> None:
        self.lines += [f"  {line}" for line in lines]

    def load(self, out: str, base: str, offset: str, shape: tuple[int, int], stride: int) -> str:
        """Tile ``out`` of ``shape`` (rows, bytes) at element ``offset`` of ``base``."""
        self.emit(f"%p{out} = getelementptr inbounds i32, ptr %{base}, i64 {offset}",
                  f"%{out} = call x86_amx @llvm.x86.tileloadd64.internal(i16 {shape[0]}, i16 {shape[1]}, "
                  f"ptr %p{out}, i64 {stride * WORD})")
        return out

    def loop(self, accs: dict[tuple[int, int], str]) -> dict[tuple[int, int], str]:
        """The whole steps, the accumulators carried around the loop."""
        self.lines += ["  br label %loop", "loop:"]
        self.emit("%s = phi i64 [0, %entry], [%s1, %loop]")
        phis = {}
        for (i, j), acc in accs.items():
            phis[i, j] = f"acc{i}{j}"
            self.emit(f"%acc{i}{j} = phi x86_amx [%{acc}, %entry], [%dl{i}{j}, %loop]")
        self.emit(f"%k = mul i64 %s, {BYTES // WORD}")
        out = self.step("%k", BYTES // WORD, "l", phis)
        self.emit("%s1 = add i64 %s, 1", f"%more = icmp ult i64 %s1, {self.steps}",
                  "br i1 %more, label %loop, label %done")
        self.lines.append("done:")
        return out

    def step(self, k: str, words: int, tag: str, accs: dict[tuple[int, int], str]) -> dict[tuple[int, int], str]:
        """``words`` words from word ``k`` (an i64 value's text): each operand tile loaded
        once for 2 products; the new accumulators."""
        a, b = [], []
        for i, r in enumerate(self.rows):
            self.emit(f"%ak{tag}{i} = add i64 {k}, {ROWS * i * self.lda}")
            a.append(self.load(f"ta{tag}{i}", "a", f"%ak{tag}{i}", (r, WORD * words), self.lda))
        for j, n in enumerate(self.bytes):
            self.emit(f"%bk{tag}{j} = mul i64 {k}, {self.ldb}", f"%bj{tag}{j} = add i64 %bk{tag}{j}, {ROWS * j}")
            b.append(self.load(f"tb{tag}{j}", "b", f"%bj{tag}{j}", (words, n), self.ldb))
        out = {}
        for (i, j), acc in accs.items():
            out[i, j] = f"d{tag}{i}{j}"
            self.emit(f"%{out[i, j]} = call x86_amx @llvm.x86.{self.op}.internal(i16 {self.rows[i]}, "
                      f"i16 {self.bytes[j]}, i16 {WORD * words}, x86_amx %{acc}, x86_amx %{a[i]}, x86_amx %{b[j]})")
        return out


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
