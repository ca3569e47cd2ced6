"""The loop nest the mapping options refer to: band members named by TC index, their
extents and reductions, options by index name, and the heuristics, the schedule and the
tuner's space reading the options against the same nest."""

import numpy as np
import pytest

import polyfuse as pf

from polyfuse.autotune.space import SearchSpace
from polyfuse.autotune.task import Task
from polyfuse.errors import OptionError
from polyfuse.frontends.tc import parse
from polyfuse.scheduler.gpu_heuristics import default_gpu_options
from polyfuse.scheduler.heuristics import default_options
from polyfuse.scheduler.loop_nest import LoopNest, NamedOptions
from polyfuse.scheduler.model import build_model
from polyfuse.scheduler.options import Fusion, MappingOptions
from polyfuse.scheduler.schedule import compute_schedule
from polyfuse.ir.machine import DEFAULT_MACHINE
from tests.scheduler.avx512 import avx512_loops

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
CONV = ("def conv(float(N,C,H,W) I, float(M,C,KH,KW) Wt) -> (O) "
        "{ O(n,m,h,w) +=! I(n,c,h+kh,w+kw) * Wt(m,c,kh,kw) }")
ROWSUM = "def rowsum(float(N,D) X) -> (S) { S(n) +=! X(n,d) }"
MM_SIZES = {"M": 512, "K": 256, "N": 384}
CONV_SIZES = {"N": 1, "C": 64, "H": 30, "W": 30, "M": 64, "KH": 3, "KW": 3}


def nest(src, entry, sizes):
    d = parse(src)[entry]
    return d, LoopNest.of(d, sizes)


@pytest.mark.unit
def test_members_are_named_by_index_with_extents_and_reductions():
    _, mm = nest(MM, "mm", MM_SIZES)
    assert (mm.members, mm.extents, mm.reductions) == (("m", "n", "k"), (512, 384, 256), 1)
    assert (mm.outputs, mm.reduction_members) == (("m", "n"), ("k",))
    assert mm.extent_of() == {"m": 512, "n": 384, "k": 256} and mm.work == 512 * 384 * 256
    _, conv = nest(CONV, "conv", CONV_SIZES)
    assert conv.members == ("n", "m", "h", "w", "c", "kh", "kw")
    assert conv.extents == (1, 64, 28, 28, 64, 3, 3) and conv.reduction_members == ("c", "kh", "kw")
    _, rowsum = nest(ROWSUM, "rowsum", {"N": 64, "D": 1000})
    assert (rowsum.members, rowsum.extents, rowsum.reductions) == (("n", "d"), (64, 1000), 1)


@pytest.mark.unit
def test_a_range_of_one_value_in_the_text_has_no_member():
    src = "def f(float(N,W) I) -> (O) { O(n, j, w) +=! I(n, w + j + k) where j in 0:1, k in 0:3 }"
    _, one = nest(src, "f", {"N": 8, "W": 70})
    assert one.members == ("n", "w", "k") and one.extents == (8, 68, 3)
    _, two = nest(src.replace("0:1", "0:2"), "f", {"N": 8, "W": 70})
    assert two.members == ("n", "j", "w", "k") and two.extents == (8, 2, 67, 3)


@pytest.mark.unit
def test_the_heaviest_statement_is_the_nest():
    src = """def two(float(N,D) X) -> (S, Y) {
        S(n) +=! X(n,d)
        Y(n,d,e) = X(n,d) * X(n,e)
    }"""
    _, two = nest(src, "two", {"N": 4, "D": 16})
    assert two.members == ("n", "d", "e") and two.reductions == 0 and two.reduces and two.statements == 2


