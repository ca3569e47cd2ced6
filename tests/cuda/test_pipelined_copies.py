"""Pipelined copies (issue 37 item 2): the shared tiles of a reduction loop hold
``stages`` boxes, filled asynchronously (cp.async) ``stages - 1`` steps ahead. The GPU-IR
interpreter lands an asynchronous copy only at the wait that covers its group, so the
results below, against numpy at sizes no tile divides, show that each step waits for
its own copies; the emulator runs the CUDA C, and ptxas assembles it (LDGSTS in SASS:
test_sass.py)."""

from dataclasses import replace

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.ir.gpu import AsyncWait, CopyToShared, walk_gpu
from polyfuse.ir.gpu_interpreter import interpret_gpu_kernel
from polyfuse.ir.loops import LoopRewriter, Scope
from polyfuse.scheduler.gpu_mapping import DeviceLimits
from polyfuse.scheduler.options import Fusion, MappingOptions
from polyfuse.scheduler.pipeline import schedule_gpu_definition
from tests.cuda.helpers import assert_ptxas_accepts
from tests.cuda.test_emulated import emulated  # noqa: F401  (a fixture)
from tests.cuda.test_register_tiles import BMM, CONV, MM, TMM, _inputs, _schedule

SMALL = MappingOptions(tile_sizes=(8, 12, 4), reorder_reductions=True, fusion=Fusion.MIN, block=(3, 4), unroll=2)
CASES = {
    "mm 19x21x13": (MM, [(19, 21), (21, 13)], lambda a, b: a @ b, SMALL),
    "tmm 11x23x17": (TMM, [(23, 11), (17, 23)], lambda a, b: a.T @ b.T, SMALL),
    "bmm 2x13x9x11": (BMM, [(2, 13, 9), (2, 9, 11)], lambda x, y: x @ y, replace(SMALL, tile_sizes=(1, 8, 12, 4))),
}


def _copies(kernel) -> list[CopyToShared]:
    return [s for launch in kernel.launches for s in walk_gpu(launch.body) if isinstance(s, CopyToShared)]


def _run(kernel, d, args):
    out = d.outputs[0].name
    return interpret_gpu_kernel(kernel, {t.name: a for t, a in zip(d.inputs, args)}, {out}, seed=3)[out]


@pytest.mark.unit
@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("case", CASES)
def test_pipelined_copies_match_numpy_thread_by_thread(case, stages):
    source, shapes, oracle, options = CASES[case]
    kernel, d = _schedule(source, shapes, replace(options, stages=stages))
    staged = {t.name for launch in kernel.launches for t in launch.shared if t.stages == stages}
    # the copies of the reduction loop are asynchronous (bmm copies its X box once, before it)
    assert staged and all(c.asynchronous == (c.tile in staged) for c in _copies(kernel))
    args = _inputs(shapes)
    np.testing.assert_allclose(_run(kernel, d, args), oracle(*(a.astype(np.float64) for a in args)),
                               rtol=1e-4, atol=1e-4)


class _NoWaits(LoopRewriter):
    def leaf(self, s, scope):
        return () if isinstance(s, AsyncWait) else s


@pytest.mark.unit
def test_a_step_that_does_not_wait_for_its_copies_reads_stale_tiles():
    """The interpreter lands copies only at waits: without them a step reads tiles its
    copies have not filled yet (NaN, as shared memory starts there), so a pipeline that
    waits too little shows."""
    source, shapes, oracle, _ = CASES["mm 19x21x13"]
    kernel, d = _schedule(source, shapes, replace(SMALL, stages=2))
    broken = replace(kernel, launches=tuple(replace(launch, body=_NoWaits().body(launch.body, Scope()))
                                            for launch in kernel.launches))
    assert np.isnan(_run(broken, d, _inputs(shapes))).any()


@pytest.mark.unit
def test_stages_shrink_to_what_shared_memory_holds():
    """Two tiles of 8 x 4 and 4 x 12 floats (padded rows) per stage: four stages where
    they fit, fewer where the budget is smaller, none before sm_80 (no cp.async)."""
    d = pf.define(MM).mm.definition

    def staged(options, limits=DeviceLimits()):
        kernel = schedule_gpu_definition(d, {"M": 19, "K": 21, "N": 13}, options, limits)
        return {t.stages for launch in kernel.launches for t in launch.shared}, _copies(kernel)
    one_stage = sum(t.bytes for t in _schedule(MM, [(19, 21), (21, 13)], SMALL)[0].launches[0].shared)
    assert staged(replace(SMALL, stages=4))[0] == {4}
    assert staged(replace(SMALL, stages=4, shared_memory_bytes=3 * one_stage))[0] == {3}
    stages, copies = staged(replace(SMALL, stages=4, shared_memory_bytes=2 * one_stage - 4))
    assert stages == {1} and not any(c.asynchronous for c in copies)
    stages, copies = staged(replace(SMALL, stages=3), DeviceLimits(arch="sm_75"))
    assert stages == {1} and not any(c.asynchronous for c in copies)


