"""Arrays in GPU memory that other libraries own (PyTorch, CuPy, ...), seen without copies.

:func:`as_device_array` reads an object's ``__cuda_array_interface__`` or, failing that
(PyTorch gives bfloat16 no interface, or one typed as raw bytes, ``<V2``), its DLPack
capsule from ``__dlpack__`` (parsed with ctypes; the capsule stays unconsumed, so its
producer still owns the memory). The result is a :class:`DeviceArray`: pointer, shape,
dtype and the object that keeps the memory alive. Kernels for the cuda target take such
arrays in place of numpy arrays and return outputs of the same library (see
:mod:`polyfuse.runtime.cuda`).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import ml_dtypes
import numpy as np

from polyfuse.errors import ArgumentError

_DLPACK_CUDA = (2, 13)   # kDLCUDA, kDLCUDAManaged
_DLPACK_DTYPES = {0: "int", 1: "uint", 2: "float", 6: "bool"}  # code -> numpy kind (4: bfloat)


@dataclass(frozen=True, eq=False)
class DeviceArray:
    """A C-contiguous array in the memory of CUDA device ``device``."""

    pointer: int
    shape: tuple[int, ...]
    dtype: np.dtype
    owner: Any = field(repr=False)   # the array this views (keeps the memory alive)
    library: str = ""                # the top-level module of the owner's type ("torch")
    stream: int | None = None        # where the producer queued work on it, if it said so
    device: int = 0
    keep: Any = field(default=None, repr=False)  # a DLPack capsule, alive as long as the view

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.pointer, False),
                "version": 3, "strides": None, "stream": None}

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise ArgumentError(f"a {self.library or 'CUDA'} array in GPU memory was given where host "
                            "memory is needed (a target other than cuda); copy it to the host "
                            "first, e.g. tensor.cpu().numpy()")


def is_device_array(obj: object) -> bool:
    return isinstance(obj, DeviceArray) or hasattr(obj, "__cuda_array_interface__") or \
        _dlpack_on_cuda(obj)


def as_device_array(obj: object) -> DeviceArray | None:
    """``obj`` as a :class:`DeviceArray` if it lives in CUDA memory, else None."""
    if isinstance(obj, DeviceArray):
        return obj
    library = type(obj).__module__.split(".")[0]
    try:   # any library's array: the interface is an optional attribute, maybe a property that raises
        interface = getattr(obj, "__cuda_array_interface__", None)
    except (TypeError, RuntimeError):
        interface = None
    if interface is not None and np.dtype(interface["typestr"]).kind != "V":
        return _from_interface(obj, interface, library)
    if _dlpack_on_cuda(obj):  # also where the interface names no type (PyTorch's bfloat16)
        return _from_dlpack(obj, library)
    if interface is not None:
        raise ArgumentError(f"a {library} array in GPU memory of type {interface['typestr']!r} "
                            "has no polyfuse dtype, and no DLPack that names one; convert it to "
                            "a numeric type (e.g. float32) first")
    return None


def _from_interface(obj: object, cai: dict[str, Any], library: str) -> DeviceArray:
    shape = tuple(int(d) for d in cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != _contiguous(shape, dtype.itemsize):
        raise ArgumentError(f"a {library} array with strides {tuple(strides)} is not C-contiguous; "
                            "pass a contiguous copy (e.g. tensor.contiguous())")
    stream = cai.get("stream")
    return DeviceArray(int(cai["data"][0]), shape, dtype, obj, library,
                       int(stream) if stream else None)


def _contiguous(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out, step = [], itemsize
    for extent in reversed(shape):
        out.append(step)
        step *= extent
    return tuple(reversed(out))


def _dlpack_on_cuda(obj: object) -> bool:
    device = getattr(obj, "__dlpack_device__", None)
    if device is None or not hasattr(obj, "__dlpack__"):
        return False
    try:
        return int(device()[0]) in _DLPACK_CUDA
    except (TypeError, ValueError, RuntimeError):
        return False


class _DLPackable(Protocol):
    def __dlpack__(self) -> object: ...


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


def _from_dlpack(obj: object, library: str) -> DeviceArray:
    try:
        capsule = cast(_DLPackable, obj).__dlpack__()   # _dlpack_on_cuda(obj) found the method
    except (TypeError, RuntimeError, BufferError) as err:
        raise ArgumentError(f"cannot read the {library} array through DLPack: {err}") from None
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    tensor = _DLTensor.from_address(get(capsule, b"dltensor"))  # DLManagedTensor starts with it
    shape = tuple(int(tensor.shape[k]) for k in range(tensor.ndim))
    code, bits, lanes = tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes
    if lanes != 1 or (code not in _DLPACK_DTYPES and code != 4):
        raise ArgumentError(f"a {library} array of DLPack type code {code}, {bits} bits, "
                            f"{lanes} lanes has no polyfuse dtype")
    dtype = np.dtype(ml_dtypes.bfloat16) if code == 4 else \
        np.dtype(bool) if code == 6 else np.dtype(f"{_DLPACK_DTYPES[code]}{bits}")
    if tensor.strides:
        strides = tuple(int(tensor.strides[k]) for k in range(tensor.ndim))
        expected = _contiguous(shape, 1)
        if any(s != e for s, e, n in zip(strides, expected, shape) if n > 1):
            raise ArgumentError(f"a {library} array with strides {strides} (elements) is not "
                                "C-contiguous; pass a contiguous copy (e.g. tensor.contiguous())")
    pointer = int(tensor.data or 0) + int(tensor.byte_offset)
    return DeviceArray(pointer, shape, dtype, obj, library, device=int(tensor.device.device_id),
                       keep=capsule)
