"""Arrays in GPU memory seen without copies: __cuda_array_interface__ and CUDA DLPack
parsed into pointer, shape and dtype (checked here with host memory dressed as CUDA)."""

import ml_dtypes
import numpy as np
import pytest

import polyfuse as pf
from polyfuse.runtime.arguments import bind_arguments
from polyfuse.runtime.device_arrays import DeviceArray, as_device_array

pytestmark = pytest.mark.unit


class FakeCuda:
    """A host array that says it lives on CUDA device 0, by either protocol."""

    def __init__(self, array: np.ndarray, protocol: str, stream=None) -> None:
        self.array = array
        if protocol == "cai":
            self.__cuda_array_interface__ = {
                "shape": array.shape, "typestr": array.dtype.str, "version": 3, "stream": stream,
                "data": (array.ctypes.data, False),
                "strides": None if array.flags.c_contiguous else array.strides}

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA, device 0


@pytest.mark.parametrize("protocol", ["cai", "dlpack"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8, np.bool_])
def test_cuda_arrays_are_read_without_copies(protocol, dtype):
    host = np.arange(24).reshape(2, 3, 4).astype(dtype)
    view = as_device_array(FakeCuda(host, protocol))
    assert isinstance(view, DeviceArray)
    assert view.pointer == host.ctypes.data
    assert view.shape == (2, 3, 4) and view.dtype == np.dtype(dtype) and view.nbytes == host.nbytes
    assert view.owner.array is host


@pytest.mark.parametrize("protocol", ["cai", "dlpack"])
def test_a_strided_cuda_array_is_refused(protocol):
    with pytest.raises(pf.ArgumentError, match="not C-contiguous"):
        as_device_array(FakeCuda(np.ones((4, 6), np.float32).T, protocol))


def test_host_arrays_and_other_objects_are_not_device_arrays():
    assert as_device_array(np.ones(3)) is None  # numpy's DLPack device is the CPU
    assert as_device_array([1.0, 2.0]) is None


class RawBytesInterface:
    """What PyTorch 2.11 gives for a CUDA bfloat16 tensor: an interface typed ``<V2`` (raw
    bytes), and DLPack, which names the type (here from a host tensor)."""

    def __init__(self, tensor, dlpack: bool) -> None:
        self.tensor = tensor
        self.__cuda_array_interface__ = {"shape": tuple(tensor.shape), "typestr": "<V2", "version": 3,
                                         "data": (tensor.data_ptr(), False), "strides": None}
        if dlpack:
            self.__dlpack__ = lambda stream=None: tensor.__dlpack__()
            self.__dlpack_device__ = lambda: (2, 0)


def test_bfloat16_typed_as_raw_bytes_is_read_through_dlpack():
    torch = pytest.importorskip("torch")
    tensor = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    view = as_device_array(RawBytesInterface(tensor, dlpack=True))
    assert view.dtype == np.dtype(ml_dtypes.bfloat16) and view.shape == (2, 3)
    assert view.pointer == tensor.data_ptr()
    with pytest.raises(pf.ArgumentError, match="'<V2' has no polyfuse dtype"):
        as_device_array(RawBytesInterface(tensor, dlpack=False))


def test_a_stream_the_producer_names_is_kept():
    assert as_device_array(FakeCuda(np.ones(2, np.float32), "cai", stream=7)).stream == 7


def test_cuda_arguments_bind_sizes_and_are_refused_by_host_targets():
    mod = pf.define("def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }")
    a, b = FakeCuda(np.ones(5, np.float32), "cai"), FakeCuda(np.ones(5, np.float32), "dlpack")
    bound = bind_arguments(mod.add.definition, [a, b])
    assert bound.sizes == {"N": 5}
    assert all(isinstance(v, DeviceArray) for v in bound.values.values())
    assert bound.signature() == (((5,), "<f4"), ((5,), "<f4"))
    with pytest.raises(pf.DTypeError, match="float32"):
        mod.add(FakeCuda(np.ones(5, np.float64), "cai"), b)
    with pytest.raises(pf.ArgumentError, match="GPU memory"):
        mod.add(a, b)  # the reference target computes on the host
