"""Kernels compiled once for symbolic sizes (``define(..., sizes="symbolic")``): one
compiled kernel serves every size, checked against numpy at sizes no tile divides."""

import re

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.errors import ArgumentError, ShapeError
from polyfuse.ir.comprehension import Binary, BinaryOp, Call, IndexVar, Literal, ScalarRef
from polyfuse.ir.loops import For
from polyfuse.ir.types import DType
from polyfuse.runtime import cpu
from polyfuse.ir.cuts import aligned, prefix_cut
from polyfuse.scheduler.symbolic_facts import Facts
from tests.frontends.test_canonical_programs import _as_tuple, assert_outputs_match
from tests.tc_programs import PROGRAMS

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
CONV = """def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
  O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw)
}"""
SOFTMAX = """def softmax(float(N,D) X) -> (Y, mx, e, s) {
  mx(n) max=! X(n,d)
  e(n,d) = exp(X(n,d) - mx(n))
  s(n) +=! e(n,d)
  Y(n,d) = e(n,d) / s(n)
}"""


def _builds() -> int:
    """Kernels compiled or loaded from the disk cache so far in this process."""
    return cpu.STATS["compiled"] + cpu.STATS["disk"]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _conv(i: np.ndarray, w: np.ndarray) -> np.ndarray:
    n, c, h, wd = i.shape
    f, _, kh, kw = w.shape
    out = np.zeros((n, f, h - kh + 1, wd - kw + 1), np.float64)
    for a in range(kh):
        for b in range(kw):
            out += np.einsum("nchw,fc->nfhw", i[:, :, a:a + h - kh + 1, b:b + wd - kw + 1], w[:, :, a, b])
    return out


def _sizes(rng: np.random.Generator, count: int, dims: int, high: int) -> list[tuple[int, ...]]:
    """The largest sizes first (the options of the kernel are the first call's: a
    contraction's then tile, pack and block), 1 next, then random ones."""
    picks = [tuple(int(x) for x in rng.integers(1, high, dims)) for _ in range(count - 2)]
    return [(high,) * dims, (1,) * dims, *picks]


