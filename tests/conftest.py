"""Test tiers, fixed randomness and a private kernel cache for the whole suite.

Tiers (docs/DESIGN.md): a test marked ``unit`` compiles no native code and starts no
process (a ``unit`` test that calls LLVM, NVRTC or a subprocess fails, naming what it
called); every other test is marked ``native`` here; ``slow`` tests run only when ``-m``
selects them. ``pytest -m unit`` is the fast tier.

Randomness is fixed: hypothesis derandomized, fuzz seeds 0. ``POLYFUSE_RANDOM_TESTS=1``
explores new cases instead (the seeds a run used are printed with its failures).
"""

import atexit
import multiprocessing.process
import os
import subprocess
import shutil
import tempfile

import pytest
from hypothesis import settings

RANDOM_TESTS = os.environ.get("POLYFUSE_RANDOM_TESTS", "") not in ("", "0")

settings.register_profile("fixed", derandomize=True, deadline=None)
settings.register_profile("random", deadline=None)
settings.load_profile("random" if RANDOM_TESTS else "fixed")

# Kernels compiled by the tests go to a fresh cache, not the user's.
if "POLYFUSE_CACHE_DIR" not in os.environ:
    os.environ["POLYFUSE_CACHE_DIR"] = tempfile.mkdtemp(prefix="polyfuse-test-cache-")
    atexit.register(shutil.rmtree, os.environ["POLYFUSE_CACHE_DIR"], ignore_errors=True)


# modules with no unit test that are slow to collect: left out when -m unit alone selects
# (the ONNX node suite builds its 4000 cases from onnx's test data on import, 11 s)
NO_UNIT_TESTS = frozenset({"test_node_suite.py"})


def pytest_ignore_collect(collection_path, config):
    if (config.option.markexpr or "").strip() == "unit" and collection_path.name in NO_UNIT_TESTS:
        return True
    return None


def pytest_collection_modifyitems(config, items):
    """``native`` on every test not marked ``unit``; ``slow`` tests skipped unless ``-m``
    names them."""
    run_slow = "slow" in (config.option.markexpr or "")
    skip = pytest.mark.skip(reason="a long run: select it with -m slow")
    for item in items:
        if "unit" not in item.keywords:
            item.add_marker(pytest.mark.native)
        if "slow" in item.keywords and not run_slow:
            item.add_marker(skip)


class NativeInUnitTest(AssertionError):
    pass


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise NativeInUnitTest(f"a test marked unit called {what}: mark it native (the "
                               "default) or keep the unit test to IR, front ends and interpreters")
    return refuse


@pytest.fixture(autouse=True)
def _unit_tests_stay_unit(request, monkeypatch):
    """A ``unit`` test that reaches LLVM, NVRTC, a subprocess or a process fails."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    import llvmlite.binding as llvm
    try:   # imported before subprocesses are refused: finding the CUDA libraries runs ldconfig
        from cuda.bindings import nvrtc
    except ImportError:
        nvrtc = None
    monkeypatch.setattr(llvm, "parse_assembly", _refuse("LLVM (llvmlite.binding.parse_assembly)"))
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("a subprocess"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse("a process"))
    if nvrtc is not None:
        monkeypatch.setattr(nvrtc, "nvrtcCompileProgram", _refuse("NVRTC"))
    yield