@pytest.mark.unit
def test_the_heuristics_write_their_choices_on_the_named_members():
    d, mm = nest(MM, "mm", MM_SIZES)
    named = mm.to_named(default_options(d, MM_SIZES, DEFAULT_MACHINE))
    # cache tiles 60 rows of m (whole 6-row blocks) by 64 columns of n (384 columns: 256
    # would make one whole tile and a half one for the threads, 128 three tiles, an odd
    # number); k's 256 steps, not much more than the 128-step tile, stay whole; 6 x 64
    # register blocks (512 rows, far apart); column panels outermost (BLIS)
    assert named.tile_sizes == (("m", 60), ("n", 64), ("k", 0))
    assert named.tile_order == ("n", "k", "m")
    assert named.register_tile == (("m", 6), ("n", 64), ("k", 0))
    assert named.point_order == ("k", "m", "n")   # reduction outermost, n vectorized innermost
    d, conv = nest(CONV, "conv", CONV_SIZES)
    named = conv.to_named(default_options(d, CONV_SIZES, DEFAULT_MACHINE))
    # one tile of columns covers the 28 outputs of a row (too few to split over threads);
    # the 64 output channels (far apart in the weights, sliding no window) jam 6 at a time
    assert dict(named.tile_sizes)["w"] == 28 and dict(named.register_tile)["m"] == 6
    # 64 channels by 3 x 3 taps: 8 channels make a tile of about 128 steps (a window's
    # reduction keeps its panels even where L2 would hold the whole box, 63 KiB here)
    assert dict(named.tile_sizes)["c"] == 8
    assert named.point_order == ("c", "kh", "kw", "n", "h", "m", "w")
    # on the GPU: 32 x 32 outputs per block, register tiles, 16 channels per pipelined step
    assert dict(conv.to_named(default_gpu_options(d, CONV_SIZES)).tile_sizes) == {
        "n": 1, "m": 1, "h": 32, "w": 32, "c": 16, "kh": 0, "kw": 0}
    d, rowsum = nest(ROWSUM, "rowsum", {"N": 64, "D": 1000})
    assert rowsum.to_named(default_gpu_options(d, {"N": 64, "D": 1000})).tile_sizes == (("n", 1), ("d", 0))


@pytest.mark.parametrize("rows, k, cols, tile, block", [
    (50, 2000, 50, 30, 0),     # rows in a tile per thread, not one tile of 64 on one thread
    (100, 100, 100, 54, 64),   # 100 columns: blocks of 64 and a partial one, widened to 48
    (200, 300, 100, 60, 64),
])
def test_few_columns_split_the_rows_over_the_threads_in_blocks_of_whole_vectors(rows, k, cols, tile, block):
    sizes = {"M": rows, "K": k, "N": cols}
    d, mm = nest(MM, "mm", sizes)
    options = mm.to_named(default_options(d, sizes, DEFAULT_MACHINE))
    assert (dict(options.tile_sizes)["m"], dict(options.register_tile)["n"]) == (tile, block)
    rng = np.random.default_rng(rows + cols)
    a = rng.standard_normal((rows, k)).astype(np.float32)
    b = rng.standard_normal((k, cols)).astype(np.float32)
    kernel = pf.define(MM, target="host").mm
    loops = avx512_loops(MM, a, b)
    assert loops.lstrip().split("\n")[1].strip().startswith("parallel for")
    assert ("for c8 in 0:48 vectorize(16)" in loops) == bool(block)
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-3, atol=3e-3)


