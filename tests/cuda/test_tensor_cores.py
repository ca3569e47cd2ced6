"""Tensor cores (issue 37 item 3): a register-tiled contraction's products as warp-wide
``mma.sync`` tile products, on TF32 where ``precision="tf32"`` allows it and always on
bfloat16 and float16 operands. Checked warp by warp by the GPU-IR interpreter (TF32
rounding emulated by the ``tf32`` builtin the tile's nest spells), as CUDA C by the
emulator (the fragments exchanged by shuffles), and in the SASS (HMMA), against numpy
at sizes no tile divides."""

import ml_dtypes
import numpy as np
import pytest

import polyfuse as pf
from polyfuse.errors import ArgumentError
from polyfuse.ir.gpu import Threads, verify_gpu_kernel, walk_gpu
from polyfuse.ir.gpu_interpreter import interpret_gpu_kernel
from polyfuse.ir.loops import TileProduct, walk_stmts
from polyfuse.ir.special_functions import tf32
from polyfuse.runtime.arguments import placeholder
from polyfuse.scheduler.gpu_heuristics import default_gpu_options
from polyfuse.scheduler.gpu_mapping import DeviceLimits
from polyfuse.scheduler.pipeline import schedule_gpu_definition
from polyfuse.targets.cuda_sass import nvdisasm
from tests.cuda.emulator import CXX
from tests.cuda.test_emulated import emulated  # noqa: F401  (a fixture)

MM = "def mm({t}(M,K) A, {t}(K,N) B) -> (C) {{ C(m,n) +=! A(m,k) * B(k,n) }}"
TMM = "def tmm({t}(M,K) A, {t}(N,K) B) -> (C) {{ C(m,n) +=! A(m,k) * B(n,k) }}"
# the same product spelled with the widening casts a front end may write
CAST_MM = "def mm(bfloat16(M,K) A, bfloat16(K,N) B) -> (C) { C(m,n) +=! float(A(m,k)) * float(B(k,n)) }"
MLP = """def fc_relu(float(M,K) A, float(N,K) W, float(N) b) -> (C) {
  C(m,n) +=! A(m,k) * W(n,k)
  C(m,n) = fmax(C(m,n) + b(n), 0.0)
}"""


def _dtype(source):
    return ml_dtypes.bfloat16 if "bfloat16" in source else np.float16 if "half" in source else np.float32


def _inputs(shapes, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32).astype(dtype) for s in shapes]


def _schedule(source, shapes, precision):
    d = next(iter(pf.define(source))).definition
    sizes = {}
    for t, shape in zip(d.inputs, shapes):
        sizes |= {s.name: n for s, n in zip(t.shape, shape) if hasattr(s, "name")}
    kernel = schedule_gpu_definition(d, sizes, default_gpu_options(d, sizes), DeviceLimits(), precision=precision)
    return kernel, d


def _products(kernel) -> list[TileProduct]:
    return [s for launch in kernel.launches for s in walk_stmts(launch.body) if isinstance(s, TileProduct)]


def _rounded_oracle(a, b, transposed=False):
    """The product of the operands rounded to TF32, summed in float64."""
    a, b = (tf32(x).astype(np.float64) for x in (a, b))
    return a @ (b.T if transposed else b)


CASES = {   # source, shapes, oracle; sizes no block, warp or depth tile divides
    "tf32 mm 35x20x33": (MM.format(t="float"), [(35, 20), (20, 33)], "tf32", False),
    "tf32 tmm 33x21x34": (TMM.format(t="float"), [(33, 21), (34, 21)], "tf32", True),
    "bf16 mm 37x24x40": (MM.format(t="bfloat16"), [(37, 24), (24, 40)], "ieee", False),
    "f16 mm 34x36x35": (MM.format(t="half"), [(34, 36), (36, 35)], "ieee", False),
}