def test_one_matmul_kernel_serves_twenty_sizes():
    rng = np.random.default_rng(0)
    k = pf.define(MM, target="host", sizes="symbolic").mm
    before = _builds()
    for m, kk, n in _sizes(rng, 20, 3, 300):
        a = rng.standard_normal((m, kk)).astype(np.float32)
        b = rng.standard_normal((kk, n)).astype(np.float32)
        np.testing.assert_allclose(k(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3 * np.sqrt(kk))
    assert _builds() - before == 1


def test_one_conv_kernel_serves_twenty_sizes():
    rng = np.random.default_rng(1)
    k = pf.define(CONV, target="host", sizes="symbolic").conv
    before = _builds()
    for _ in range(20):
        n, c, f = (int(x) for x in rng.integers(1, 6, 3))
        kh, kw = (int(x) for x in rng.integers(1, 4, 2))
        h, w = kh + int(rng.integers(0, 20)), kw + int(rng.integers(0, 20))
        i = rng.standard_normal((n, c, h, w)).astype(np.float32)
        wt = rng.standard_normal((f, c, kh, kw)).astype(np.float32)
        np.testing.assert_allclose(k(i, wt), _conv(i, wt), rtol=1e-4, atol=1e-4)
    assert _builds() - before == 1


def test_one_softmax_kernel_serves_twenty_sizes():
    rng = np.random.default_rng(2)
    k = pf.define(SOFTMAX, target="host", sizes="symbolic").softmax
    before = _builds()
    for n, d in _sizes(rng, 20, 2, 700):
        x = (4 * rng.standard_normal((n, d))).astype(np.float32)
        np.testing.assert_allclose(k(x)[0], _softmax(x.astype(np.float64)), rtol=1e-5, atol=1e-7)
    assert _builds() - before == 1


def test_full_tiles_of_a_symbolic_kernel_have_constant_bounds():
    """The tile loops split where the partial tile starts (a floor division of the size),
    so the register block inside a full tile runs constant, vectorized loops, on panels
    packed as a specialized kernel's; a partial tile of the reduction packs its rows into
    the same panels, as many as the call has (a bound that keeps the tile's size)."""
    k = pf.define(MM, target="host", sizes="symbolic").mm
    a, b = np.ones((300, 300), np.float32), np.ones((300, 300), np.float32)
    loops = k.specialize(a, b).stages["loops"]
    assert "int64 M, int64 N" in loops and "floordiv(" in loops
    assert any(line.strip().startswith("acc") for line in loops.splitlines())   # accumulators in registers
    copies = [line.strip() for line in loops.splitlines() if line.strip().startswith("for B_packed")]
    assert any(re.fullmatch(r"for B_packed_1 in 0:\d+ \{", line) for line in copies)   # a full tile's rows
    assert any("min(" in line and "K - c" in line for line in copies)     # a partial tile's rows


def test_a_size_of_zero_gets_a_kernel_of_its_own():
    k = pf.define(MM, target="host", sizes="symbolic").mm
    a, b = np.ones((3, 0), np.float32), np.ones((0, 5), np.float32)
    np.testing.assert_array_equal(k(a, b), np.zeros((3, 5), np.float32))
    assert "int64 M" not in k.specialize(a, b).stages["loops"]


def test_sizes_must_be_known():
    with pytest.raises(ArgumentError, match="sizes must be one of"):
        pf.define(MM, target="host", sizes="dynamic")


@pytest.mark.unit
def test_facts_decide_the_min_of_a_full_tile():
    """Inside ``for c0 in 0:256 * floordiv(N, 256) step 256``, ``min(255, N - c0 - 1)`` is
    255; where c0 runs to N it is not decided."""
    i64 = DType.INT64
    n, c0 = ScalarRef("N", i64), IndexVar("c0")
    bound = Call("min", (Literal(255, i64), Binary(BinaryOp.SUB, Binary(BinaryOp.SUB, n, c0, i64),
                                                   Literal(1, i64), i64)), i64)
    cut = prefix_cut(bound, "c0")
    at = aligned(Literal(0, i64), 256, cut)
    assert str(at) == "int64(256) * floordiv(N, int64(256))"
    full = Facts().inside(For("c0", Literal(0, i64), at, (), step=256))
    assert full.decide(bound) == Literal(255, i64)
    whole = Facts().inside(For("c0", Literal(0, i64), n, (), step=256))
    assert whole.decide(bound) == bound


def test_a_symbolic_kernel_comes_back_from_the_disk_cache():
    """Its layout keeps the outputs' extents as expressions of the sizes: loaded in a
    new process (here: with this process's kernels dropped) it sizes them per call."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((33, 17)).astype(np.float32), rng.standard_normal((17, 65)).astype(np.float32)
    pf.define(MM, target="host", sizes="symbolic").mm(a, b)
    cpu._COMPILED.clear()
    disk = cpu.STATS["disk"]
    k = pf.define(MM, target="host", sizes="symbolic").mm
    for m, kk, n in ((33, 17, 65), (5, 40, 129)):
        a, b = rng.standard_normal((m, kk)).astype(np.float32), rng.standard_normal((kk, n)).astype(np.float32)
        np.testing.assert_allclose(k(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert cpu.STATS["disk"] == disk + 1


def test_a_size_the_statements_read_is_the_call_s():
    """``/ D`` reads the size of this call, not of the first."""
    src = "def mean(float(N,D) X) -> (Y) { Y(n) +=! X(n,d) / D }"
    k = pf.define(src, target="host", sizes="symbolic").mean
    rng = np.random.default_rng(4)
    for n, d in ((3, 5), (17, 100), (1, 1), (40, 7)):
        x = rng.standard_normal((n, d)).astype(np.float32)
        np.testing.assert_allclose(k(x), x.mean(axis=1), rtol=1e-5, atol=1e-6)


def _grown(args: tuple, delta: int, rng: np.random.Generator) -> list:
    """New arguments with every dimension of every array ``delta`` longer (sizes that
    agree still agree; windows keep their outputs' relation), values like the old ones'."""
    out: list = []
    for a in args:
        if not (isinstance(a, np.ndarray) and a.ndim):
            out.append(a)
            continue
        shape = tuple(d + delta for d in a.shape)
        if a.dtype.kind in "fV":
            out.append(rng.uniform(-1, 1, shape).astype(a.dtype))
        elif a.dtype.kind == "b":
            out.append(rng.integers(0, 2, shape).astype(a.dtype))
        else:   # (indices keep to the values the program used: inside every table)
            lo = max(int(a.min()), -1000)
            out.append(rng.integers(lo, max(lo, min(int(a.max()), 1000)) + 1, shape).astype(a.dtype))
    return out


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_canonical_programs_at_sizes_the_kernel_was_not_compiled_for(program):
    """Each canonical program's symbolic kernel, compiled at the program's sizes, at those
    sizes (against its oracle) and at every dimension 5 longer (against the reference
    interpreter)."""
    k = getattr(pf.define(program.source, target="host", sizes="symbolic"), program.entry)
    rng = np.random.default_rng(5)
    args = program.make_inputs(rng)
    assert_outputs_match(_as_tuple(k(*args)), program.oracle(*args), program.name)
    grown = _grown(args, 5, rng)
    try:
        expected = getattr(pf.define(program.source, target="reference"), program.entry)(*grown)
    except ShapeError:
        pytest.skip("the program's sizes are tied to each other otherwise (a window of its input)")
    got = _as_tuple(k(*grown))
    for g, e in zip(got, _as_tuple(expected)):   # (sums in another order than the interpreter's)
        tol = 1e-2 if g.dtype.itemsize <= 2 and g.dtype.kind in "fV" else 1e-4
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(e, np.float64), rtol=tol, atol=tol)


DENSE_GELU = """def dense(float(B, S, 64) X, float(64, 96) W, float(96) C) -> (Y, T) {
  T(b, s, n) +=! X(b, s, k) * W(k, n)
  Y(b, s, n) = (C(n) + T(b, s, n)) * (erf((C(n) + T(b, s, n)) / 1.4142135381698608) + 1.0) * 0.5
}"""


def test_rows_a_partial_block_leaves_are_blocks_of_four_two_and_one():
    """The rows past the last whole register block of a symbolic size (``S mod 6``) run
    outside the reduction in blocks of 4, 2 and 1 row, summed in registers from zero, and
    the bias and GELU apply to every block's accumulators (no second pass over T); at
    every remainder of the rows, against numpy."""
    from scipy.special import erf
    k = pf.define(DENSE_GELU, target="host", sizes="symbolic").dense
    rng = np.random.default_rng(7)
    w = rng.standard_normal((64, 96)).astype(np.float32)
    c = rng.standard_normal(96).astype(np.float32)
    loops = k.specialize(np.ones((3, 100, 64), np.float32), w, c).stages["loops"]
    blocks = set(re.findall(r"local float32\((\d+), \d+\) acc", loops))
    assert {"6", "4", "2", "1"} <= blocks, blocks
    stores = [line.strip() for line in loops.splitlines() if line.strip().startswith(("T(", "Y("))]
    assert stores and all(re.fullmatch(r"T\([^=]*\) = acc\d*\(\d+, c\d+\)", t) for t in stores if t.startswith("T("))
    assert all("acc" in t and "T(" not in t.split("=", 1)[1] for t in stores if t.startswith("Y("))
    before = _builds()
    for b, s in [(1, 1), (2, 2), (1, 3), (3, 4), (2, 5), (1, 6), (2, 61), (3, 62), (1, 63), (2, 64), (1, 65),
                 (4, 127)]:
        x = rng.standard_normal((b, s, 64)).astype(np.float32)
        t = x.astype(np.float64) @ w + c
        y, _ = k(x, w, c)
        np.testing.assert_allclose(y, t * (erf(t / np.sqrt(2)) + 1) * 0.5, rtol=1e-4, atol=1e-4)
    assert _builds() - before <= 1


def test_the_last_partial_tile_makes_no_block_as_wide_as_a_whole_tile():
    """The partial tile of a symbolic loop holds fewer columns than a whole tile (``N -
    c0 < 128`` there): its bound reads ``min(126, N - c0 - 1)``, so its register blocks
    start at half a tile and no tile-wide one (which could never run) is compiled; results
    against numpy at widths that divide no tile."""

    src = """def k(float32(1, 768) A, float32(768, N) B) -> (float32(1, N) Y) {
      Y(m, n) +=! A(m, k) * B(k, n) where m in 0:1, n in 0:N, k in 0:768
    }"""
    k = pf.define(src, target="host", sizes="symbolic").k
    rng = np.random.default_rng(5)
    for n in (1000, 127, 129, 64, 2000):
        a = rng.standard_normal((1, 768), dtype=np.float32)
        b = rng.standard_normal((768, n), dtype=np.float32)
        np.testing.assert_allclose(k(a, b), a @ b, rtol=1e-4, atol=1e-3)
    loops = k.specialize(a, b).stages["loops"]
    tile = int(re.search(r"for c0 in 0:N step (\d+)", loops).group(1))   # (the machine's heuristic)
    partial = [line for line in loops.splitlines() if "c3_o in" in line]
    assert partial and all(f"min({tile - 1}," not in line and f"min({tile - 2}, N - c0 - 1)" in line
                           for line in partial)


def test_a_symbolic_batch_of_one_leaves_the_next_loop_to_the_threads():
    """A symbolic first loop (a batch) may run once: the next member of the band is
    parallel too, nested (the pool runs a region of one iteration in place, and a region
    inside another's iterations in place), so a batch of one still spreads over the
    threads (BERT's softmax and transposes at 1 x 256 ran on one thread: 1.8x)."""
    from polyfuse.runtime import native
    src = """def bn(float32(N, H, W, C) X, float32(C) s, float32(C) b) -> (Y) {
      Y(i0, i1, i2, i3) = max(X(i0, i1, i2, i3) * s(i3) + b(i3), 0.0)
          where i0 in 0:N, i1 in 0:H, i2 in 0:W, i3 in 0:C
    }"""
    k = pf.define(src, target="host", sizes="symbolic").bn
    rng = np.random.default_rng(4)
    threads = native.get_num_threads()
    try:
        for n_threads in (1, 2, 3):
            native.set_num_threads(n_threads)
            for shape in [(1, 57, 31, 40), (3, 5, 7, 19), (1, 1, 3, 5), (2, 1, 1, 17)]:
                x = rng.standard_normal(shape).astype(np.float32)
                s, b = (rng.standard_normal(shape[-1]).astype(np.float32) for _ in range(2))
                np.testing.assert_allclose(k(x, s, b), np.maximum(x * s + b, 0), rtol=1e-5, atol=1e-6, err_msg=str(shape))
    finally:
        native.set_num_threads(threads)
    loops = k.specialize(*(np.zeros(s, np.float32) for s in [(1, 4, 4, 16), (16,), (16,)])).stages["loops"]
    assert re.search(r"parallel for (c\d) in 0:N \{\s*parallel for c\d in 0:H", loops), loops


def test_a_symbolic_vector_loop_masks_only_what_its_whole_vectors_leave():
    """On AVX-512 a vector loop of a symbolic kernel's trips runs its whole vectors
    unmasked, then the rest under a mask (LLVM's masked loop masked every vector: a
    softmax over rows of 256 took 1.4x the time); results at widths of whole vectors,
    of fewer than one, and between."""
    from polyfuse.targets.cpu import vector_bits
    src = """def sm(float32(R, C) X) -> (float32(R, C) Y, float32(R, 1) S) {
      S(r, z) +=! exp(X(r, c)) where r in 0:R, z in 0:1, c in 0:C
      Y(r, c) = exp(X(r, c)) / S(r, 0) where r in 0:R, c in 0:C
    }"""
    k = pf.define(src, target="host", sizes="symbolic").sm
    rng = np.random.default_rng(6)
    for shape in [(3, 256), (2, 7), (5, 77), (1, 33), (4, 16)]:
        x = rng.standard_normal(shape).astype(np.float32)
        y, s = k(x)
        np.testing.assert_allclose(s[:, 0], np.exp(x).sum(axis=1), rtol=1e-5, err_msg=str(shape))
        np.testing.assert_allclose(y, np.exp(x) / np.exp(x).sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    stages = k.specialize(np.zeros((2, 40), np.float32)).stages
    assert len(re.findall(r"^  (parallel )?for ", stages["loops"], re.M)) == 1   # one nest: row by row
    if vector_bits(k.target) != 512:
        pytest.skip("masked vectors: AVX-512 only")
    llvm = stages["llvm"]
    nodes = dict(re.findall(r"^(!\d+) = (.*)$", llvm, re.M))
    vector = [n for n, text in nodes.items() if "distinct" in text
              and any('"llvm.loop.vectorize.enable"' in nodes.get(m, "") for m in re.findall(r"!\d+", text))]
    masked = [n for n in vector if any("predicate.enable" in nodes.get(m, "") for m in re.findall(r"!\d+", nodes[n]))]
    assert masked and len(vector) == 2 * len(masked), llvm[-2000:]