@pytest.mark.parametrize("src, entry, sizes, block, width", [
    (MM, "mm", {"M": 512, "K": 512, "N": 56}, 48, 16),    # 56 columns: 48 and 8, not 8 at a time
    (MM, "mm", {"M": 197, "K": 768, "N": 88}, 64, 16),
    (MM, "mm", {"M": 256, "K": 100, "N": 40}, 32, 16),
    (MM, "mm", {"M": 512, "K": 300, "N": 72}, 24, 8),     # three half vectors divide 72
    (CONV, "conv", {"N": 1, "C": 16, "H": 12, "W": 58, "M": 24, "KH": 3, "KW": 3}, 48, 16),
])
def test_columns_of_an_odd_count_of_half_vectors_take_full_vectors_and_a_partial_block(
        src, entry, sizes, block, width):
    # a block of one half vector (8 of 16 lanes) feeds its FMAs too few lanes: full
    # vectors, up to the block's count, then a partial block (a TC convolution over
    # NCHW maps 56 wide: 1.34x; 56, 40, 88 or 104 columns of a product: 1.08-1.2x)
    d, loop_nest = nest(src, entry, sizes)
    options = default_options(d, sizes, DEFAULT_MACHINE)
    vec = "n" if entry == "mm" else "w"
    assert (dict(loop_nest.to_named(options).register_tile)[vec], options.vector_width) == (block, width)
    rng = np.random.default_rng(sum(sizes.values()))
    kernel = getattr(pf.define(src, target="host"), entry)
    reference = getattr(pf.define(src, target="reference"), entry)
    if entry == "mm":
        args = (rng.standard_normal((sizes["M"], sizes["K"])).astype(np.float32),
                rng.standard_normal((sizes["K"], sizes["N"])).astype(np.float32))
    else:
        args = (rng.standard_normal((1, sizes["C"], sizes["H"], sizes["W"])).astype(np.float32),
                rng.standard_normal((sizes["M"], sizes["C"], 3, 3)).astype(np.float32))
    np.testing.assert_allclose(kernel(*args), reference(*args), rtol=1e-4, atol=1e-3)


TN = "def tn(float(K,M) A, float(K,N) B) -> (C) { C(m,n) +=! A(k,m) * B(k,n) }"


def test_a_product_whose_output_outgrows_the_cache_takes_deep_reduction_panels():
    # 1100 rows by 256 columns of C (1.1 MiB) per reduction panel: each panel would load
    # and store that much again, so panels go deep: a 512 KiB box of B. A reduction
    # deeper than a 512 x 256 box narrows the columns to deepen the panel: one register
    # block (64 columns) where that holds the whole reduction, else two (1024 steps)
    rng = np.random.default_rng(3)
    kernel = pf.define(MM, target="host").mm
    for depth, cols, steps, box in [(1500, 64, 0, "(1, 1500, 64) B_packed"),
                                    (2500, 128, 1024, "(2, 1024, 64) B_packed")]:
        sizes = {"M": 1100, "K": depth, "N": 1024}
        d, mm = nest(MM, "mm", sizes)
        tiles = dict(mm.to_named(default_options(d, sizes, DEFAULT_MACHINE)).tile_sizes)
        assert (tiles["k"], tiles["n"]) == (steps, cols)
        a = rng.standard_normal((1100, depth)).astype(np.float32)
        b = rng.standard_normal((depth, 1024)).astype(np.float32)
        assert f"local panel float32{box}" in avx512_loops(MM, a, b)  # packed
        np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-3, atol=3e-3)
    # Aᵀ·B packs its broadcast operand too, a copy per column tile that would grow with the
    # depth: wider tiles of shallower panels instead (512 columns of 256 steps)
    sizes = {"M": 1100, "K": 1500, "N": 1024}
    d, tn = nest(TN, "tn", sizes)
    tiles = dict(tn.to_named(default_options(d, sizes, DEFAULT_MACHINE)).tile_sizes)
    assert (tiles["k"], tiles["n"]) == (256, 512)
    a = rng.standard_normal((1500, 1100)).astype(np.float32)
    b = rng.standard_normal((1500, 1024)).astype(np.float32)
    transposed = pf.define(TN, target="host").tn
    assert "A_packed" in transposed.specialize(a, b).stages["loops"]
    np.testing.assert_allclose(transposed(a, b), a.T @ b, rtol=1e-3, atol=3e-3)
    # 64 rows sweep 64 KiB per panel: the usual 128-step panels, where the whole
    # reduction's box of B (4000 steps of 64 columns: 1 MiB) would outgrow 768 KiB
    small = dict(MM_SIZES, M=64, K=4000)
    d, mm = nest(MM, "mm", small)
    assert dict(mm.to_named(default_options(d, small, DEFAULT_MACHINE)).tile_sizes)["k"] == 128


