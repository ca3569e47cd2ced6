"""Builder and runner: candidates are timed in child processes, checked against the
reference, and a crash, a hang or a wrong answer is recorded while the batch goes on."""

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from polyfuse.autotune import measure
from polyfuse.autotune.measure import (ErrorCode, Fault, MeasureConfig, MeasureResult,
                                       measure_all, measure_one)
from polyfuse.autotune.task import Task
from polyfuse.scheduler.options import MappingOptions

MATMUL = Task("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
              "mm", ((64, 64), (64, 64)), ("float32", "float32"))

DEFAULT = MappingOptions()
TILED = MappingOptions(tile_sizes=(32, 32, 8), vector_width=8)
SEGFAULTS = MappingOptions(unroll=2)
HANGS = MappingOptions(unroll=4)
WRONG = MappingOptions(tile_sizes=(16, 16, 16))

FAULTY = MeasureConfig(number=5, repeat=2, run_timeout=1.0, jobs=2, inject_faults={
    SEGFAULTS: Fault.SEGFAULT, HANGS: Fault.HANG, WRONG: Fault.WRONG_ANSWER})


def assert_measured(result: MeasureResult, repeat: int) -> None:
    assert result.error is ErrorCode.NONE, result.message
    assert result.ok and result.message == ""
    assert len(result.costs) == repeat
    # 64^3 multiply-adds take tens of microseconds; a second would mean a broken timer
    assert all(0 < c < 0.05 for c in result.costs), result.costs
    assert result.mean == pytest.approx(sum(result.costs) / repeat)
    assert result.build_seconds > 0


def test_candidates_are_measured_and_checked():
    results = measure_all(MATMUL, [DEFAULT, TILED], MeasureConfig(number=5, repeat=3, jobs=2))
    for result in results:
        assert_measured(result, 3)


def test_a_candidate_slower_than_the_cutoff_is_timed_once():
    [slow] = measure_all(MATMUL, [DEFAULT], MeasureConfig(number=5, repeat=3, jobs=1, cutoff=1e-9))
    assert slow.ok and len(slow.costs) == 1 and slow.costs[0] > 0


def assert_faults_recorded(results: list[MeasureResult]) -> None:
    crashed, hung, wrong, fine = results
    assert crashed.error is ErrorCode.RUNTIME_ERROR
    assert "SIGSEGV" in crashed.message
    assert hung.error is ErrorCode.TIMEOUT
    assert "longer than 1 s" in hung.message
    assert wrong.error is ErrorCode.WRONG_ANSWER
    assert "output 'C': 1 of 4096 values differ" in wrong.message
    for failed in (crashed, hung, wrong):
        assert not failed.ok and failed.costs == () and failed.mean == float("inf")
    assert_measured(fine, 2)


def test_crash_hang_and_wrong_answer_are_recorded_and_the_batch_goes_on():
    assert_faults_recorded(measure_all(MATMUL, [SEGFAULTS, HANGS, WRONG, DEFAULT], FAULTY))


def test_an_executor_measures_the_same():
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = measure_all(MATMUL, [SEGFAULTS, HANGS, WRONG, DEFAULT], FAULTY, executor=pool)
    assert_faults_recorded(results)


def test_a_definition_the_scheduler_refuses_is_a_compile_error():
    task = Task("def f(float(N) A, float(M) B, float(K) X) -> (C) "
                "{ C(i) +=! A(i) * X(j) where j in 0:N*M }", "f", ((4,), (4,), (16,)),
                ("float32",) * 3)
    [result] = measure_all(task, [DEFAULT])
    assert result.error is ErrorCode.COMPILE_ERROR
    assert result.message == "ScheduleError: range bound M * N is not affine"
    assert measure_one(task, DEFAULT, MeasureConfig()).error is ErrorCode.COMPILE_ERROR


def test_builds_fill_the_disk_cache_and_runs_load_from_it(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", str(tmp_path))
    config = MeasureConfig(number=2, repeat=1)
    assert_measured(measure_all(MATMUL, [TILED], config)[0], 1)
    [entry] = tmp_path.glob("*.o")
    stored = entry.stat().st_ino
    assert_measured(measure_all(MATMUL, [TILED], config)[0], 1)
    assert entry.stat().st_ino == stored  # loaded, not compiled and stored again


def test_without_a_disk_cache_each_run_builds(monkeypatch):
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", "")
    assert_measured(measure_all(MATMUL, [DEFAULT], MeasureConfig(number=2, repeat=2))[0], 2)


@pytest.mark.unit
def test_an_executor_failure_is_a_runtime_error(monkeypatch):
    def lost(*args):
        raise OSError("worker lost")
    monkeypatch.setattr(measure, "measure_one", lost)
    with ThreadPoolExecutor(max_workers=1) as pool:
        [result] = measure_all(MATMUL, [DEFAULT], executor=pool)
    assert result.error is ErrorCode.RUNTIME_ERROR
    assert result.message == "the executor raised OSError: worker lost"


def test_dask_workers_measure_on_their_own_machine():
    distributed = pytest.importorskip("distributed", reason="needs polyfuse[cluster]")
    with distributed.LocalCluster(n_workers=1, processes=True, threads_per_worker=1,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        results = measure_all(MATMUL, [DEFAULT, TILED], MeasureConfig(number=5, repeat=2),
                              executor=client.get_executor())
    for result in results:
        assert_measured(result, 2)


@pytest.mark.unit
def test_results_round_trip_through_json():
    for result in (MeasureResult((1e-5, 2e-5), ErrorCode.NONE, "", 0.25),
                   MeasureResult((), ErrorCode.TIMEOUT, "running took longer than 1 s", 0.1)):
        assert MeasureResult.from_json(json.loads(json.dumps(result.to_json()))) == result
    assert MeasureResult((1e-5, 3e-5), ErrorCode.NONE).mean == pytest.approx(2e-5)
    assert [e.value for e in ErrorCode] == ["none", "compile_error", "runtime_error", "timeout",
                                            "wrong_answer"]


@pytest.mark.unit
@pytest.mark.parametrize("bad", [{"number": 0}, {"repeat": 0}, {"warmup": -1}, {"jobs": 0},
                                 {"run_timeout": 0}])
def test_config_refuses_nonsense(bad):
    with pytest.raises(ValueError):
        MeasureConfig(**bad)


def test_a_kernel_accumulating_into_its_output_is_measured_from_given_contents():
    task = Task("def mm_acc(float(M,K) A, float(K,N) B) -> (C) { C(m,n) += A(m,k) * B(k,n) }",
                "mm_acc", ((32, 16), (16, 24)), ("float32", "float32"))
    start = measure._initial_outputs(task, {"M": 32, "K": 16, "N": 24}, 0)["C"]
    A, B = task.random_inputs(0)
    want = start.astype(np.float64) + A.astype(np.float64) @ B
    np.testing.assert_allclose(measure._reference(task, 0)["C"], want, rtol=1e-5, atol=1e-5)
    assert np.abs(start).max() > 0.1        # not zeros: a kernel that zeroed C would fail
    for result in measure_all(task, [DEFAULT, TILED], MeasureConfig(number=3, repeat=2, jobs=1)):
        assert result.ok, result.message
    [wrong] = measure_all(task, [WRONG], MeasureConfig(number=3, repeat=2, jobs=1, inject_faults={
        WRONG: Fault.WRONG_ANSWER}))
    assert wrong.error is ErrorCode.WRONG_ANSWER
