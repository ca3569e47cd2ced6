"""Artifacts: a specialized kernel's code as a value that pickles and loads again."""

import dataclasses
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import polyfuse
from polyfuse.errors import ArgumentError
from polyfuse.runtime.artifact import load_kernel, save_kernel
from polyfuse.runtime.cross import CrossExecutable
from polyfuse.targets.cpu import emulated, native_tiles
from polyfuse.targets.target import Target

SOURCE = "def scale(float(N) X) -> (Y) { Y(i) = 2 * X(i) + 1 }"


@pytest.mark.parametrize("target", ["x86", "reference", "aarch64"])
def test_a_saved_kernel_loads_with_its_stages_and_sizes(target, monkeypatch):
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", "")
    x = np.arange(12, dtype=np.float32)
    built = polyfuse.define(SOURCE, target=target).scale.specialize(x)
    artifact = pickle.loads(pickle.dumps(save_kernel(built)))
    assert artifact == save_kernel(built) and hash(artifact) == hash(save_kernel(built))
    loaded = load_kernel(artifact)
    assert (loaded.sizes, loaded.definition, loaded.stages) == (built.sizes, built.definition, built.stages)
    assert loaded.output_shapes == ((12,),)
    if emulated(built.target):   # code for a CPU this machine does not run goes to qemu
        assert isinstance(loaded.run, CrossExecutable) and loaded.run.object == artifact.code
    else:
        np.testing.assert_array_equal(loaded(x), 2 * x + 1)


@pytest.mark.unit
def test_a_kernel_that_forgot_its_definition_is_refused():
    x = np.ones(4, np.float32)
    built = polyfuse.define(SOURCE, target="reference").scale.specialize(x)
    with pytest.raises(ArgumentError, match="does not keep the definition it was built from"):
        save_kernel(dataclasses.replace(built, unbound=None))


TILED = "def d(int32(M, K) A, int32(K, N) B) -> (C) { C(m, n) +=! bfdot2(A(m, k), B(k, n)) }"
LOAD_AND_RUN = """
import pickle, sys
import numpy as np
from polyfuse.runtime.artifact import load_kernel
artifact, a, b = pickle.loads(sys.stdin.buffer.read())
sys.stdout.buffer.write(pickle.dumps(load_kernel(artifact)(a, b)))
"""


@pytest.mark.skipif("bfdot2" not in native_tiles(Target.parse("host")),
                    reason="the host has no AMX-BF16 tiles (or Linux does not grant them)")
def test_a_saved_kernel_on_amx_tiles_runs_in_a_process_that_compiled_nothing():
    """Loading it asks Linux for the tiles (else the first tile instruction is SIGILL)."""
    rng = np.random.default_rng(3)
    a, b = (rng.integers(-2**30, 2**30, s).astype(np.int32) & 0x3FFF3FFF for s in ((40, 32), (32, 48)))
    built = polyfuse.define(TILED, target="host").d.specialize(a, b)
    assert "tile bfdot2(" in built.stages["loops"]
    done = subprocess.run([sys.executable, "-c", LOAD_AND_RUN], input=pickle.dumps((save_kernel(built), a, b)),
                          capture_output=True, env={**os.environ, "POLYFUSE_CACHE_DIR": ""})
    assert done.returncode == 0, done.stderr.decode()
    np.testing.assert_array_equal(pickle.loads(done.stdout), built(a, b))