@pytest.mark.parametrize("depth, steps, cols", [
    (700, 0, 256),     # 700 KiB of B: one panel, one pass over each output tile (a
                       # transformer's 768-deep products), not panels of 128 steps
    (900, 0, 128),     # 900 KiB: half the columns, 450 KiB, whole again
    (2000, 128, 256),  # 1000 KiB even so: panels of 128 steps over 256 columns
])
def test_a_reduction_whose_whole_box_fits_l2_stays_untiled(depth, steps, cols):
    sizes = {"M": 100, "K": depth, "N": 512}
    d, mm = nest(MM, "mm", sizes)
    tiles = dict(mm.to_named(default_options(d, sizes, DEFAULT_MACHINE)).tile_sizes)
    assert (tiles["k"], tiles["n"]) == (steps, cols)
    rng = np.random.default_rng(depth)
    a = rng.standard_normal((100, depth)).astype(np.float32)
    b = rng.standard_normal((depth, 512)).astype(np.float32)
    np.testing.assert_allclose(pf.define(MM, target="host").mm(a, b), a @ b, rtol=1e-3, atol=4e-3)


def test_columns_split_evenly_over_the_threads_in_tiles_a_little_wider_than_a_cache_tile():
    # 768 columns: two tiles of 384 (six 4-vector blocks each), one per thread, instead of
    # six of 128; 640: two of 320; 600 would split into 300, not whole 4-vector blocks:
    # tiles of 64 (tiles of 256 or 128 leave one thread 352 columns, of 64 320)
    rng = np.random.default_rng(12)
    for cols, tile in [(768, 384), (640, 320), (600, 64)]:
        sizes = {"M": 197, "K": 3072, "N": cols}
        d, mm = nest(MM, "mm", sizes)
        assert dict(mm.to_named(default_options(d, sizes, DEFAULT_MACHINE)).tile_sizes)["n"] == tile
    a = rng.standard_normal((197, 3072)).astype(np.float32)
    b = rng.standard_normal((3072, 768)).astype(np.float32)
    np.testing.assert_allclose(pf.define(MM, target="host").mm(a, b), a @ b, rtol=1e-3, atol=5e-3)


@pytest.mark.parametrize("cols, tile", [
    (800, 128),    # tiles of 256 end in one of 32: one thread computes 512 columns, the
                   # other 288; in tiles of 128, 416 and 384 (1024 x 1024 x 800: 1.25x)
    (1000, 256),   # 512 and 488 either way: the wider tiles read the rows fewer times
    (672, 64),     # 384 and 288 in tiles of 128, 352 and 320 in tiles of 64
    (2048, 256),
])
def test_column_tiles_keep_both_threads_busy_to_the_end(cols, tile):
    sizes = {"M": 256, "K": 256, "N": cols}
    d, mm = nest(MM, "mm", sizes)
    assert dict(mm.to_named(default_options(d, sizes, DEFAULT_MACHINE)).tile_sizes)["n"] == tile
    rng = np.random.default_rng(cols)
    a = rng.standard_normal((256, 256)).astype(np.float32)
    b = rng.standard_normal((256, cols)).astype(np.float32)
    np.testing.assert_allclose(pf.define(MM, target="host").mm(a, b), a @ b, rtol=1e-3, atol=2e-3)


