"""The tuner's search space for the cuda target: GPU genes only, and every point it
draws maps to launches that compute the right answer (run thread by thread) and compile."""

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.autotune.space import BLOCKS, SearchSpace
from polyfuse.autotune.task import Task
from polyfuse.ir.gpu_interpreter import interpret_gpu_kernel
from polyfuse.scheduler.gpu_heuristics import default_gpu_options
from polyfuse.scheduler.gpu_mapping import DeviceLimits
from polyfuse.scheduler.pipeline import schedule_gpu_definition
from polyfuse.targets.cuda import compile_gpu_kernel

MM = pf.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }").mm.definition
A = np.random.default_rng(0).uniform(-1, 1, (20, 12)).astype(np.float32)
B = np.random.default_rng(1).uniform(-1, 1, (12, 9)).astype(np.float32)


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    return SearchSpace.for_task(Task.of(MM, [A, B], "cuda"))


@pytest.mark.unit
def test_the_cuda_space_has_gpu_genes_and_starts_from_the_gpu_heuristic(space):
    assert space.default() == default_gpu_options(MM, {"M": 20, "K": 12, "N": 9})
    assert set(BLOCKS) <= set(space.candidates["block"])
    assert space.candidates["use_shared_memory"] == (False, True)
    assert space.candidates["block_reduction"] == (False, True)
    assert space.candidates["vector_width"] == (1, 2, 4)   # a thread's neighbouring iterations at a time
    for cpu_only in ("unroll_jam", "register_tile.0", "num_threads"):
        assert len(space.candidates[cpu_only]) == 1
    cpu = SearchSpace.for_task(Task.of(MM, [A, B], "x86"))
    assert cpu.candidates["block"] == ((),) and cpu.candidates["use_shared_memory"] == (True,)
    assert cpu.candidates["block_reduction"] == (False,)


def test_points_of_the_cuda_space_compute_the_product(space):
    rng = np.random.default_rng(5)
    sizes = {"M": 20, "K": 12, "N": 9}
    for options in [space.default()] + [space.sample(rng) for _ in range(6)]:
        assert space.is_valid(options)
        assert len(space.features(options)) == len(space.feature_names())
        kernel = schedule_gpu_definition(MM, sizes, options, DeviceLimits())
        got = interpret_gpu_kernel(kernel, {"A": A, "B": B}, {"C"}, seed=2)["C"]
        np.testing.assert_allclose(got, A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5,
                                   err_msg=str(options))
        assert compile_gpu_kernel(kernel).cubin
