"""Compiled models on the disk (:mod:`polyfuse.runtime.saved_programs`): a later compile
of the same model file runs the programs an earlier one saved, without the front end,
planning or packing, with the outputs onnxruntime gives; a changed file, a damaged
constant, a kernel gone from the cache or a shape not saved is compiled again, never
trusted; a process of its own finds them too."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

import polyfuse as pf
from polyfuse import driver
from polyfuse.runtime import cache, saved_programs
from tests.onnx.ort_compare import onnxruntime_outputs
from tests.onnx.test_models import make_model

RNG = np.random.default_rng(5)
node = helper.make_node


def convnet(seed=0, batch="batch"):
    """A 3x3 convolution, ReLU, flattened into a fully connected layer (its weights
    packed) and a ReLU."""
    rng = np.random.default_rng(seed)
    init = {"W1": (rng.standard_normal((16, 3, 3, 3)) / 5).astype(np.float32),
            "B1": (rng.standard_normal(16) / 10).astype(np.float32),
            "W2": (rng.standard_normal((64, 16 * 8 * 8)) / 32).astype(np.float32),
            "B2": (rng.standard_normal(64) / 10).astype(np.float32)}
    nodes = [node("Conv", ["x", "W1", "B1"], ["c"], pads=[1, 1, 1, 1]), node("Relu", ["c"], ["r"]),
             node("Flatten", ["r"], ["f"]), node("Gemm", ["f", "W2", "B2"], ["g"], transB=1),
             node("Relu", ["g"], ["y"])]
    return make_model(nodes, {"x": (TensorProto.FLOAT, [batch, 3, 8, 8])}, {"y": (TensorProto.FLOAT, [batch, 64])},
                      init)


def feed(batch=1):
    return {"x": RNG.standard_normal((batch, 3, 8, 8)).astype(np.float32)}


def check(model, compiled, batch=1):
    f = feed(batch)
    np.testing.assert_allclose(compiled.run(f)["y"], onnxruntime_outputs(model, f)[0], rtol=1e-4, atol=1e-5)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", str(folder))
    monkeypatch.setattr(saved_programs, "SETTLE", -1.0)   # files written just now are remembered too
    return folder


def saved(path, model=None):
    """``path`` written (``model`` or a new convnet) and compiled, run once."""
    model = model or convnet()
    path.write_bytes(model.SerializeToString())
    compiled = pf.compile(str(path), target="host")
    check(model, compiled)
    return model, compiled


def later(path):
    """A compile of ``path`` as a later process makes it, after this one's saves."""
    saved_programs.flush()
    return pf.compile(str(path), target="host")


def test_a_later_compile_runs_the_saved_program_without_the_front_end(tmp_path, cache_dir, monkeypatch):
    model, first = saved(tmp_path / "m.onnx")
    assert first.plan_counts == {"planned": 1, "templated": 0, "loaded": 0}

    def refused(_):
        raise AssertionError("the front end ran")
    monkeypatch.setattr(driver, "_front_end", refused)
    again = later(tmp_path / "m.onnx")
    assert [v.name for v in again.inputs] == ["x"] and again.inputs == first.inputs
    assert again.outputs == first.outputs
    for _ in range(3):
        check(model, again)
    assert again.plan_counts == {"planned": 0, "templated": 0, "loaded": 1}
    with pytest.raises(pf.ArgumentError, match="missing"):   # the feed still checked against the inputs
        again.run({})


def test_the_plan_of_a_loaded_program_is_planned_again_when_asked_for(tmp_path, cache_dir):
    model, first = saved(tmp_path / "m.onnx")
    again = later(tmp_path / "m.onnx")
    check(model, again)
    assert again.dump("plan") == first.dump("plan")
    assert again.plan_counts["planned"] == 1
    check(model, again)


