"""The GPU mapping on a CPU: every canonical program run thread by thread by the GPU IR
interpreter (barriers, shared tiles, grid-stride blocks) against the numpy oracles, and
the launch configuration, shared-memory budget and barrier placement checked directly."""

import math

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.ir.gpu import Barrier, CopyToShared, GpuKernel, ThreadFor, walk_gpu
from polyfuse.ir.gpu_interpreter import interpret_gpu_kernel
from polyfuse.ir.loops import ERROR_BUFFER, Store
from polyfuse.runtime.arguments import bind_arguments
from polyfuse.scheduler.gpu_heuristics import default_gpu_options
from polyfuse.scheduler.gpu_mapping import DeviceLimits
from polyfuse.scheduler.model import zero_filled_outputs
from polyfuse.scheduler.options import Fusion, MappingOptions
from polyfuse.scheduler.pipeline import schedule_gpu_definition
from tests.cuda.helpers import arguments
from tests.tc_programs import PROGRAMS, PROGRAMS_BY_NAME
from tests.targets.test_x86 import as_tuple, assert_close

pytestmark = pytest.mark.unit

OPTIONS = {
    "default": None,
    "odd-tiles-small-blocks-short-grid": MappingOptions(tile_sizes=(3, 5, 2), block=(4, 2), grid=3,
                                                        unroll=2),
    "max-fusion-3d-blocks": MappingOptions(fusion=Fusion.MAX, tile_sizes=(4, 4, 4), block=(3, 2, 2),
                                           grid=2),
    "tiny-shared-budget": MappingOptions(tile_sizes=(5, 3, 4, 2), reorder_reductions=True,
                                         fusion=Fusion.MIN, block=(2, 2, 2), grid=5,
                                         shared_memory_bytes=200),
    "no-promotion": MappingOptions(fusion=Fusion.PRESERVE, tile_sizes=(2, 8), block=(8,),
                                   use_shared_memory=False, use_private_memory=False),
    "block-reduction": MappingOptions(fusion=Fusion.PRESERVE, tile_sizes=(2, 3), block=(6, 2),
                                      block_reduction=True),
}


def gpu_kernel(program, options=None, limits=DeviceLimits()) -> tuple[GpuKernel, dict, object]:
    d = pf.define(program.source)[program.entry].definition
    bound = bind_arguments(d, arguments(program))
    options = options or default_gpu_options(d, bound.sizes)
    return schedule_gpu_definition(d, bound.sizes, options, limits), bound, d


@pytest.mark.parametrize("opt", OPTIONS, ids=list(OPTIONS))
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_mapped_program_matches_the_oracle_thread_by_thread(program, opt):
    kernel, bound, d = gpu_kernel(program, OPTIONS[opt])
    values = dict(bound.values)
    if any(b.name == ERROR_BUFFER for b in kernel.buffers):
        values[ERROR_BUFFER] = np.zeros(1, np.int64)
    got = interpret_gpu_kernel(kernel, values, zero_filled_outputs(d, bound.sizes), seed=3)
    want = as_tuple(program.oracle(*arguments(program)))
    for k, (t, w) in enumerate(zip(d.outputs, want)):
        assert_close(got[t.name], w, f"{program.name} output {k} ({opt})")


SMALL_DEVICE = DeviceLimits(arch="sm_80", max_threads=64, max_block=(16, 8, 2), max_grid=7,
                            shared_bytes=1024)


@pytest.mark.parametrize("limits", [DeviceLimits(), SMALL_DEVICE], ids=["sm_90", "small"])
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_launches_fit_the_device(program, limits):
    asked = MappingOptions(tile_sizes=(64, 64, 16), block=(32, 32))  # more than SMALL allows
    for options in (None, asked):
        kernel, _, _ = gpu_kernel(program, options, limits)
        for launch in kernel.launches:
            assert math.prod(launch.block) <= limits.max_threads
            assert all(1 <= b <= m for b, m in zip(launch.block, limits.max_block))
            assert 1 <= launch.grid <= limits.max_grid
            assert launch.shared_bytes <= limits.shared_bytes


def test_a_thread_axis_gets_no_more_threads_than_its_loop_has():
    kernel, _, _ = gpu_kernel(PROGRAMS_BY_NAME["matmul"])  # C is 7 x 9
    assert kernel.launches[0].block == (9, 7, 1)


MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def mm_kernel(options: MappingOptions | None = None, sizes=(128, 96, 64)) -> GpuKernel:
    d = pf.define(MM).mm.definition
    sizes = dict(zip("MKN", sizes))
    return schedule_gpu_definition(d, sizes, options or default_gpu_options(d, sizes), DeviceLimits())