@pytest.mark.parametrize("rows, jammed", [(600, 6), (530, 6), (256, 6), (197, 6), (56, 6), (46, 4), (28, 4)])
def test_rows_far_apart_jam_six_where_six_divide_them_or_they_are_many(rows, jammed):
    sizes = {"M": rows, "K": 300, "N": 200}
    d, mm = nest(MM, "mm", sizes)
    options = mm.to_named(default_options(d, sizes, DEFAULT_MACHINE))
    # 6 rows of 4 vectors (24 accumulators) where 6 divides the rows or there are 48 or
    # more (the partial last block jammed by its own rows); 4 of 4 for fewer
    assert dict(options.register_tile)["m"] == jammed
    rng = np.random.default_rng(rows)
    a = rng.standard_normal((rows, 300)).astype(np.float32)
    b = rng.standard_normal((300, 200)).astype(np.float32)
    kernel = pf.define(MM, target="host").mm
    assert f"unroll_jam={jammed}" in kernel.specialize(a, b).stages["options"]
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-3, atol=2e-3)


TN = "def tn(float(K,M) A, float(K,N) B) -> (C) { C(m,n) +=! A(k,m) * B(k,n) }"


@pytest.mark.parametrize("rows, block", [(1024, (6, 64)), (600, (6, 64)), (256, (8, 32)), (100, (4, 64))])
def test_near_rows_that_slide_no_window_jam_six_where_six_divide_them_or_they_are_many(rows, block):
    # Aᵀ·B: the jammed rows' scalars A(k, m..m+5) are neighbours, packed in panels of
    # their rows; 6 rows of 4 vectors where 6 divides them or there are 512 or more, else
    # 8 of 2 vectors (as for a window's rows), or 4 of 4 where 8 does not divide them
    sizes = {"M": rows, "K": 300, "N": 512}
    d, tn = nest(TN, "tn", sizes)
    registers = dict(tn.to_named(default_options(d, sizes, DEFAULT_MACHINE)).register_tile)
    assert (registers["m"], registers["n"]) == block
    rng = np.random.default_rng(rows)
    a = rng.standard_normal((300, rows)).astype(np.float32)
    b = rng.standard_normal((300, 512)).astype(np.float32)
    np.testing.assert_allclose(pf.define(TN, target="host").tn(a, b), a.T @ b, rtol=1e-3, atol=2e-3)


CONV_LAST = ("def conv(float(N,H,W,C) P, float(C,KH,KW,M) Wt) -> (O) "
             "{ O(n,h,w,m) +=! P(n,h+kh,w+kw,c) * Wt(c,kh,kw,m) }")


@pytest.mark.parametrize("src, entry, sizes, block", [
    (CONV_LAST, "conv", {"N": 1, "H": 9, "W": 9, "C": 40, "KH": 3, "KW": 3, "M": 96}, 32),
    (MM, "mm", {"M": 49, "K": 300, "N": 192}, 64)])
def test_few_rows_take_column_tiles_of_one_register_block(src, entry, sizes, block):
    # 49 rows (a 7x7 map's) fit one cache tile: each thread streams the vector operand in
    # column tiles of one register block (7 x 2 vectors for the convolution's window, 6 x
    # 4 for the matmul's far rows), column tiles outermost; the depth panels stay as usual
    d, n = nest(src, entry, sizes)
    named = n.to_named(default_options(d, sizes, DEFAULT_MACHINE))
    vec = n.outputs[-1]
    assert dict(named.tile_sizes)[vec] == block == dict(named.register_tile)[vec]
    assert named.tile_order[0] == vec
    rng = np.random.default_rng(5)
    if entry == "conv":
        x = rng.standard_normal((1, 9, 9, 40)).astype(np.float32)
        w = rng.standard_normal((40, 3, 3, 96)).astype(np.float32)
        want = sum(np.einsum("nhwc,cm->nhwm", x[:, i:i + 7, j:j + 7], w[:, i, j])
                   for i in range(3) for j in range(3))
    else:
        x = rng.standard_normal((49, 300)).astype(np.float32)
        w = rng.standard_normal((300, 192)).astype(np.float32)
        want = x @ w
    kernel = getattr(pf.define(src, target="host"), entry)
    np.testing.assert_allclose(kernel(x, w), want, rtol=1e-3, atol=2e-3)
    if entry == "conv":   # columns that no whole number of blocks covers keep wider tiles
        wider = dict(sizes, M=200)
        d, n = nest(src, entry, wider)
        assert dict(n.to_named(default_options(d, wider, DEFAULT_MACHINE)).tile_sizes)[vec] == 64


