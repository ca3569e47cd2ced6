"""The CUDA C of every canonical program, run on the CPU by the emulator (tests/cuda/
emulator.py) through the same runtime calls a GPU would get, against the reference
interpreter: the generated text, the launch shapes, argument passing, zeroing, copies."""

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.runtime import cuda as cuda_runtime
from tests.cuda.emulator import CXX, EmulatedDevice
from tests.cuda.test_mapping import OPTIONS
from tests.tc_programs import PROGRAMS
from tests.targets.test_x86 import as_tuple, assert_close

pytestmark = pytest.mark.skipif(CXX is None, reason="the emulator needs a C++20 compiler")


@pytest.fixture
def emulated(monkeypatch):
    sources = {}
    gpu = EmulatedDevice(sources)

    def device():
        sources.update({exe.binary.cubin: exe.binary.stages["cuda"]
                        for exe in cuda_runtime._COMPILED.values()})
        return gpu
    monkeypatch.setattr(cuda_runtime, "device", device)
    return gpu


EMULATED_OPTIONS = {"default": None, **{k: OPTIONS[k] for k in
                                        ("odd-tiles-small-blocks-short-grid", "tiny-shared-budget")}}


@pytest.mark.parametrize("opt", EMULATED_OPTIONS)
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_cuda_c_of_canonical_program_runs_right(program, opt, emulated):
    args = program.make_inputs(np.random.default_rng(0))
    want = as_tuple(getattr(pf.define(program.source), program.entry)(*args))
    kernel = getattr(pf.define(program.source, target="cuda", options=EMULATED_OPTIONS[opt]), program.entry)
    got = as_tuple(kernel(*args))
    assert emulated.launches, "the kernel ran on the emulated device"
    for k, (g, w) in enumerate(zip(got, want)):
        assert isinstance(g, np.ndarray)
        assert_close(g, w, f"{program.name} output {k} ({opt})")


def test_a_bad_index_on_the_device_is_a_bounds_error(emulated):
    mod = pf.define("def gather(float(N) X, int32(M) I) -> (Y) { Y(m) = X(I(m)) }", target="cuda")
    X = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(mod.gather(X, np.array([4, 0, 2], np.int32)), [4, 0, 2])
    with pytest.raises(pf.BoundsError, match="out of bounds"):
        mod.gather(X, np.array([1, 5], np.int32))


@pytest.mark.parametrize("name", ["cnn", "mlp", "transformer_block", "winograd_conv"])
def test_model_on_the_emulated_device_matches_onnxruntime(name, emulated):
    from tests.onnx.ort_compare import assert_matches_onnxruntime
    from tests.onnx.test_models import attention_feeds, cnn, mlp, randn, transformer_block
    from tests.onnx.test_winograd import winograd_model
    model, feed = {"cnn": (cnn, lambda: {"x": randn(1, 3, 32, 32)}),
                   "winograd_conv": (winograd_model, lambda: {"x": randn(1, 32, 11, 14)}),
                   "mlp": (lambda: mlp(batch="batch"), lambda: {"x": randn(5, 16)}),
                   "transformer_block": (lambda: transformer_block(gelu_op=True),
                                         lambda: attention_feeds(2, 8)),
                   }[name]
    assert_matches_onnxruntime(model(), feed(), 1e-3, 1e-4, target="cuda")
    assert len(emulated.launches) >= 2


def test_a_model_runs_as_one_gpu_program(emulated, monkeypatch):
    """Intermediates stay on the device: one upload of the weights for all runs, one per
    input, and downloads only of the outputs and the error slots; copies, constants,
    int64 gathers and float64 come out right; a bad index names its kernel."""
    from tests.onnx.test_models import cnn, randn
    from tests.runtime.test_bundle import odd_outputs
    transfers = {"upload": 0, "download": 0}
    for kind in transfers:
        original = getattr(emulated, kind)

        def counted(*a, kind=kind, original=original):
            transfers[kind] += 1
            return original(*a)
        monkeypatch.setattr(emulated, kind, counted)
    net = cnn()
    compiled = pf.compile(net, target="cuda")
    x = randn(1, 3, 32, 32)
    want = pf.compile(net, target="reference").run({"x": x})["y"]
    for _ in range(2):
        np.testing.assert_allclose(compiled.run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)
    assert transfers == {"upload": 1 + 2, "download": 2 * 2}
    profile = compiled.profile({"x": x}, repeat=1)
    assert [label for label, _ in profile] == compiled.plan_for().program.labels
    assert all(seconds > 0 for _, seconds in profile)

    model = odd_outputs()
    feed = {"x": randn(2, 5), "idx": np.array([3, 0, -1], np.int64), "d": np.arange(4.0)}
    got, ref = pf.compile(model, target="cuda").run(feed), pf.compile(model, target="reference").run(feed)
    assert list(got) == list(ref)
    for name in ref:
        assert got[name].dtype == ref[name].dtype and got[name].shape == ref[name].shape
        np.testing.assert_array_equal(got[name], ref[name])
    with pytest.raises(pf.BoundsError, match="out of bounds"):
        pf.compile(model, target="cuda").run({**feed, "idx": np.array([0, 9, 1], np.int64)})


