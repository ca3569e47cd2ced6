"""Artifacts: a specialized kernel's code as a value that pickles and loads again."""

import dataclasses
import pickle

import numpy as np
import pytest

import polyfuse
from polyfuse.errors import ArgumentError
from polyfuse.runtime.artifact import load_kernel, save_kernel
from polyfuse.runtime.cross import CrossExecutable
from polyfuse.targets.cpu import emulated

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


def test_a_kernel_that_forgot_its_definition_is_refused():
    x = np.ones(4, np.float32)
    built = polyfuse.define(SOURCE, target="reference").scale.specialize(x)
    with pytest.raises(ArgumentError, match="does not keep the definition it was built from"):
        save_kernel(dataclasses.replace(built, unbound=None))
