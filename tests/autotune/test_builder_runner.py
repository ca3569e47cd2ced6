"""The builder hands the runner typed results that carry the kernel's code: no disk cache
and no environment between them."""

import dataclasses
import pickle
import re

import numpy as np
import pytest

from polyfuse.autotune import isolation
from polyfuse.autotune.builder import BuildResult, build
from polyfuse.autotune.measure import ErrorCode, MeasureConfig
from polyfuse.autotune.runner import run
from polyfuse.autotune.task import Task
from polyfuse.errors import ArgumentError
from polyfuse.runtime.artifact import Artifact, load_kernel
from polyfuse.scheduler.options import MappingOptions


SOURCE = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
MATMUL = Task(SOURCE, "mm", ((48, 32), (32, 40)), ("float32", "float32"))
DEFAULT = MappingOptions()
TILED = MappingOptions(tile_sizes=(16, 16, 8), vector_width=8)
CONFIG = MeasureConfig(number=2, repeat=2, jobs=2)


def numpy_matmul(task: Task) -> tuple[list[np.ndarray], np.ndarray]:
    A, B = task.random_inputs(0)
    return [A, B], A.astype(np.float64) @ B.astype(np.float64)


def test_builds_are_typed_results_holding_the_kernel_code():
    builds = build(MATMUL, [DEFAULT, TILED], CONFIG)
    for options, built in zip([DEFAULT, TILED], builds):
        assert isinstance(built, BuildResult) and built.ok, built.message
        assert built.options == options and built.error is ErrorCode.NONE
        assert built.build_seconds > 0 and built.message == ""
        artifact = built.artifact
        assert isinstance(artifact, Artifact)
        assert artifact.code.startswith(b"\x7fELF")  # an object file
        assert dict(artifact.sizes) == {"M": 48, "K": 32, "N": 40}
        assert artifact.layout["layout"]["name"] == "mm"
        assert repr(options) == artifact.stages["options"] and "llvm_opt" in artifact.stages
    with pytest.raises(dataclasses.FrozenInstanceError):
        builds[0].artifact = None  # type: ignore[misc]


@pytest.mark.parametrize("target", ["x86", "reference"])
def test_a_loaded_artifact_computes_what_numpy_does(target):
    task = dataclasses.replace(MATMUL, target=target)
    [built] = build(task, [TILED], CONFIG)
    assert built.ok, built.message
    if target == "reference":   # the interpreter compiles nothing
        assert built.artifact.code == b"" and built.artifact.layout == {}
    kernel = load_kernel(pickle.loads(pickle.dumps(built.artifact)))
    args, want = numpy_matmul(task)
    np.testing.assert_allclose(kernel(*args), want, rtol=1e-5, atol=1e-5)
    [result] = run(task, [built], CONFIG)
    assert result.ok, result.message
    assert len(result.costs) == 2 and result.build_seconds == built.build_seconds


def no_child(*args, **kwargs):
    raise AssertionError("the runner started a child for a failed build")


def test_a_build_the_target_refuses_is_reported_without_running(monkeypatch):
    refused = dataclasses.replace(MATMUL, target="x86:notacpu")
    [built] = build(refused, [DEFAULT], CONFIG)
    assert built.error is ErrorCode.COMPILE_ERROR and not built.ok
    assert built.artifact is None
    assert built.message.startswith("TargetError: target 'x86:notacpu': LLVM does not know "
                                    "'notacpu'"), built.message
    [late] = build(MATMUL, [DEFAULT], dataclasses.replace(CONFIG, build_timeout=1e-3))
    assert late.error is ErrorCode.TIMEOUT and late.artifact is None
    assert late.message == "building took longer than 0.001 s"
    monkeypatch.setattr(isolation, "child", no_child)
    failed, timed_out = run(refused, [built, late], CONFIG)
    assert (failed.error, failed.message, failed.costs) == (built.error, built.message, ())
    assert failed.build_seconds == built.build_seconds
    assert (timed_out.error, timed_out.message) == (ErrorCode.TIMEOUT, late.message)


def test_the_runner_needs_neither_the_disk_cache_nor_the_environment(tmp_path, monkeypatch):
    built_in, run_in = tmp_path / "build-cache", tmp_path / "run-cache"
    run_in.mkdir()
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", str(built_in))
    builds = pickle.loads(pickle.dumps(build(MATMUL, [DEFAULT, TILED], CONFIG)))
    assert list(built_in.glob("*.o"))     # the builder's children cached what they compiled
    for entry in built_in.iterdir():       # ... and the runner cannot use it
        entry.unlink()
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", str(run_in))
    for result in run(MATMUL, builds, CONFIG):
        assert result.ok, result.message
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", "")   # the disk cache off: runs the same
    assert all(r.ok for r in run(MATMUL, builds, CONFIG))
    assert list(run_in.iterdir()) == [] and list(built_in.iterdir()) == []


def test_an_artifact_that_does_not_load_is_a_compile_error():
    [built] = build(MATMUL, [DEFAULT], CONFIG)
    garbage, no_layout = (dataclasses.replace(built, artifact=dataclasses.replace(built.artifact, **change))
                          for change in ({"code": b"not an object"}, {"layout": {}}))
    refused, raised = run(MATMUL, [garbage, no_layout], CONFIG)
    for result in (refused, raised):
        assert result.error is ErrorCode.COMPILE_ERROR and result.costs == ()
        assert result.build_seconds == built.build_seconds
    # the JIT's linker checks the object and says what is wrong
    assert re.fullmatch(r"CodegenError: the JIT could not link kernel 'mm': .*not recognized as a "
                        r"valid object file", refused.message), refused.message
    assert raised.message == "KeyError: 'layout'"


def test_a_build_result_has_an_artifact_exactly_when_it_has_no_error():
    with pytest.raises(ArgumentError, match="artifact exactly when it has no error"):
        BuildResult(DEFAULT, None, 0.1)
    [built] = build(MATMUL, [DEFAULT], CONFIG)
    with pytest.raises(ArgumentError, match="got error compile_error and an artifact"):
        dataclasses.replace(built, error=ErrorCode.COMPILE_ERROR)