GLOBAL_POOL = ("def pool(float(N,H,W,C) X) -> (Y) { Y(n,c) +=! X(n,h,w,c) }")


@pytest.mark.parametrize("sizes", [{"N": 1, "H": 7, "W": 7, "C": 40}, {"N": 2, "H": 9, "W": 5, "C": 33},
                                   {"N": 1, "H": 56, "W": 56, "C": 96}])
def test_a_sum_over_whole_rows_vectorizes_the_output_index_inside_the_reduction(sizes):
    """A global pool over a channels-last map reads c contiguously and sums h and w: the
    channels go innermost and vectorized, inside the reduction loops, in whole-vector
    tiles for the threads (not the plain order, which would gather along w)."""
    import numpy as np
    import polyfuse as pf
    d, pool = nest(GLOBAL_POOL, "pool", sizes)
    o = default_options(d, sizes, DEFAULT_MACHINE)
    named = pool.to_named(o)
    assert named.point_order == ("n", "h", "w", "c") and o.vector_width == 16
    chunk = dict(named.tile_sizes)["c"]
    assert chunk == sizes["C"] or chunk % 16 == 0
    x = np.random.default_rng(0).standard_normal(tuple(sizes[k] for k in "NHWC")).astype(np.float32)
    got = pf.define(GLOBAL_POOL, target="host").pool(x)
    np.testing.assert_allclose(got, x.sum(axis=(1, 2)), rtol=1e-4, atol=1e-4)


SOFTMAX = """def softmax(float(B, R, C) X) -> (Y, M, S) {
  M(b, r) max=! X(b, r, c)
  Y(b, r, c) = exp(X(b, r, c) - M(b, r))
  S(b, r) +=! Y(b, r, c)
  Y(b, r, c) = Y(b, r, c) * (1.0 / S(b, r))
}"""