@pytest.mark.parametrize("registers", [False, True], ids=["thread-region", "register-tile"])
@pytest.mark.parametrize("budget", [0, 16384, 9216, 8448, 8447, 4608, 4224, 4096, 100])
def test_promoted_tiles_stay_within_the_shared_memory_budget(budget, registers):
    kernel = mm_kernel(MappingOptions(tile_sizes=(32, 32, 32), reorder_reductions=True, fusion=Fusion.MIN,
                                      shared_memory_bytes=budget, use_private_memory=registers))
    launch = kernel.launches[0]
    limit = budget or DeviceLimits().shared_bytes
    assert launch.shared_bytes <= limit
    # each 32 x 32 float tile takes 32 x 33 x 4 bytes (rows padded against bank conflicts),
    # or 32 x 36 x 4 in a register tile (rows 16-byte aligned, for 128-bit reads)
    row = 36 if registers else 33
    assert len(launch.shared) == min(2, limit // (32 * row * 4))
    assert all(t.shape == (32, 32) and t.bytes == 32 * row * 4 for t in launch.shared)


def test_barriers_guard_a_reused_tile_on_both_sides():
    kernel = mm_kernel(MappingOptions(tile_sizes=(32, 32, 32), reorder_reductions=True, fusion=Fusion.MIN,
                                      use_private_memory=False))
    text = str(kernel)
    loop = text[text.index("for c2 in 0:96 step 32"):]
    # the copies, a barrier before the region reads them, a barrier before the next copy
    assert loop.index("copy A_s") < loop.index("barrier") < loop.index("thread.y for")
    assert loop.count("barrier") == 2
    assert loop.rindex("barrier") > loop.index("C(c0 + c3, c1 + c4) = C(c0 + c3, c1 + c4) + A_s0")


def test_a_register_tile_copies_and_syncs_inside_its_reduction_loop():
    kernel = mm_kernel(MappingOptions(tile_sizes=(128, 128, 32), reorder_reductions=True, fusion=Fusion.MIN,
                                      block=(16, 16)), sizes=(256, 1024, 256))
    text = str(kernel)
    region = text[text.index("threads c3 in 0:128 step 8 on y, c4 in 0:128 step 8 on x registers acc1 float32(8, 8)"):]
    loop = region[region.index("for c2 in 0:1024 step 32"):]
    # the copies of each step, a barrier, the products, a barrier before the next copies;
    # the accumulators start at zero before the loop (C's zeros are never read: the
    # runtime need not fill it) and are stored after it, once
    assert loop.index("copy A_s") < loop.index("barrier") < loop.index("acc1(c3r, c4r) = acc1(c3r, c4r) + A_s")
    assert loop[:loop.index("\n        }")].count("barrier") == 2
    assert region.index("acc1(c3r, c4r) = 0.0") < region.index("for c2") < region.index(") = acc1(c3r, c4r)")
    assert "= C(" not in region
    assert kernel.launches[0].block == (16, 16, 1) and kernel.launches[0].grid == 4


def test_no_barrier_where_each_thread_keeps_its_own_elements():
    # without shared tiles the k-tile loop reads and writes C only at the thread's own (m, n)
    kernel = mm_kernel(MappingOptions(tile_sizes=(32, 32, 32), use_shared_memory=False))
    assert not any(isinstance(s, Barrier) for launch in kernel.launches for s in walk_gpu(launch.body))
    elementwise = pf.define("def add(float(N,M) A, float(N,M) B) -> (C) { C(i,j) = A(i,j) + B(i,j) }")
    d = elementwise.add.definition
    sizes = {"N": 100, "M": 300}
    kernel = schedule_gpu_definition(d, sizes, default_gpu_options(d, sizes), DeviceLimits())
    assert not any(isinstance(s, (Barrier, CopyToShared)) for s in walk_gpu(kernel.launches[0].body))


def test_a_reduction_region_on_fewer_axes_runs_once_per_element():
    kernel, _, _ = gpu_kernel(PROGRAMS_BY_NAME["softmax"])  # row sums on x of a 2-D block
    assert kernel.launches[0].block[1] > 1
    sums = [s for s in walk_gpu(kernel.launches[0].body) if isinstance(s, ThreadFor)
            and any(isinstance(x, Store) and x.buffer == "expSum" for x in walk_gpu(s.body))]
    assert sums and all(s.idle == (1,) for s in sums)


def test_gpu_options_are_checked_and_round_trip_through_json():
    options = MappingOptions(tile_sizes=(16, 16), block=(16, 16), grid=80, use_shared_memory=False,
                             shared_memory_bytes=8192)
    assert MappingOptions.from_json(options.to_json()) == options
    with pytest.raises(ValueError, match="block"):
        MappingOptions(block=(64, 32))
    with pytest.raises(ValueError, match="block"):
        MappingOptions(block=(1, 1, 1, 1))
    with pytest.raises(ValueError, match="grid"):
        MappingOptions(grid=-1)


def test_loop_ir_with_block_and_thread_loops_prints_and_parses_back():
    from polyfuse.frontends.loop_ir import parse_kernel
    from polyfuse.ir.loops import LoopKernel
    d = pf.define(MM).mm.definition
    sizes = {"M": 640, "K": 40, "N": 480}
    stages: dict[str, str] = {}
    schedule_gpu_definition(d, sizes, default_gpu_options(d, sizes), DeviceLimits(), stages)
    text = stages["loops"]
    assert "block for c0" in text and "thread for c4" in text
    kernel = parse_kernel(text)
    assert isinstance(kernel, LoopKernel) and str(kernel) == text
