"""use_matrix_tiles: bfdot2 products put on AMX tiles in blocks of 32 x 32 outputs. The pass
is checked on every machine (printed IR, parsed back, and the interpreter running each
block's own loops against the untransformed kernel); the tiles themselves where the host
has AMX-BF16, against numpy on the bfloat16 operands."""

import ml_dtypes
import numpy as np
import pytest

import polyfuse as pf
from polyfuse.frontends.loop_ir import parse_kernel
from polyfuse.ir.loops import TileProduct, walk_stmts
from polyfuse.ir.loops_interpreter import interpret_kernel
from polyfuse.scheduler.loop_passes import use_matrix_tiles
from polyfuse.targets.cpu import native_tiles
from polyfuse.targets.target import Target

RNG = np.random.default_rng(11)
BF = frozenset({"bfdot2"})
AMX = pytest.mark.skipif("bfdot2" not in native_tiles(Target.parse("host")),
                         reason="the host has no AMX-BF16 tiles (or Linux does not grant them)")


def matmul(m, k, n, *, w="W(c1, c2)", w_shape=None, rows_step=1):
    """A bfdot2 product nest as the scheduler leaves it: rows in register blocks of
    ``rows_step`` (a loop by that step outside the words, one over the block inside)."""
    row = "c0 + c3" if rows_step > 1 else "c0"
    nest = f"for c2 in 0:{n} vectorize(16) {{ Y({row}, c2) = Y({row}, c2) + bfdot2(P({row}, c1), {w}) }}"
    if rows_step > 1:
        nest = f"for c3 in 0:{rows_step} {{ {nest} }}"
    step = f" step {rows_step}" if rows_step > 1 else ""
    nest = f"for c0 in 0:{m}{step} {{ for c1 in 0:{k} {{ {nest} }} }}"
    w_shape = ", ".join(map(str, w_shape or (k, n)))
    return parse_kernel(f"kernel k(in int32({m}, {k}) P, in int32({w_shape}) W, out float32({m}, {n}) Y) {{ {nest} }}")


def words(*shape):
    """int32 words of 2 random bfloat16."""
    halves = RNG.standard_normal((*shape, 2)).astype(ml_dtypes.bfloat16)
    return halves.view(np.int32)[..., 0]


def tiles(kernel):
    return [s for s in walk_stmts(kernel.body) if isinstance(s, TileProduct)]


@pytest.mark.parametrize("m, k, n, step", [(37, 21, 45, 1), (64, 32, 33, 4), (5, 16, 16, 1), (33, 40, 17, 1)])
def test_tile_blocks_compute_what_the_nest_does_and_print_and_parse_back(m, k, n, step):
    kernel = matmul(m, k, n, rows_step=step)
    tiled = use_matrix_tiles(kernel, BF)
    assert parse_kernel(str(tiled)) == tiled
    # whole blocks of 32 x 32, then the rows and columns left over
    shapes = sorted({t.shape for t in tiles(tiled)})
    want = {(min(32, r), min(32, c), k) for r in range(m, 0, -32) for c in range(n, 0, -32)}
    assert set(shapes) == {(r, c, k) for r, c, _ in want}
    assert all(t.steps == (n, k, n) for t in tiles(tiled))
    args = {"P": words(m, k), "W": words(k, n)}
    np.testing.assert_array_equal(interpret_kernel(tiled, args)["Y"], interpret_kernel(kernel, args)["Y"])


@pytest.mark.unit
def test_merged_rows_and_the_first_elements():
    tiled = use_matrix_tiles(matmul(64, 32, 64, rows_step=4), BF)
    assert "tile bfdot2(32, 32, 32) Y(rb, cb) += P(rb, 0) * W(0, cb) steps(64, 32, 64)" in str(tiled)


@pytest.mark.unit
@pytest.mark.parametrize("kernel", [
    matmul(40, 32, 8),                                              # too few columns for a tile
    matmul(40, 8, 40),                                              # too shallow
    matmul(40, 32, 48, w="W(c2, c1)", w_shape=(48, 32)),            # columns not contiguous in W
], ids=["narrow", "shallow", "transposed"])
def test_products_tiles_cannot_hold_stay_loops(kernel):
    assert use_matrix_tiles(kernel, BF) == kernel
    assert use_matrix_tiles(matmul(64, 32, 64), frozenset()) == matmul(64, 32, 64)


@pytest.mark.unit
def test_a_float_product_stays_loops():
    text = str(matmul(64, 32, 64)).replace("bfdot2(P(c0, c1), W(c1, c2))", "float32(P(c0, c1)) * float32(W(c1, c2))")
    kernel = parse_kernel(text)
    assert use_matrix_tiles(kernel, BF) == kernel


def test_window_loops_stay_around_the_tiles():
    """A 1-D convolution: the window loop ``c3`` moves the input's rows and the weights'
    planes, so it cannot merge with the depth (words) and runs around the blocks."""
    kernel = parse_kernel("""kernel k(in int32(10, 20) P, in int32(20, 3, 48) W, out float32(8, 48) Y) {
  for c0 in 0:8 {
    for c3 in 0:3 {
      for c1 in 0:20 {
        for c2 in 0:48 vectorize(16) {
          Y(c0, c2) = Y(c0, c2) + bfdot2(P(c0 + c3, c1), W(c1, c3, c2))
        }
      }
    }
  }
}""")
    tiled = use_matrix_tiles(kernel, BF)
    assert tiled.body[0].var == "c3" and {t.steps for t in tiles(tiled)} == {(48, 20, 144)}
    args = {"P": words(10, 20), "W": words(20, 3, 48)}
    np.testing.assert_array_equal(interpret_kernel(tiled, args)["Y"], interpret_kernel(kernel, args)["Y"])