@pytest.mark.unit
@pytest.mark.parametrize("case", CASES)
def test_a_tile_product_matches_numpy_warp_by_warp(case):
    source, shapes, precision, transposed = CASES[case]
    dtype = _dtype(source)
    kernel, d = _schedule(source, shapes, precision)
    verify_gpu_kernel(kernel)
    (region,) = [s for launch in kernel.launches for s in walk_gpu(launch.body) if isinstance(s, Threads)]
    assert region.warps and kernel.launches[0].block[0] == 32
    assert {p.builtin for p in _products(kernel)} == {"mma_tf32" if dtype is np.float32 else
                                                      "mma_bf16" if dtype is ml_dtypes.bfloat16 else "mma_f16"}
    args = _inputs(shapes, dtype)
    got = interpret_gpu_kernel(kernel, {t.name: a for t, a in zip(d.inputs, args)}, {"C"}, seed=1)["C"]
    want = _rounded_oracle(*args, transposed)   # bfloat16 and float16 are TF32 already
    if dtype is np.float32:
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-5, atol=1e-5)
    else:   # C is of the operands' type: the float32 sums rounded once
        np.testing.assert_allclose(got.astype(np.float64), want.astype(dtype).astype(np.float64), rtol=8e-3, atol=1e-2)
    if dtype is np.float32:   # the rounding is there: exact float32 products differ more
        exact = args[0].astype(np.float64) @ (args[1].T if transposed else args[1]).astype(np.float64)
        assert np.abs(got - exact).max() > 10 * np.abs(got - want).max()


@pytest.mark.unit
def test_float32_products_stay_exact_unless_tf32_is_asked_for():
    kernel, _ = _schedule(MM.format(t="float"), [(256, 256), (256, 256)], "ieee")
    assert not _products(kernel) and "tf32" not in str(kernel)
    kernel, _ = _schedule(MM.format(t="float"), [(256, 256), (256, 256)], "tf32")
    assert _products(kernel)


@pytest.mark.unit
def test_precision_must_be_ieee_or_tf32():
    with pytest.raises(ArgumentError, match="precision must be one of 'ieee', 'tf32'"):
        pf.define(MM.format(t="float"), target="cuda", precision="fp8")


EMULATED = {
    "tf32 mm 40x50x36": (MM.format(t="float"), [(40, 50), (50, 36)], "tf32"),
    "tf32 fc+relu 40x72x56": (MLP, [(40, 72), (56, 72), (56,)], "tf32"),
    "bf16 mm 37x40x70": (MM.format(t="bfloat16"), [(37, 40), (40, 70)], "ieee"),
    "bf16 mm with casts 37x40x70": (CAST_MM, [(37, 40), (40, 70)], "ieee"),
    "f16 mm 33x72x40": (MM.format(t="half"), [(33, 72), (72, 40)], "ieee"),
}


@pytest.mark.skipif(CXX is None, reason="the emulator needs a C++20 compiler")
@pytest.mark.parametrize("case", EMULATED)
def test_a_tile_product_runs_right_as_cuda_c(case, emulated):  # noqa: F811
    source, shapes, precision = EMULATED[case]
    dtype = _dtype(source)
    args = _inputs(shapes, dtype)
    kernel = next(iter(pf.define(source, target="cuda", precision=precision)))
    want = next(iter(pf.define(source.replace("A(m,k) * ", "tf32(A(m,k)) * tf32(").replace(
        "B(k,n) }", "B(k,n)) }").replace("W(n,k)\n", "W(n,k))\n") if precision == "tf32" else source)))(*args)
    got = kernel(*args)
    assert emulated.launches
    cuda = kernel.specialize(*args).stages["cuda"]
    assert "pf_mma_" in cuda and "pf_ldmatrix_x4(" in cuda   # a's k is contiguous: ldmatrix
    assert ("pf_ldmatrix_x2_trans(" in cuda) == (dtype is not np.float32 and "W(n,k)" not in source)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=2e-3, atol=2e-3)


SASS = {
    "tf32 mm 4096^3": (MM.format(t="float"), [(4096, 4096)] * 2, np.float32, "tf32"),
    "bf16 mm 2048^3": (MM.format(t="bfloat16"), [(2048, 2048)] * 2, ml_dtypes.bfloat16, "ieee"),
    "bf16 mm with casts 2048^3": (CAST_MM, [(2048, 2048)] * 2, ml_dtypes.bfloat16, "ieee"),
    "f16 tmm 1024^3": (TMM.format(t="half"), [(1024, 1024)] * 2, np.float16, "ieee"),
}


@pytest.mark.skipif(nvdisasm() is None, reason="needs nvdisasm (pip install nvidia-cuda-nvdisasm)")
@pytest.mark.parametrize("case", SASS)
def test_the_sass_multiplies_on_the_tensor_cores(case):
    source, shapes, dtype, precision = SASS[case]
    kernel = next(iter(pf.define(source, target="cuda", precision=precision)))
    spec = kernel.specialize(*(placeholder(s, dtype) for s in shapes))
    sass = spec.stages["sass"]
    assert "HMMA" in sass and "LDL" not in sass and "STL" not in sass
    if precision == "tf32":
        assert "TF32" in sass.split("HMMA", 1)[1].split("\n", 1)[0]
    ieee = next(iter(pf.define(source, target="cuda"))).specialize(*(placeholder(s, dtype) for s in shapes))
    assert ("HMMA" in ieee.stages["sass"]) == (dtype is not np.float32)


