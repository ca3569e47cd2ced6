"""Kernels run on the GPU against the reference evaluator (marked cuda; they need an
NVIDIA GPU and its driver and are skipped without one)."""

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.scheduler.options import Fusion, MappingOptions
from tests.cuda.helpers import arguments, kernel, needs_gpu
from tests.onnx.test_models import RTOL, ATOL, assert_matches_onnxruntime, cnn, mlp, transformer_block
from tests.tc_programs import PROGRAMS, PROGRAMS_BY_NAME
from tests.targets.test_x86 import as_tuple, assert_close

pytestmark = pytest.mark.unit

pytestmark = [pytest.mark.cuda, needs_gpu]

OPTIONS = {
    "default": None,
    "odd-tiles-small-blocks-short-grid": MappingOptions(tile_sizes=(3, 5, 2), block=(4, 2), grid=3,
                                                        unroll=2),
    "no-promotion": MappingOptions(fusion=Fusion.PRESERVE, tile_sizes=(2, 8), block=(8,),
                                   use_shared_memory=False, use_private_memory=False),
}


@pytest.mark.parametrize("opt", OPTIONS, ids=list(OPTIONS))
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_canonical_program_on_the_gpu(program, opt):
    args = arguments(program)
    want = as_tuple(kernel(program, "reference")(*args))
    got = as_tuple(kernel(program, options=OPTIONS[opt])(*args))
    for k, (g, w) in enumerate(zip(got, want)):
        assert isinstance(g, np.ndarray)
        assert_close(g, w, f"{program.name} output {k} ({opt})")


def test_a_large_matmul_on_the_gpu():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((1000, 700), dtype=np.float32)
    b = rng.standard_normal((700, 900), dtype=np.float32)
    mod = pf.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
                    target="cuda")
    np.testing.assert_allclose(mod.mm(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


def test_bad_indirect_index_raises_bounds_error():
    mod = pf.define("def emb(float(V, D) E, int32(B) Idx) -> (O) { O(b, d) = E(Idx(b), d) }",
                    target="cuda")
    table = np.arange(8, dtype=np.float32).reshape(4, 2)
    np.testing.assert_array_equal(mod.emb(table, np.array([3, 0], np.int32)), table[[3, 0]])
    with pytest.raises(pf.BoundsError, match="index tensor"):
        mod.emb(table, np.array([0, 4], np.int32))


@pytest.mark.parametrize("build, feeds", [
    (cnn, {"x": np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)}),
    (lambda: mlp(batch="batch"), {"x": np.random.default_rng(0).standard_normal((7, 16)).astype(np.float32)}),
], ids=["cnn", "mlp"])
def test_models_on_the_gpu_match_onnxruntime(build, feeds):
    model = build()
    assert_matches_onnxruntime(model, feeds, RTOL, ATOL, compiled=pf.compile(model, target="cuda"))


def test_transformer_block_on_the_gpu_matches_the_reference():
    model = transformer_block(gelu_op=False)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 16, 32)).astype(np.float32), "mask": np.ones((2, 16), np.int64)}
    want = pf.compile(model, target="reference").run(feeds)
    got = pf.compile(model, target="cuda").run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-3, atol=1e-4)


def test_a_models_graph_replays_on_new_inputs():
    """Runs on host arrays replay the CUDA graph the first captured (or, where the driver
    refuses to capture, launch the kernels again): each run's results are its own."""
    model = cnn()
    compiled, reference = pf.compile(model, target="cuda"), pf.compile(model, target="reference")
    rng = np.random.default_rng(5)
    for _ in range(3):
        x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
        np.testing.assert_allclose(compiled.run({"x": x})["y"], reference.run({"x": x})["y"], rtol=RTOL, atol=ATOL)


def test_tensor_cores_on_the_gpu():
    """TF32 and bfloat16 products on the tensor cores, at sizes no tile divides."""
    import ml_dtypes
    from polyfuse.ir.special_functions import tf32
    rng = np.random.default_rng(2)
    a = rng.standard_normal((300, 200), dtype=np.float32)
    b = rng.standard_normal((200, 170), dtype=np.float32)
    mm = "def mm({t}(M,K) A, {t}(K,N) B) -> (C) {{ C(m,n) +=! A(m,k) * B(k,n) }}"
    got = pf.define(mm.format(t="float"), target="cuda", precision="tf32").mm(a, b)
    np.testing.assert_allclose(got, tf32(a).astype(np.float64) @ tf32(b), rtol=1e-4, atol=1e-3)
    a16, b16 = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
    got = pf.define(mm.format(t="bfloat16"), target="cuda").mm(a16, b16)
    want = (a16.astype(np.float64) @ b16.astype(np.float64)).astype(ml_dtypes.bfloat16)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=5e-2)


@pytest.fixture
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


def test_torch_tensors_in_and_out_without_copies(torch):
    program = PROGRAMS_BY_NAME["matmul"]
    args = arguments(program)
    want = as_tuple(kernel(program, "reference")(*args))
    tensors = [torch.from_numpy(a).cuda() for a in args]
    got = as_tuple(kernel(program)(*tensors))
    for g, w in zip(got, want):
        assert isinstance(g, torch.Tensor) and g.is_cuda
        assert_close(g.cpu().numpy(), w, "matmul from torch tensors")


def test_torch_bfloat16_goes_through_dlpack(torch):
    program = PROGRAMS_BY_NAME["bf16_elementwise"]
    args = arguments(program)
    want = as_tuple(kernel(program, "reference")(*args))
    tensors = [torch.from_numpy(a.view(np.int16)).cuda().view(torch.bfloat16)
               if a.dtype.name == "bfloat16" else torch.from_numpy(np.asarray(a)).cuda() for a in args]
    got = as_tuple(kernel(program)(*tensors))
    for g, w in zip(got, want):
        assert g.dtype == torch.bfloat16 and g.is_cuda
        host = g.view(torch.int16).cpu().numpy().view(w.dtype)
        assert_close(host, w, "bf16 from torch tensors")