BFDOT2 = "def d(int32(M, K) A, int32(K, N) B) -> (C) { C(m, n) +=! bfdot2(A(m, k), B(k, n)) }"


@AMX
@pytest.mark.parametrize("m, k, n", [(197, 384, 200), (37, 21, 45), (64, 64, 64)])
def test_amx_tiles_sum_the_bfloat16_products(m, k, n):
    a, b = words(m, k), words(k, n)
    halves = [x.view(ml_dtypes.bfloat16).reshape(*x.shape, 2).astype(np.float64) for x in (a, b)]
    want = np.einsum("mkh,knh->mn", *halves)
    kernel = pf.define(BFDOT2, target="host").d
    got = kernel(a, b)
    stages = kernel.specialize(a, b).stages
    assert "tile bfdot2" in stages["loops"] and "tdpbf16ps" in stages["asm"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


DOT4 = "def d(int32(M, K) A, int32(K, N) B) -> (C) { C(m, n) +=! dot4(A(m, k), B(k, n)) }"


@pytest.mark.skipif("dot4" not in native_tiles(Target.parse("host")),
                    reason="the host has no AMX-INT8 tiles (or Linux does not grant them)")
@pytest.mark.parametrize("m, k, n", [(197, 192, 200), (37, 21, 45)])
def test_amx_tiles_sum_unsigned_bytes_times_signed_ones(m, k, n):
    a8 = RNG.integers(0, 256, (m, k, 4)).astype(np.uint8)
    b8 = RNG.integers(-128, 128, (k, n, 4)).astype(np.int8)
    a, b = a8.view(np.int32)[..., 0], b8.view(np.int32)[..., 0]
    kernel = pf.define(DOT4, target="host").d
    np.testing.assert_array_equal(kernel(a, b), np.einsum("mkj,knj->mn", a8.astype(np.int64), b8.astype(np.int64)))
    stages = kernel.specialize(a, b).stages
    assert "tile dot4" in stages["loops"] and "tdpbusd" in stages["asm"]


@pytest.mark.unit
def test_rows_of_sums_that_overlap_stay_loops():
    """``Y(c0 + c2)``: outputs of different rows and columns are one element, which the
    tiles would sum apart and store over each other."""
    kernel = parse_kernel("""kernel k(in int32(32, 16) P, in int32(16, 32) W, out float32(63) Y) {
  for c0 in 0:32 { for c1 in 0:16 { for c2 in 0:32 vectorize(16) {
    Y(c0 + c2) = Y(c0 + c2) + bfdot2(P(c0, c1), W(c1, c2)) } } }
}""")
    assert use_matrix_tiles(kernel, BF) == kernel


def test_targets_without_tiles_keep_the_products_loops():
    """A named CPU (code for another machine, ahead of time) never gets tiles, even one with
    AMX: the program that runs it may not have asked Linux for them."""
    a, b = words(64, 32), words(32, 64)
    for target in ("x86:skylake-avx512", "x86:sapphirerapids"):
        assert native_tiles(Target.parse(target)) == frozenset()
        stages = pf.define(BFDOT2, target=target).d.specialize(a, b).stages
        assert "tile " not in stages["loops"] and "tdpbf16ps" not in stages["asm"]


@pytest.mark.parametrize("n, packs", [(64, True), (45, False)])
def test_constant_weights_are_read_from_panels_of_32_columns(n, packs):
    """``W(k, j)`` packed once as ``W_panels(j / 32, k, j % 32)``: a tile's rows 32 words
    apart; weights whose columns are no whole panels stay where they are."""
    kernel = matmul(37, 21, n)
    tiled = use_matrix_tiles(kernel, BF, frozenset({"W"}))
    assert parse_kernel(str(tiled)) == tiled
    assert ("in int32(2, 21, 32) W_panels = pack W(p1, 32*p0 + p2)" in str(tiled)) == packs
    assert {t.steps for t in tiles(tiled)} == {(n, 21, 32 if packs else n)}
    args = {"P": words(37, 21), "W": words(21, n)}
    np.testing.assert_array_equal(interpret_kernel(tiled, args)["Y"], interpret_kernel(kernel, args)["Y"])


def test_a_convolutions_weights_pack_with_the_window_outside_the_words():
    kernel = parse_kernel("""kernel k(in int32(42, 16) P, in int32(16, 3, 32) W, out float32(40, 32) Y) {
  for c0 in 0:40 { for c3 in 0:3 { for c1 in 0:16 { for c2 in 0:32 vectorize(16) {
    Y(c0, c2) = Y(c0, c2) + bfdot2(P(c0 + c3, c1), W(c1, c3, c2)) } } } }
}""")
    tiled = use_matrix_tiles(kernel, BF, frozenset({"W"}))
    assert "in int32(1, 3, 16, 32) W_panels = pack W(p2, p1, 32*p0 + p3)" in str(tiled)
    assert {t.steps for t in tiles(tiled)} == {(32, 16, 32)}
    args = {"P": words(42, 16), "W": words(16, 3, 32)}
    np.testing.assert_array_equal(interpret_kernel(tiled, args)["Y"], interpret_kernel(kernel, args)["Y"])