def _linear_model(m=40, k=64, n=48):
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"]),
         helper.make_node("Relu", ["z"], ["out"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [m, n])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, (numpy_helper.to_array(w), numpy_helper.to_array(b))


@pytest.mark.skipif(CXX is None, reason="the emulator needs a C++20 compiler")
def test_a_model_compiled_with_tf32_multiplies_on_the_tensor_cores(emulated):  # noqa: F811
    model, (w, b) = _linear_model()
    x = np.random.default_rng(4).standard_normal((40, 64)).astype(np.float32)
    tf = pf.compile(model, target="cuda", precision="tf32")
    got = tf.run({"x": x})["out"]
    assert "mma_tf32" in tf.dump("gpu")
    want = np.maximum(tf32(x).astype(np.float64) @ tf32(w) + b, 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    exact = pf.compile(model, target="cuda")
    np.testing.assert_allclose(exact.run({"x": x})["out"], np.maximum(x.astype(np.float64) @ w + b, 0),
                               rtol=1e-4, atol=1e-4)
    assert "mma_" not in exact.dump("gpu")


def test_the_torch_backend_follows_torchs_tf32_setting():
    torch = pytest.importorskip("torch")
    from polyfuse.torch.dynamo import matmul_precision
    before = torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32
    try:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.allow_tf32 = False
        assert matmul_precision() == "ieee"
        torch.set_float32_matmul_precision("high")
        assert matmul_precision() == "tf32"
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.allow_tf32 = True
        assert matmul_precision() == "tf32"
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cuda.matmul.allow_tf32 = before[1]


@pytest.mark.skipif(nvdisasm() is None, reason="needs nvdisasm (pip install nvidia-cuda-nvdisasm)")
def test_a_named_gpu_architecture_is_compiled_for():
    shapes = [placeholder((256, 256), np.float32)] * 2
    ampere = next(iter(pf.define(MM.format(t="float"), target="cuda:sm_80", precision="tf32"))).specialize(*shapes)
    assert "cubin sm_80" in ampere.stages["cubin"] and "HMMA" in ampere.stages["sass"]
    turing = next(iter(pf.define(MM.format(t="float"), target="cuda:sm_75", precision="tf32"))).specialize(*shapes)
    assert "cubin sm_75" in turing.stages["cubin"] and "HMMA" not in turing.stages["sass"]   # no TF32 mma
    with pytest.raises(pf.TargetError, match="unknown GPU architecture 'sm_81'"):
        pf.define(MM.format(t="float"), target="cuda:sm_81")


@pytest.mark.unit
def test_tuning_records_are_kept_per_gpu_architecture(tmp_path):
    from polyfuse.autotune import records as db
    from polyfuse.autotune.task import Task
    from polyfuse.scheduler.options import MappingOptions
    from polyfuse.targets.cuda_driver import available_device
    d = next(iter(pf.define(MM.format(t="float")))).definition
    arrays = [np.zeros((64, 64), np.float32)] * 2
    ampere = Task.of(d, arrays, "cuda:sm_80")
    assert str(ampere.target) == "cuda:sm_80"
    here = Task.of(d, arrays, "cuda")    # this machine's GPU's architecture, sm_90 without one
    gpu = available_device()
    assert here.target.cpu == (gpu.limits.arch if gpu is not None else "sm_90")
    tuned = MappingOptions(tile_sizes=(16, 16, 16), block=(8, 8))
    path = tmp_path / "records.jsonl"
    db.append(path, [db.Record.of(ampere, tuned, [1e-3])])
    records = db.Records.open(path)
    assert records.lookup(ampere).options == tuned and records.lookup(ampere).target == ampere.target
    if here.target != ampere.target:   # another architecture's records serve where it has none
        assert records.lookup(here).target == ampere.target


@pytest.mark.skipif(CXX is None, reason="the emulator needs a C++20 compiler")
def test_a_kernel_for_another_gpu_is_refused_before_it_runs(emulated):  # noqa: F811
    a = np.ones((16, 16), np.float32)
    kernel = next(iter(pf.define(MM.format(t="float"), target="cuda:sm_80")))   # the emulated GPU is sm_90
    with pytest.raises(pf.DeviceError, match="compiled for sm_80 .* this GPU is sm_90: compile for target='cuda'"):
        kernel(a, a)
    assert not emulated.launches
