"""Reductions across a block's threads (block_reduction): the heuristic picks them for
row reductions (softmax, layernorm: one launch each, a row per block) and long
reductions into few outputs; the GPU IR holds the warp shuffles, the shared slots
and their barriers, and the result equals the numpy oracle thread by thread (GPU IR
interpreter), as CUDA C on the CPU emulator, and NVRTC and ptxas accept the code."""

import re

import ml_dtypes
import numpy as np
import pytest

import polyfuse as pf
from polyfuse.ir.gpu import WarpReduce, walk_gpu
from polyfuse.ir.gpu_interpreter import interpret_gpu_kernel
from polyfuse.ir.loops import ERROR_BUFFER
from polyfuse.runtime.arguments import bind_arguments
from polyfuse.scheduler.gpu_heuristics import default_gpu_options
from polyfuse.scheduler.gpu_mapping import DeviceLimits
from polyfuse.scheduler.model import zero_filled_outputs
from polyfuse.scheduler.options import Fusion, MappingOptions
from polyfuse.scheduler.pipeline import schedule_gpu_definition
from tests.cuda.helpers import assert_ptxas_accepts
from tests.cuda.test_emulated import emulated  # noqa: F401  (the fixture)
from tests.tc_programs import PROGRAMS_BY_NAME
from tests.targets.test_x86 import as_tuple, assert_close

f32 = np.float32
ROWSUM = "def rowsum({t}(M,K) X) -> (S) {{ S(m) +=! X(m,k) }}"
KEEP = """def keep(float(M,K) X) -> (S) {
    S(m) = X(m,0) * 10.0
    S(m) += X(m,k)
}"""


def _uniform(rng, shape, lo=-1.0, hi=1.0, dtype=f32):
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def _rowsum(dtype):
    def oracle(X):
        return (X.astype(np.float64).sum(axis=1).astype(X.dtype),)
    return oracle


def _case(name, source, entry, make, oracle):
    return pytest.param(source, entry, make, oracle, id=name)


def _canonical(name, make):
    p = PROGRAMS_BY_NAME[name]
    return _case(name, p.source, p.entry, make, p.oracle)


CASES = [
    _case("sum-3x1000", ROWSUM.format(t="float"), "rowsum", lambda r: (_uniform(r, (3, 1000)),), _rowsum(f32)),
    _case("sum-5x4097", ROWSUM.format(t="float"), "rowsum", lambda r: (_uniform(r, (5, 4097)),), _rowsum(f32)),
    _case("sum-float16", ROWSUM.format(t="float16"), "rowsum",
          lambda r: (_uniform(r, (3, 700), dtype=np.float16),), _rowsum(np.float16)),
    _case("sum-bfloat16", ROWSUM.format(t="bfloat16"), "rowsum",
          lambda r: (_uniform(r, (2, 900), dtype=ml_dtypes.bfloat16),), _rowsum(ml_dtypes.bfloat16)),
    _case("sum-float64", ROWSUM.format(t="double"), "rowsum",
          lambda r: (_uniform(r, (4, 1300), dtype=np.float64),), _rowsum(np.float64)),
    _case("sum-keeps-prior-value", KEEP, "keep", lambda r: (_uniform(r, (3, 1000)),),
          lambda X: ((X[:, 0].astype(np.float64) * 10.0 + X.astype(np.float64).sum(axis=1)).astype(f32),)),
    _canonical("int32_sum", lambda r: (r.integers(-2**20, 2**20, size=(4, 3000)).astype(np.int32),)),
    _canonical("prod_reduction", lambda r: (_uniform(r, (3, 600), 0.998, 1.002),)),
    _canonical("max_min_reduction", lambda r: (_uniform(r, (6, 1000), -3.0, 3.0),)),
    _canonical("softmax", lambda r: (_uniform(r, (3, 1000), -4.0, 4.0),)),
    _canonical("layernorm", lambda r: (_uniform(r, (5, 1100)), _uniform(r, (1100,)), _uniform(r, (1100,)),
                                       f32(1e-5))),
]

# explicit options: blocks that are no power of two, fewer blocks than rows, several rows
# and statements in one launch; row pipelines over one warp, three warps and 100 threads
OPTIONS = {
    "heuristic": None,
    "block-100-grid-2": MappingOptions(fusion=Fusion.PRESERVE, tile_sizes=(1, 0), block=(100,), grid=2,
                                       block_reduction=True),
    "block-37-rows-fused": MappingOptions(fusion=Fusion.PRESERVE, tile_sizes=(4, 0), block=(37, 3),
                                          block_reduction=True),
    "rows-warp": MappingOptions(fusion=Fusion.ROWS, tile_sizes=(1, 0), block=(32,), block_reduction=True),
    "rows-96-grid-2": MappingOptions(fusion=Fusion.ROWS, tile_sizes=(1, 0), block=(96,), grid=2,
                                     block_reduction=True),
    "rows-100": MappingOptions(fusion=Fusion.ROWS, tile_sizes=(1, 0), block=(100,), block_reduction=True),
}