def test_reductions_reading_each_element_once_run_their_rows_plainly():
    """A ViT's softmax (12 x 197 x 197): its maximum and sum read every element of X once,
    so no operand has elements to reuse; its rows run plainly, each reduced in a
    register (a contraction's cache tiles and register blocks made it 1.3x slower). A
    product of the same work still takes them."""
    import numpy as np
    import polyfuse as pf
    sizes = {"B": 12, "R": 197, "C": 197}
    d, sm = nest(SOFTMAX, "softmax", sizes)
    o = default_options(d, sizes, DEFAULT_MACHINE)
    assert not o.tile_sizes and not o.register_tile and o.unroll_jam <= 1, o
    d, mm = nest(MM, "mm", {"M": 197, "K": 197, "N": 192})
    assert default_options(d, {"M": 197, "K": 197, "N": 192}, DEFAULT_MACHINE).register_tile
    x = np.random.default_rng(0).standard_normal((12, 197, 197)).astype(np.float32)
    spec = pf.define(SOFTMAX, target="host").softmax.specialize(x)
    assert "let acc" in spec.stages["loops"] and "acc(" not in spec.stages["loops"]
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(spec(x)[0], e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


MATVEC = "def mv(float(C) Z, float(C, M) W) -> (Y) { Y(m) +=! Z(c) * W(c, m) }"


@pytest.mark.parametrize("sizes", [{"C": 37, "M": 200}, {"C": 144, "M": 576}, {"C": 8, "M": 40}])
def test_a_matrix_vector_product_vectorizes_its_outputs_in_register_sized_tiles(sizes):
    """W(c, m) read along m, Z(c) broadcast: m innermost and vectorized, c around it, in
    tiles of at most eight vectors (their accumulators stay in registers), not the plain
    order, which vectorizes c across W's rows."""
    import numpy as np
    import polyfuse as pf
    d, mv = nest(MATVEC, "mv", sizes)
    named = mv.to_named(default_options(d, sizes, DEFAULT_MACHINE))
    assert named.point_order == ("c", "m") and dict(named.tile_sizes)["m"] <= 128
    rng = np.random.default_rng(0)
    z = rng.standard_normal(sizes["C"]).astype(np.float32)
    w = rng.standard_normal((sizes["C"], sizes["M"])).astype(np.float32)
    np.testing.assert_allclose(pf.define(MATVEC, target="host").mv(z, w), z @ w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows, tile", [(1, 256), (8, 256), (49, 64)])
def test_rows_too_few_to_pack_the_panels_read_the_operand_along_its_rows(rows, tile):
    # a 1- or 8-row product reads B in place (too few register blocks to pack its
    # panels): column tiles of 256 keep each step's reads along a row (1 x 4096 x 4096:
    # 1.3x), where 49 rows (packed panels) stream one register block's panel per tile
    sizes = {"M": rows, "K": 4096, "N": 1024}
    d, mm = nest(MM, "mm", sizes)
    assert dict(mm.to_named(default_options(d, sizes, DEFAULT_MACHINE)).tile_sizes)["n"] == tile
    rng = np.random.default_rng(rows)
    a = rng.standard_normal((rows, 4096)).astype(np.float32)
    b = rng.standard_normal((4096, 1024)).astype(np.float32)
    np.testing.assert_allclose(pf.define(MM, target="host").mm(a, b), a @ b, rtol=1e-3, atol=5e-3)


SQUEEZE_EXCITE = """def se(float(C, D) W, float(D) Z, float(H, V, C) X) -> (Y, G) {
  G(c) +=! Z(d) * W(c, d)
  Y(h, v, c) = sigmoid(G(c)) * X(h, v, c)
}"""


def test_a_gate_broadcast_over_a_map_is_scheduled_apart_from_it():
    """A squeeze-excite gate (one value per channel) scaling a whole map: scheduled as
    separate nests, so the map's loops keep its contiguous channels innermost (fused,
    the gate's channel loop led and the map was read along w, a gather per vector)."""
    import numpy as np
    import polyfuse as pf
    sizes = {"C": 40, "D": 8, "H": 6, "V": 5}
    d, _ = nest(SQUEEZE_EXCITE, "se", sizes)
    assert default_options(d, sizes, DEFAULT_MACHINE).fusion is Fusion.MIN
    rng = np.random.default_rng(0)
    w, z = rng.standard_normal((40, 8)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    x = rng.standard_normal((6, 5, 40)).astype(np.float32)
    k = pf.define(SQUEEZE_EXCITE, target="host").se
    loops = avx512_loops(SQUEEZE_EXCITE, w, z, x)
    lines = loops.splitlines()
    store = next(k for k, line in enumerate(lines) if line.strip().startswith("Y("))
    assert "in 0:40 vectorize(16)" in lines[store - 1], loops   # channels innermost
    y, g = k(w, z, x)
    np.testing.assert_allclose(g, w @ z, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, x / (1 + np.exp(-(w @ z))), rtol=1e-5, atol=1e-6)


@pytest.mark.unit
def test_the_space_is_built_on_the_same_nest():
    task = Task(CONV, "conv", ((1, 64, 30, 30), (64, 64, 3, 3)), ("float32", "float32"))
    space = SearchSpace.for_task(task)
    assert space.nest == LoopNest.of(task.definition, task.sizes)
    w = space.nest.members.index("w")
    assert max(space.candidates[f"tile_sizes.{w}"]) == 28 == space.nest.extent_of()["w"]
    assert space.heuristic == default_options(task.definition, task.sizes, DEFAULT_MACHINE)


@pytest.mark.unit
def test_the_schedule_tiles_the_member_the_name_says():
    d, mm = nest(MM, "mm", MM_SIZES)
    only_k = mm.from_named(NamedOptions(tile_sizes=(("k", 4),)), MappingOptions())
    assert only_k.tile_sizes == (0, 0, 4)
    text = str(compute_schedule(build_model(d), only_k, MM_SIZES))
    # the model's dimensions are the nest's members in order: t2 is k
    assert "(t2 - (t2) mod 4)" in text and "(t0 - (t0) mod 1073741824)" in text
    outer_k = mm.from_named(NamedOptions(tile_sizes=(("m", 8), ("n", 8)), point_order=("k", "m", "n")),
                            MappingOptions())
    text = str(compute_schedule(build_model(d), outer_k, MM_SIZES))
    assert 'child: { schedule: "[s_M, s_K, s_N] -> [{ S0[t0, t1, t2] -> [((t2) mod 1073741824)] }' in text


@pytest.mark.unit
def test_named_options_round_trip():
    _, mm = nest(MM, "mm", MM_SIZES)
    o = MappingOptions(fusion=Fusion.MIN, tile_sizes=(32, 64, 16), register_tile=(4, 16, 0),
                       tile_order=(1, 0, 2), point_order=(2, 0, 1), vector_width=16, unroll_jam=4)
    named = mm.to_named(o)
    assert named.to_json() == {"tile_sizes": {"m": 32, "n": 64, "k": 16},
                               "register_tile": {"m": 4, "n": 16, "k": 0},
                               "tile_order": ["n", "m", "k"], "point_order": ["k", "m", "n"]}
    assert NamedOptions.from_json(named.to_json()) == named
    assert mm.from_named(named, MappingOptions(fusion=Fusion.MIN, vector_width=16, unroll_jam=4)) == o
    assert mm.from_named(mm.to_named(MappingOptions()), MappingOptions()) == MappingOptions()


@pytest.mark.unit
def test_named_options_map_onto_another_nest_by_name():
    src = "def f(float(N,W) I) -> (O) { O(n, j, w) +=! I(n, w + j + k) where j in 0:2, k in 0:3 }"
    _, two = nest(src, "f", {"N": 8, "W": 70})
    _, one = nest(src.replace("0:2", "0:1"), "f", {"N": 8, "W": 70})
    tuned = MappingOptions(tile_sizes=(4, 2, 32, 0), point_order=(3, 0, 1, 2))   # k, n, j, w
    placed = one.from_named(two.to_named(tuned), MappingOptions())
    assert placed.tile_sizes == (4, 32, 0)        # by position, w would get j's 2
    assert placed.point_order == (2, 0, 1)        # k, n, w: j has no loop here
    _, mm = nest(MM, "mm", MM_SIZES)
    assert mm.from_named(two.to_named(tuned), MappingOptions()).point_order == ()   # m has no place


@pytest.mark.unit
@pytest.mark.parametrize("bad", [[1], {"tile_sizes": {"m": -1}}, {"tile_sizes": {"m": True}},
                                 {"point_order": ["m", "m"]}, {"point_order": "mn"}, {"unroll": 2}])
def test_bad_named_options_are_refused(bad):
    with pytest.raises(OptionError, match="named"):
        NamedOptions.from_json(bad)


def test_a_reduction_over_an_empty_range_compiles_and_gives_its_empty_output():
    """``j + 1`` in 0:N leaves j no values when N is 1: the heuristics tile nothing (they
    divided by the empty extent) and the host gives what the interpreter gives."""
    src = "def f(float(N, N, N) X0, float(N) X1) -> (O) { O(j) +=! X0(i, i, j + 1) }"
    x0, x1 = np.ones((1, 1, 1), np.float32), np.ones(1, np.float32)
    want = pf.define(src).f(x0, x1)
    got = pf.define(src, target="host").f(x0, x1)
    assert want.shape == got.shape == (0,)