def test_a_new_shape_after_loaded_programs_plans_them_again_first(tmp_path, cache_dir):
    model, first = saved(tmp_path / "m.onnx")
    for batch in (2, 3, 4):
        check(model, first, batch)
    # batch 1 a kind of its own; 2 and 3 (with probes) make the template 4 comes from
    assert first.plan_counts == {"planned": 3, "templated": 1, "loaded": 0}
    again = later(tmp_path / "m.onnx")
    for batch in (1, 2, 3):
        check(model, again, batch)
    assert again.plan_counts == {"planned": 0, "templated": 0, "loaded": 3}
    check(model, again, 6)   # the three planned again in order: their template serves 6
    assert again.plan_counts == {"planned": 3, "templated": 1, "loaded": 3}
    for batch in (4, 9):
        check(model, again, batch)
    assert again.plan_counts == {"planned": 3, "templated": 3, "loaded": 3}
    third = later(tmp_path / "m.onnx")   # a plan from a template is not saved
    check(model, third, 4)
    assert third.plan_counts["loaded"] == 0


def test_a_changed_file_of_the_same_size_is_compiled_again(tmp_path, cache_dir):
    path = tmp_path / "m.onnx"
    first_model, _ = saved(path)
    other = convnet(seed=1)
    assert len(other.SerializeToString()) == path.stat().st_size
    path.write_bytes(other.SerializeToString())
    again = later(path)
    check(other, again)
    assert again.plan_counts == {"planned": 1, "templated": 0, "loaded": 0}


def test_damaged_constants_and_missing_kernels_are_compiled_again(tmp_path, cache_dir):
    model, _ = saved(tmp_path / "m.onnx")
    saved_programs.flush()
    constants = sorted((cache_dir / "constants").iterdir(), key=lambda p: -p.stat().st_size)
    constants[0].write_bytes(constants[0].read_bytes()[:-4])   # the largest: the packed weights
    saved_programs._LOADED.clear()   # (as a new process would have none)
    again = later(tmp_path / "m.onnx")
    check(model, again)
    assert again.plan_counts == {"planned": 1, "templated": 0, "loaded": 0}

    for entry in cache_dir.glob("*.o"):
        entry.unlink()
    from polyfuse.runtime import cpu
    cpu._COMPILED.clear()
    third = later(tmp_path / "m.onnx")
    check(model, third)
    assert third.plan_counts == {"planned": 1, "templated": 0, "loaded": 0}


def test_a_plan_specialized_to_an_input_s_value_is_found_with_that_value(tmp_path, cache_dir):
    """A Reshape's shape fed at run time: the saved model knows the plan takes its value."""
    model = make_model([node("Reshape", ["x", "shape"], ["r"]), node("MatMul", ["r", "W"], ["y"])],
                       {"x": (TensorProto.FLOAT, [4, 6]), "shape": (TensorProto.INT64, [2])},
                       {"y": (TensorProto.FLOAT, ["a", 5])},
                       {"W": RNG.standard_normal((8, 5)).astype(np.float32)})
    path = tmp_path / "r.onnx"
    path.write_bytes(model.SerializeToString())
    f = {"x": RNG.standard_normal((4, 6)).astype(np.float32), "shape": np.array([3, 8], np.int64)}
    first = pf.compile(str(path), target="host")
    np.testing.assert_allclose(first.run(f)["y"], onnxruntime_outputs(model, f)[0], rtol=1e-5, atol=1e-5)
    again = later(path)
    np.testing.assert_allclose(again.run(f)["y"], onnxruntime_outputs(model, f)[0], rtol=1e-5, atol=1e-5)
    assert again.plan_counts == {"planned": 0, "templated": 0, "loaded": 1}
    g = {**f, "shape": np.array([-1, 8], np.int64)}   # another value: planned
    np.testing.assert_allclose(again.run(g)["y"], onnxruntime_outputs(model, g)[0], rtol=1e-5, atol=1e-5)
    assert again.plan_counts["planned"] >= 1


def test_clearing_the_cache_removes_the_saved_models(tmp_path, cache_dir):
    saved(tmp_path / "m.onnx")
    saved_programs.flush()
    models = list((cache_dir / "models").iterdir())
    constants = list((cache_dir / "constants").iterdir())
    assert len(models) == 3 and constants   # the model, its plan, the file's digest by stat
    assert set(models + constants) <= set(cache.cache_files())
    cache.clear()
    assert not list((cache_dir / "models").iterdir()) and not list((cache_dir / "constants").iterdir())


