"""Outputs the caller gives (``kernel(..., out=C)``), checked before anything runs.

TC's in-place form: a kernel writes its results into the caller's arrays, and a
reduction without ``!`` (``C(m,n) += A(m,k) * B(k,n)``) accumulates into their
contents. Each given array must have the output's shape and dtype, be C-contiguous and
writable, and share no memory with an input or another output, so generated code never
sees a wrong buffer. On the cuda target an array in GPU memory may be given too (it is
updated in place, like the numpy arrays on every target).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from polyfuse.errors import ArgumentError, DTypeError, ShapeError
from polyfuse.ir.comprehension import Definition
from polyfuse.runtime.device_arrays import DeviceArray, as_device_array


def given_arrays(d: Definition, out: object) -> tuple[object, ...]:
    """``out`` as one object per output, in declared order (an array alone for a
    definition with one output, else a tuple)."""
    names = [t.name for t in d.outputs]
    if isinstance(out, tuple):
        given = tuple(out)
    elif len(names) == 1:
        given = (out,)
    else:
        raise ArgumentError(f"{d.name}: out= takes a tuple of {len(names)} arrays, one per output "
                            f"({', '.join(names)}), got {type(out).__name__}")
    if len(given) != len(names):
        raise ArgumentError(f"{d.name}: out= got {len(given)} array{'s' if len(given) != 1 else ''} "
                            f"for {len(names)} output{'s' if len(names) != 1 else ''} "
                            f"({', '.join(names)}), in declared order")
    return given


def bind_outputs(d: Definition, shapes: Sequence[tuple[int, ...]], out: object,
                 inputs: Mapping[str, object], *, device: bool) -> dict[str, np.ndarray | DeviceArray]:
    """The arrays of ``out`` by output name, checked against ``shapes``; ``device``: GPU
    arrays are allowed (the cuda target)."""
    checked: dict[str, np.ndarray | DeviceArray] = {}
    for t, shape, value in zip(d.outputs, shapes, given_arrays(d, out)):
        what = f"{d.name}: out= array for output '{t.name}'"
        array = _array(what, value, device)
        if array.dtype != t.dtype.numpy:
            raise DTypeError(f"{what} must be {t.dtype}, got {array.dtype}")
        if tuple(array.shape) != tuple(shape):
            raise ShapeError(f"{what} must have shape {tuple(shape)}, got {tuple(array.shape)}")
        if isinstance(array, np.ndarray):
            if not array.flags.c_contiguous:
                raise ArgumentError(f"{what} is not C-contiguous (strides {array.strides}); "
                                    "give a contiguous array, e.g. np.ascontiguousarray(...)")
            if not array.flags.writeable:
                raise ArgumentError(f"{what} is read-only; give a writable array (e.g. a copy)")
        for name, other in [*inputs.items(), *checked.items()]:
            if _overlap(array, other):
                kind = "output" if name in checked else "input"
                raise ArgumentError(f"{what} shares memory with {kind} '{name}'; kernels read and "
                                    "write buffers that never overlap: give a separate array")
        checked[t.name] = array
    return checked


def _array(what: str, value: object, device: bool) -> np.ndarray | DeviceArray:
    if isinstance(value, np.ndarray):
        return value
    found = as_device_array(value) if not isinstance(value, np.generic) else None
    if found is not None and device:
        interface = getattr(value, "__cuda_array_interface__", None)
        if isinstance(interface, dict) and interface.get("data", (0, False))[1]:
            raise ArgumentError(f"{what} is read-only; give a writable array")
        return found
    where = "a numpy array or an array in GPU memory" if device else "a numpy array"
    raise ArgumentError(f"{what} must be {where}, got {type(value).__name__}")


def _overlap(a: np.ndarray | DeviceArray, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.may_share_memory(a, b)
    if not isinstance(b, DeviceArray) or not a.nbytes or not b.nbytes:
        return False
    return a.pointer < b.pointer + b.nbytes and b.pointer < a.pointer + a.nbytes


def zero(arrays: Sequence[np.ndarray | DeviceArray]) -> None:
    """Zero given outputs whose kernel starts from zeros (a ``+=!`` that covers its
    output compiles without its init: the runtime hands over zeroed memory)."""
    for array in arrays:
        if isinstance(array, np.ndarray):
            array.fill(0)
        else:
            from polyfuse.runtime import cuda  # the driver, only for arrays in GPU memory
            cuda.zero_array(array)
