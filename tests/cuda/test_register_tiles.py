"""Register-tiled contractions (issue 37 item 1): each thread keeps a micro-tile of
accumulators through the whole reduction. Checked thread by thread by the GPU-IR
interpreter and as CUDA C by the emulator, against numpy, at sizes no tile divides."""

from dataclasses import replace

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.errors import IRVerificationError
from polyfuse.ir.gpu import Barrier, Threads, verify_gpu_kernel, walk_gpu
from polyfuse.ir.gpu_interpreter import interpret_gpu_kernel
from polyfuse.ir.loops import For, LoopRewriter, Scope
from polyfuse.scheduler.gpu_heuristics import default_gpu_options
from polyfuse.scheduler.gpu_mapping import DeviceLimits
from polyfuse.scheduler.options import Fusion, MappingOptions
from polyfuse.scheduler.pipeline import schedule_gpu_definition
from tests.cuda.emulator import CXX
from tests.cuda.test_emulated import emulated  # noqa: F401  (a fixture)

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
TMM = "def tmm(float(K,M) A, float(N,K) B) -> (C) { C(m,n) +=! A(k,m) * B(n,k) }"
BMM = "def bmm(float(Bt,M,K) X, float(Bt,K,N) Y) -> (Z) { Z(b,m,n) +=! X(b,m,k) * Y(b,k,n) }"
CONV = """def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
    O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw)
}"""
# small tiles, so that sizes of a few dozen leave partial tiles along every index
SMALL = MappingOptions(tile_sizes=(8, 12, 8), reorder_reductions=True, fusion=Fusion.MIN, block=(3, 4),
                       unroll=2)


