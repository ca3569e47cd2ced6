"""The cuda target through the rest of polyfuse, without a GPU: a model's kernel stages
(dump), the command line's output folder, and re-specializing for foreign arrays."""

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.cli import main
from polyfuse.runtime.kernel import _call_signature
from tests.onnx.test_models import cnn


def test_a_cuda_model_dumps_its_cuda_c_and_ptx_and_refuses_cpu_stages():
    compiled = pf.compile(cnn(), target="cuda", input_shapes={"x": (1, 3, 32, 32)})
    cuda = compiled.dump("cuda")
    assert cuda.count("__global__") >= 5 and "// g0[Conv_0 Relu_2]" in cuda
    assert compiled.dump("ptx").count(".target sm_90") == cuda.count("// polyfuse kernel")
    with pytest.raises(pf.ArgumentError, match="no stage 'asm'; they have kernels, loops, gpu, cuda"):
        compiled.dump("asm")


def test_cli_compile_for_cuda_writes_the_cubin(tmp_path, capsys):
    tc = tmp_path / "mm.tc"
    tc.write_text("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }\n")
    out = tmp_path / "out"
    assert main(["compile", str(tc), "--target", "cuda", "--input-shapes", "A:[64,32] B:[32,48]",
                 "-o", str(out)]) == 0
    cubin = (out / "mm.cubin").read_bytes()
    assert cubin[:4] == b"\x7fELF" and int.from_bytes(cubin[18:20], "little") == 190  # EM_CUDA
    assert "__global__" in (out / "mm.cuda.txt").read_text()
    assert ".visible .entry mm_" in (out / "mm.ptx.txt").read_text()


class _GpuLike:
    """An array of another library: shape, dtype and device, no numpy behind it."""

    def __init__(self, shape, device="cuda:0"):
        self.shape, self.dtype, self.device = shape, "float32", device


@pytest.mark.unit
def test_arrays_of_other_libraries_key_the_fast_path_by_shape_dtype_and_device():
    a, b, c = _GpuLike((3, 4)), _GpuLike((5, 4)), _GpuLike((3, 4), "cpu")
    assert _call_signature((a,)) != _call_signature((b,))
    assert _call_signature((a,)) != _call_signature((c,))
    assert _call_signature((a,)) == _call_signature((_GpuLike((3, 4)),))
    assert _call_signature((np.ones(2, np.float32), 1.5)) == (((2,), np.dtype(np.float32)), float)