@pytest.mark.unit
def test_the_default_contraction_pipelines_two_stages():
    kernel, _ = _schedule(MM, [(4096, 4096), (4096, 4096)])
    (launch,) = kernel.launches
    assert {t.stages for t in launch.shared} == {2} and launch.shared_bytes <= 48 * 1024
    assert all(c.asynchronous for c in _copies(kernel))


def test_ptxas_assembles_the_asynchronous_copies(tmp_path):
    mm = pf.define(MM, target="cuda", options=replace(SMALL, stages=3)).mm
    spec = mm.specialize(*_inputs([(67, 45), (45, 53)]))
    ptx = spec.stages["ptx"]
    assert "cp.async.ca.shared.global" in ptx and "cp.async.wait_group 2" in ptx
    assert_ptxas_accepts(ptx, tmp_path)


EMULATED = {
    "mm 67x45x53": (MM, [(67, 45), (45, 53)], lambda a, b: a @ b),
    "mm 67x44x52": (MM, [(67, 44), (44, 52)], lambda a, b: a @ b),   # rows of whole 16-byte words
    "conv 2x5x13x11 3x3": (CONV, [(2, 5, 13, 11), (7, 5, 3, 3)], None),
}


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("case", EMULATED)
def test_pipelined_copies_run_right_as_cuda_c(case, stages, emulated):  # noqa: F811
    source, shapes, oracle = EMULATED[case]
    args = _inputs(shapes)
    options = replace(SMALL, stages=stages, tile_sizes=SMALL.tile_sizes + (0,) * (len(shapes[0]) + 1))
    kernel = next(iter(pf.define(source, target="cuda", options=options)))
    want = next(iter(pf.define(source)))(*args) if oracle is None else \
        oracle(*(a.astype(np.float64) for a in args)).astype(np.float32)
    np.testing.assert_allclose(kernel(*args), want, rtol=1e-4, atol=1e-4)
    cuda = kernel.specialize(*args).stages["cuda"]
    assert "pf_cp_async4(" in cuda
    # 16 bytes at a time where the rows of both tiles are whole words (a uniform test of
    # the buffer's address and the box's offset picks that path at run time)
    assert ("pf_cp_async16(" in cuda) == (case == "mm 67x44x52")


def test_a_buffer_off_its_16_byte_words_takes_the_element_copies(emulated):  # noqa: F811
    """The 16-byte copies test the buffer's address at run time: buffers 4 bytes past a
    word (as a view into another tensor may start) take the element copies, right."""
    emulated.misalign = 4
    args = _inputs([(67, 44), (44, 52)])
    kernel = pf.define(MM, target="cuda", options=replace(SMALL, stages=2)).mm
    np.testing.assert_allclose(kernel(*args), args[0].astype(np.float64) @ args[1], rtol=1e-4, atol=1e-4)
    assert "pf_cp_async16(" in kernel.specialize(*args).stages["cuda"]


def test_tiles_above_48_kib_take_dynamic_shared_memory(emulated):  # noqa: F811
    """Four stages of 128 x 16 tiles (73 KiB) ask for dynamic shared memory: one array cut
    into the tiles, raised per kernel before its launch, the products right at sizes no
    tile divides."""
    from polyfuse.scheduler.gpu_heuristics import default_gpu_options
    from polyfuse.targets.cuda_sass import resources
    d = next(iter(pf.define(MM))).definition
    options = replace(default_gpu_options(d, {"M": 4096, "K": 4096, "N": 4096}), stages=4,
                      shared_memory_bytes=100 * 1024)
    kernel = next(iter(pf.define(MM, target="cuda", options=options)))
    a, b = _inputs([(200, 70), (70, 150)])
    np.testing.assert_allclose(kernel(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    spec = kernel.specialize(a, b)
    assert "extern __shared__" in spec.stages["cuda"] and "x4" in spec.stages["gpu"].splitlines()[1]
    assert emulated.allowed and max(emulated.allowed.values()) > 48 * 1024
    (used,) = resources(spec.stages["ptxas"]).values()
    assert used.shared_bytes == 0 and used.spill_stores == 0   # all of it dynamic
    with pytest.raises(pf.OptionError):
        pf.define(MM, target="cuda", options=replace(options, shared_memory_bytes=-1))