def _inputs(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _schedule(source: str, shapes, options=None):
    d = next(iter(pf.define(source))).definition
    sizes = {}
    for t, shape in zip(d.inputs, shapes):
        sizes |= {s.name: n for s, n in zip(t.shape, shape) if hasattr(s, "name")}
    return schedule_gpu_definition(d, sizes, options or default_gpu_options(d, sizes), DeviceLimits()), d


def _tiles(kernel) -> list[Threads]:
    return [s for launch in kernel.launches for s in walk_gpu(launch.body) if isinstance(s, Threads)]


CASES = {
    "mm 19x21x13": (MM, [(19, 21), (21, 13)], lambda a, b: a @ b),
    "tmm 11x23x17": (TMM, [(23, 11), (17, 23)], lambda a, b: a.T @ b.T),
    "bmm 3x13x9x11": (BMM, [(3, 13, 9), (3, 9, 11)], lambda x, y: x @ y),
    "mm 1x1x40": (MM, [(1, 40), (40, 1)], lambda a, b: a @ b),
}


@pytest.mark.unit
@pytest.mark.parametrize("case", CASES)
def test_a_register_tile_matches_numpy_thread_by_thread(case):
    source, shapes, oracle = CASES[case]
    kernel, d = _schedule(source, shapes, SMALL)
    assert _tiles(kernel) or shapes[0][-2:] == (1, 40)
    args = _inputs(shapes)
    out = d.outputs[0].name
    got = interpret_gpu_kernel(kernel, {t.name: a for t, a in zip(d.inputs, args)}, {out}, seed=1)[out]
    want = oracle(*(a.astype(np.float64) for a in args))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.unit
def test_the_default_matmul_keeps_an_8x8_tile_per_thread_through_the_reduction():
    kernel, _ = _schedule(MM, [(4096, 4096), (4096, 4096)])
    (tile,) = _tiles(kernel)
    assert [(r.step, r.threads) for r in tile.ranges] == [(8, 16), (8, 16)]
    assert [(a.name, a.shape) for a in tile.registers] == [("acc1", (8, 8))]
    assert kernel.launches[0].block == (16, 16, 1)
    # the reduction's tile loop holds the copies and both barriers; the micro loops hold none
    (k_loop,) = [s for s in tile.body if isinstance(s, For)
                 and any(isinstance(x, Barrier) for x in walk_gpu(s.body))]
    assert sum(isinstance(x, Barrier) for x in k_loop.body) == 2
    verify_gpu_kernel(kernel)


@pytest.mark.unit
def test_a_barrier_only_some_threads_reach_is_refused():
    kernel, _ = _schedule(MM, [(64, 64), (64, 64)], SMALL)
    launch = kernel.launches[0]
    # a barrier under a point's own bound (the last tile is partial): some threads skip it
    class Skipped(LoopRewriter):
        def branch(self, s, scope):
            return replace(s, then=(Barrier(), *s.then))
    body = Skipped().body(launch.body, Scope())
    with pytest.raises(IRVerificationError, match="not every thread"):
        verify_gpu_kernel(replace(kernel, launches=(replace(launch, body=body),)))
    with pytest.raises(IRVerificationError, match="threads region of"):
        verify_gpu_kernel(replace(kernel, launches=(replace(launch, block=(1, 1, 1)),)))


EMULATED = {
    "mm 67x131x45": (MM, [(67, 131), (131, 45)], lambda a, b: a @ b),
    "mm 1x300x1": (MM, [(1, 300), (300, 1)], lambda a, b: a @ b),
    "mm 130x70x260": (MM, [(130, 70), (70, 260)], lambda a, b: a @ b),
    "tmm 45x131x67": (TMM, [(131, 45), (67, 131)], lambda a, b: a.T @ b.T),
    "bmm 3x37x29x41": (BMM, [(3, 37, 29), (3, 29, 41)], lambda x, y: x @ y),
    "conv 2x5x34x18 3x3": (CONV, [(2, 5, 34, 18), (7, 5, 3, 3)], None),
    "conv 2x5x19x23 3x3": (CONV, [(2, 5, 19, 23), (7, 5, 3, 3)], None),   # 17 x 21 outputs: one each
}
UNTILED = {"conv 2x5x19x23 3x3", "mm 1x300x1"}   # the second: a block-wide tree


@pytest.mark.skipif(CXX is None, reason="the emulator needs a C++20 compiler")
@pytest.mark.parametrize("case", EMULATED)
def test_a_register_tile_runs_right_as_cuda_c(case, emulated):  # noqa: F811
    source, shapes, oracle = EMULATED[case]
    args = _inputs(shapes)
    kernel = next(iter(pf.define(source, target="cuda")))
    if oracle is None:
        want = next(iter(pf.define(source)))(*args)
    else:
        want = oracle(*(a.astype(np.float64) for a in args)).astype(np.float32)
    got = kernel(*args)
    assert emulated.launches
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert ("float acc1[" in kernel.specialize(*args).stages["cuda"]) == (case not in UNTILED)


@pytest.mark.unit
def test_a_sum_from_zero_starts_its_registers_at_zero_and_the_runtime_fills_nothing():
    """``+=!`` into an output the runtime would zero: the register tile starts at zero
    (no load of the zeros), so the runtime need not fill C at all; ``+=`` adds to the
    caller's C, which the tile loads."""
    d = next(iter(pf.define(MM))).definition
    sizes = {"M": 19, "K": 21, "N": 13}
    initialized: set[str] = set()
    kernel = schedule_gpu_definition(d, sizes, SMALL, DeviceLimits(), initialized=initialized)
    assert initialized == {"C"} and "= C(" not in str(kernel)
    args = _inputs([(19, 21), (21, 13)])
    got = interpret_gpu_kernel(kernel, {"A": args[0], "B": args[1]}, zeroed=set(), seed=2)["C"]   # C poisoned
    np.testing.assert_allclose(got, args[0].astype(np.float64) @ args[1], rtol=1e-4, atol=1e-4)
    adding = next(iter(pf.define(MM.replace("+=!", "+=")))).definition
    initialized = set()
    kernel = schedule_gpu_definition(adding, sizes, SMALL, DeviceLimits(), initialized=initialized)
    assert not initialized and "acc1(c3r, c4r) = C(" in str(kernel)