SECOND_PROCESS = """
import json, sys, time
import numpy as np
import polyfuse as pf
x = np.load(sys.argv[2])
start = time.perf_counter()
model = pf.compile(sys.argv[1], target="host")
y = model.run({"x": x})["y"]
print(json.dumps({"counts": model.plan_counts, "y": y.tolist()}))
"""


def test_a_second_process_runs_the_programs_the_first_saved(tmp_path, cache_dir):
    model = convnet(seed=2)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    os.utime(path, ns=(0, 0))   # (its digest is remembered only for a file not changed just now)
    env = {**os.environ, "POLYFUSE_CACHE_DIR": str(cache_dir)}
    want = onnxruntime_outputs(model, {"x": x})[0]
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", SECOND_PROCESS, str(path), str(tmp_path / "x.npy")],
                              capture_output=True, text=True, env=env, check=True)
        assert done.stderr == ""
        runs.append(json.loads(done.stdout))
        np.testing.assert_allclose(np.array(runs[-1]["y"], np.float32), want, rtol=1e-4, atol=1e-5)
    assert runs[0]["counts"] == {"planned": 1, "templated": 0, "loaded": 0}
    assert runs[1]["counts"] == {"planned": 0, "templated": 0, "loaded": 1}


def test_a_model_with_external_data_is_keyed_by_its_weights_files_too(tmp_path, cache_dir):
    import onnx
    first_model = convnet()
    for folder, model in ((tmp_path / "a", convnet()), (tmp_path / "b", convnet(seed=1))):   # (saving moves
        # the weights out of the model it is given)
        folder.mkdir()
        onnx.save_model(model, str(folder / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="w.bin", size_threshold=0)
    path = tmp_path / "a" / "m.onnx"
    check(first_model, pf.compile(str(path), target="host"))
    again = later(path)
    check(first_model, again)
    assert again.plan_counts == {"planned": 0, "templated": 0, "loaded": 1}
    (tmp_path / "a" / "w.bin").write_bytes((tmp_path / "b" / "w.bin").read_bytes())   # new weights, same .onnx
    third = later(path)
    check(convnet(seed=1), third)
    assert third.plan_counts == {"planned": 1, "templated": 0, "loaded": 0}


def test_saving_waits_for_the_calls_running(tmp_path, cache_dir, monkeypatch):
    """Constants are hashed and written between the model's calls, not beside them."""
    import time
    model = convnet()
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    compiled = pf.compile(str(path), target="host")
    with saved_programs.CALLS:   # a call of another thread, running
        check(model, compiled)   # (its save starts now)
        time.sleep(0.2)
        assert not (cache_dir / "constants").exists() or not list((cache_dir / "constants").iterdir())
    saved_programs.flush()
    assert list((cache_dir / "constants").iterdir())
    check(model, later(path))


def test_compiles_with_other_settings_do_not_share_programs(tmp_path, cache_dir):
    """Input shapes given ahead (the plans a model makes first) and other options key
    the saved programs too: a model compiled at a fixed shape does not load the program a
    model compiled without shapes saved."""
    model, _ = saved(tmp_path / "m.onnx")
    saved_programs.flush()
    fixed = pf.compile(str(tmp_path / "m.onnx"), target="host", input_shapes={"x": (1, 3, 8, 8)})
    check(model, fixed)
    assert fixed.plan_counts == {"planned": 1, "templated": 0, "loaded": 0}
    specialized = pf.compile(str(tmp_path / "m.onnx"), target="host", sizes="specialized")
    check(model, specialized)
    assert specialized.plan_counts == {"planned": 1, "templated": 0, "loaded": 0}
    again = later(tmp_path / "m.onnx")
    check(model, again)
    assert again.plan_counts == {"planned": 0, "templated": 0, "loaded": 1}