def test_a_models_kernels_are_captured_once_as_a_graph_and_replayed(emulated):
    """Runs on host arrays replay the graph captured at the first: every kernel runs at
    each call, on the new inputs, and a bad index still names its kernel after a replay."""
    from tests.onnx.test_models import mlp, randn
    from tests.runtime.test_bundle import odd_outputs
    net = mlp()
    compiled, reference = pf.compile(net, target="cuda"), pf.compile(net, target="reference")
    kernels = len(compiled.plan_for({"x": (4, 16)}).program.labels)
    for _ in range(3):
        x = randn(4, 16)   # new values each run
        before = len(emulated.launches)
        np.testing.assert_allclose(compiled.run({"x": x})["y"], reference.run({"x": x})["y"], rtol=1e-4, atol=1e-5)
        assert len(emulated.launches) - before >= kernels
    assert emulated.captures == 1
    model = pf.compile(odd_outputs(), target="cuda")
    feed = {"x": randn(2, 5), "idx": np.array([3, 0, -1], np.int64), "d": np.arange(4.0)}
    model.run(feed)
    with pytest.raises(pf.BoundsError, match="out of bounds"):
        model.run({**feed, "idx": np.array([0, 9, 1], np.int64)})
    got, want = model.run(feed), pf.compile(odd_outputs(), target="reference").run(feed)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    assert emulated.captures == 2


class _OnDevice:
    """An array of another library in (emulated) GPU memory: only __cuda_array_interface__."""

    def __init__(self, host: np.ndarray):
        self.host = np.ascontiguousarray(host)    # the emulated device's memory is host memory
        self.__cuda_array_interface__ = {"shape": self.host.shape, "typestr": self.host.dtype.str,
                                         "data": (self.host.ctypes.data, False), "version": 3,
                                         "strides": None}


def _read(array) -> np.ndarray:
    """The contents of a polyfuse DeviceArray in emulated GPU memory."""
    import ctypes
    host = np.empty(array.shape, array.dtype)
    ctypes.memmove(host.ctypes.data, array.pointer, host.nbytes)
    return host


def test_a_model_takes_arrays_in_gpu_memory_and_returns_them_there(emulated):
    from polyfuse.runtime.device_arrays import DeviceArray
    from tests.onnx.test_models import randn
    from tests.runtime.test_bundle import odd_outputs
    model = odd_outputs()
    feed = {"x": randn(2, 5), "idx": np.array([3, 0, -1], np.int64), "d": np.arange(4.0)}
    want = pf.compile(model, target="reference").run(feed)
    got = pf.compile(model, target="cuda").run({k: _OnDevice(v) for k, v in feed.items()})
    assert list(got) == list(want)
    for name, array in want.items():
        assert isinstance(got[name], DeviceArray) and got[name].shape == array.shape, name
        np.testing.assert_array_equal(_read(got[name]), array, err_msg=name)
    with pytest.raises(pf.ShapeError, match="input 'x' must have shape"):
        pf.compile(model, target="cuda").run({**{k: _OnDevice(v) for k, v in feed.items()},
                                               "x": _OnDevice(randn(3, 5))})
    with pytest.raises(pf.ArgumentError, match="numpy array or a CUDA array"):
        pf.compile(model, target="cuda").run({**feed, "x": [[1.0] * 5] * 2})
    with pytest.raises(pf.ArgumentError, match="must be a numpy array, got _OnDevice"):
        pf.compile(model, target="x86").run({**feed, "x": _OnDevice(feed["x"])})


def test_a_model_with_a_loop_on_data_runs_step_by_step(emulated):
    """A CUDA program is straight-line: a plan with loops and branches runs its kernels
    one by one, the loop driven from Python, with onnxruntime's results."""
    from tests.onnx.ort_compare import onnxruntime_outputs
    from tests.onnx.test_native_control_flow import if_inside_a_loop
    model = if_inside_a_loop()
    compiled = pf.compile(model, target="cuda")
    n = np.zeros(80, np.int64)
    n[0] = 5
    feeds = {"x": np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32) * 4, "n": n}
    np.testing.assert_allclose(compiled.run(feeds)["y"], onnxruntime_outputs(model, feeds)[0], rtol=1e-5,
                               atol=1e-5)
    assert compiled.plan_for().program is None and compiled.plan_for().plan.tail is None
