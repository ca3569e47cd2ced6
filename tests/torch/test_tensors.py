"""Tensors across the torch boundary: bfloat16 and device tensors through the
torch.compile backend and TC operators, against eager PyTorch; CUDA tensors in place on
the cuda target where a GPU is."""

import pytest

torch = pytest.importorskip("torch")

from polyfuse.errors import ArgumentError  # noqa: E402
from polyfuse.targets import Target  # noqa: E402
from polyfuse.targets.cuda_driver import available_device  # noqa: E402
from polyfuse.torch.define import define  # noqa: E402
from polyfuse.torch.tensors import operand, tensor  # noqa: E402

needs_gpu = pytest.mark.skipif(available_device() is None or not torch.cuda.is_available(),
                               reason="needs an NVIDIA GPU (and torch with CUDA)")
SCALE = "def scale(bfloat16(N) A) -> (C) { C(n) = A(n) * bfloat16(3) }"
MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def test_bfloat16_tensors_cross_both_ways():
    x = torch.randn(37).to(torch.bfloat16)
    assert torch.equal(define(SCALE, target="host").scale(x), x * 3)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU()).to(torch.bfloat16).eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="polyfuse")
    x = torch.randn(3, 8).to(torch.bfloat16)
    with torch.no_grad():
        got, want = compiled(x), model(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.unit
def test_results_share_memory_unless_read_only():
    import numpy as np
    a = np.arange(4, dtype=np.float32)
    assert tensor(a).data_ptr() == a.ctypes.data
    a.flags.writeable = False
    t = tensor(a)
    assert t.data_ptr() != a.ctypes.data and torch.equal(t, torch.arange(4.0))


@pytest.mark.unit
def test_a_tensor_on_another_device_is_refused_by_name():
    with pytest.raises(ArgumentError, match=r"input 'x' is on meta; .*'x86' target takes CPU"):
        operand(torch.empty(3, device="meta"), Target.parse("host"), "input 'x'")
    t = torch.randn(2, 3).t()   # not contiguous: a contiguous copy
    torch.testing.assert_close(torch.from_numpy(operand(t, Target.parse("host"), "t")), t)


@pytest.mark.cuda
@needs_gpu
def test_cuda_tensors_in_place_on_the_cuda_target():
    a, b = torch.randn(33, 17, device="cuda"), torch.randn(17, 9, device="cuda")
    c = define(MATMUL, target="cuda").mm(a, b)
    assert c.device.type == "cuda"
    torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).cuda().eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="polyfuse", options={"target": "cuda"})
    x = torch.randn(5, 16, device="cuda")
    with torch.no_grad():
        got = compiled(x)
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)
    assert got.device.type == "cuda"