def _inputs(make):
    return make(np.random.default_rng(7))


def _gpu_kernel(source, entry, args, options):
    d = pf.define(source)[entry].definition
    bound = bind_arguments(d, args)
    options = options or default_gpu_options(d, bound.sizes)
    return schedule_gpu_definition(d, bound.sizes, options, DeviceLimits()), bound, d


@pytest.mark.unit
@pytest.mark.parametrize("source, entry, make, oracle", CASES)
def test_the_heuristic_reduces_long_rows_across_the_block(source, entry, make, oracle):
    d = pf.define(source)[entry].definition
    options = default_gpu_options(d, bind_arguments(d, _inputs(make)).sizes)
    width = options.block[0]
    assert options.block_reduction and len(options.block) == 1 and width & (width - 1) == 0
    kernel, _, _ = _gpu_kernel(source, entry, _inputs(make), None)
    for launch in kernel.launches:
        warps = [s for s in walk_gpu(launch.body) if isinstance(s, WarpReduce)]
        text = str(launch)
        x = launch.block[0]
        if x % 32 and x & (x - 1):  # (maxmin's 6 rows per column) a tree in shared memory
            continue
        assert warps
        if x <= 32:   # one warp: shuffles, no memory, no barrier
            assert all(w.lanes == launch.block[0] for w in warps) and not launch.shared
        else:                       # shuffles in each warp, the warps' totals through shared slots
            assert all(w.lanes == 32 for w in warps)
            assert all(t.shape == (launch.block[0] // 32,) for t in launch.shared)
            assert text.count("barrier") >= len(launch.shared)
    if entry in ("softmax", "layernorm"):  # the row pipeline runs in one launch
        assert options.fusion is Fusion.ROWS and len(kernel.launches) == 1


@pytest.mark.unit
def test_a_short_reduction_into_many_outputs_stays_in_each_thread():
    d = pf.define(ROWSUM.format(t="float")).rowsum.definition
    assert not default_gpu_options(d, {"M": 4096, "K": 8}).block_reduction
    rows = default_gpu_options(d, {"M": 100000, "K": 1000})
    assert rows.block_reduction and rows.block == (128,) and rows.fusion is Fusion.ROWS
    assert default_gpu_options(d, {"M": 8, "K": 4096}).block == (512,)
    assert default_gpu_options(d, {"M": 8, "K": 64}).block == (32,)
    # a sum down many columns: each thread its column (neighbours read neighbours)
    columns = pf.define("def colsum(float(M,K) X) -> (S) { S(k) +=! X(m,k) }").colsum.definition
    assert not default_gpu_options(columns, {"M": 100000, "K": 10000}).block_reduction


@pytest.mark.unit
def test_a_block_of_no_power_of_two_folds_its_top_threads_first():
    args = (_uniform(np.random.default_rng(0), (3, 1000)),)
    kernel, _, _ = _gpu_kernel(ROWSUM.format(t="float"), "rowsum", args, OPTIONS["block-100-grid-2"])
    launch = kernel.launches[0]
    assert launch.block == (100, 1, 1) and launch.grid == 2
    text = str(launch)
    # 100 partials: 36 fold onto the first 64, then 32, 16, ..., 1
    assert "thread.x for pf_t in 0:36 {" in text and "S_r0(pf_t + 64)" in text
    assert "S_r0(pf_t + 32)" in text and "S_r0(pf_t + 1)" in text
    # after the last step and a barrier, every thread takes the total, one adds it to S's value
    tail = text[text.index("S_r0(pf_t + 1)"):]
    assert tail.index("barrier") < tail.index("let acc1 = S_r0(0)") < tail.index("single thread") \
        < tail.index("let acc1 = S(c0) + acc1")


@pytest.mark.unit
def test_ninety_six_threads_shuffle_in_three_warps():
    args = (_uniform(np.random.default_rng(0), (3, 1000)),)
    kernel, _, _ = _gpu_kernel(PROGRAMS_BY_NAME["softmax"].source, "softmax", args, OPTIONS["rows-96-grid-2"])
    (launch,) = kernel.launches
    assert launch.block == (96, 1, 1) and [t.shape for t in launch.shared] == [(3,), (3,)]
    text = str(launch)
    assert "warp reduce max acc1 over 32 lanes" in text and "warp reduce + acc2 over 32 lanes" in text
    # each warp's first lane writes its slot; after a barrier every thread combines the three
    tail = text[text.index("warp reduce max"):]
    assert tail.index("if pf_t % 32 == 0") < tail.index("barrier") < tail.index("for pf_tw in 0:3")


@pytest.mark.unit
@pytest.mark.parametrize("budget, shared", [(396, 0), (400, 400)])
def test_partials_count_against_the_shared_memory_budget(budget, shared):
    """100 float partials take 400 bytes; where they do not fit the sum stays sequential."""
    args = (_uniform(np.random.default_rng(0), (3, 1000)),)
    options = MappingOptions(fusion=Fusion.PRESERVE, tile_sizes=(1, 0), block=(100,), block_reduction=True,
                             shared_memory_bytes=budget)
    kernel, _, _ = _gpu_kernel(ROWSUM.format(t="float"), "rowsum", args, options)
    assert kernel.launches[0].shared_bytes == shared


@pytest.mark.unit
def test_trees_fit_a_small_device():
    small = DeviceLimits(arch="sm_80", max_threads=64, max_block=(16, 8, 2), max_grid=7, shared_bytes=1024)
    args = (_uniform(np.random.default_rng(0), (5, 4097)),)
    d = pf.define(ROWSUM.format(t="float")).rowsum.definition
    bound = bind_arguments(d, args)
    kernel = schedule_gpu_definition(d, bound.sizes, default_gpu_options(d, bound.sizes), small)
    launch = kernel.launches[0]
    assert launch.block == (16, 1, 1) and launch.grid == 5 and not launch.shared   # one warp's shuffles
    got = interpret_gpu_kernel(kernel, dict(bound.values), zero_filled_outputs(d, bound.sizes))
    assert_close(got["S"], _rowsum(f32)(*args)[0], "rowsum on a small device")


@pytest.mark.unit
def test_block_reduction_round_trips_through_json():
    options = MappingOptions(block_reduction=True, block=(128,))
    assert MappingOptions.from_json(options.to_json()) == options


@pytest.mark.parametrize("opt", OPTIONS)
@pytest.mark.parametrize("source, entry, make, oracle", CASES)
def test_the_tree_matches_the_oracle_thread_by_thread(source, entry, make, oracle, opt):
    args = _inputs(make)
    kernel, bound, d = _gpu_kernel(source, entry, args, OPTIONS[opt])
    assert any(launch.shared or any(isinstance(s, WarpReduce) for s in walk_gpu(launch.body))
               for launch in kernel.launches)
    values = dict(bound.values)
    if any(b.name == ERROR_BUFFER for b in kernel.buffers):
        values[ERROR_BUFFER] = np.zeros(1, np.int64)
    got = interpret_gpu_kernel(kernel, values, zero_filled_outputs(d, bound.sizes), seed=5)
    for k, (t, w) in enumerate(zip(d.outputs, as_tuple(oracle(*args)))):
        assert_close(got[t.name], w, f"{entry} output {k} ({opt})")


@pytest.mark.parametrize("opt", ["heuristic", "block-100-grid-2", "rows-96-grid-2"])
@pytest.mark.parametrize("source, entry, make, oracle", CASES)
def test_the_tree_in_cuda_c_runs_right_on_the_emulator(source, entry, make, oracle, opt, emulated):  # noqa: F811
    args = _inputs(make)
    kernel = pf.define(source, target="cuda", options=OPTIONS[opt])[entry]
    got = as_tuple(kernel(*args))
    cuda = kernel.specialize(*args).stages["cuda"]
    assert ("__shfl_xor_sync" in cuda) is (opt != "block-100-grid-2")
    for k, (g, w) in enumerate(zip(got, as_tuple(oracle(*args)))):
        assert_close(g, w, f"{entry} output {k} ({opt})")


@pytest.mark.parametrize("source, entry, make, oracle", CASES)
def test_the_tree_compiles_with_nvrtc_and_ptxas(source, entry, make, oracle, tmp_path):
    spec = pf.define(source, target="cuda")[entry].specialize(*_inputs(make))
    assert "shfl.sync.bfly" in spec.stages["ptx"]
    assert_ptxas_accepts(spec.stages["ptx"], tmp_path)


@pytest.mark.unit
def test_a_row_divides_once_and_multiplies_each_element():
    """Softmax's quotients by the row's sum: one reciprocal per row (after the barrier
    that publishes the sum), a product per element; a divisor that changes along the
    loop stays a division."""
    kernel, _, _ = _gpu_kernel(PROGRAMS_BY_NAME["softmax"].source, "softmax",
                               (_uniform(np.random.default_rng(0), (3, 1000)),), None)
    text = str(kernel)
    assert text.count("let pf_rcp0 = 1.0 / expSum(c0)") == 1 and "O(c0, c2) * pf_rcp0" in text
    assert text.index("barrier\n      let pf_rcp0") < text.index("O(c0, c2) * pf_rcp0")
    ratio = "def ratio(float(M,K) X) -> (Y, Z) { Y(m,k) = X(m,k) / X(m,0)\n Z(m,k) = X(m,0) / X(m,k) }"
    kernel, _, _ = _gpu_kernel(ratio, "ratio", (_uniform(np.random.default_rng(0), (3, 1000)),), None)
    text = str(kernel)
    row = re.search(r"let pf_rcp0 = 1\.0 / X\((c\d), 0\)", text)   # each thread its row's
    assert row and text.count("pf_rcp") == 2 and "* pf_rcp0" in text
    assert f"X({row.group(1)}, 0) / X({row.group(1)}, c" in text
