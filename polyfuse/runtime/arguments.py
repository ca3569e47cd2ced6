"""Checking call arguments against a definition before anything runs.

Generated code never sees a wrong shape: argument count, kinds, ranks, dtypes (no
silent casts) and size agreement across arguments are all checked here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from polyfuse.errors import ArgumentError, DTypeError, ShapeError
from polyfuse.ir.comprehension import Definition, ScalarDecl, TensorDecl
from polyfuse.ir.sizes import sizes_of_shapes
from polyfuse.runtime.device_arrays import DeviceArray, as_device_array


@dataclass(frozen=True, slots=True)
class BoundArguments:
    """Arguments by parameter name, and the value of every size they fix."""

    values: dict[str, object]
    sizes: dict[str, int]

    def signature(self) -> tuple:
        """What a specialization depends on: shapes and dtypes."""
        return tuple((np.shape(v), (v.dtype if isinstance(v, DeviceArray) else np.asarray(v).dtype).str)
                     for v in self.values.values())


def placeholder(shape: Sequence[int], dtype: np.dtype | type | str) -> np.ndarray:
    """An array of this shape and dtype holding no memory (one broadcast element), for
    binding sizes and specializing without data."""
    return np.broadcast_to(np.zeros((), dtype), tuple(int(d) for d in shape))


def order_arguments(d: Definition, args: Sequence[object], kwargs: Mapping[str, object]) -> list[object]:
    names = [p.name for p in d.params]
    signature = f"{d.name}({', '.join(names)})"
    if len(args) > len(names):
        raise ArgumentError(f"{signature} takes {len(names)} argument"
                            f"{'s' if len(names) != 1 else ''}, got {len(args) + len(kwargs)}")
    values: dict[str, object] = dict(zip(names, args))
    for key, v in kwargs.items():
        if key not in names:
            raise ArgumentError(f"{signature} has no parameter '{key}'")
        if key in values:
            raise ArgumentError(f"{signature} got two values for '{key}'")
        values[key] = v
    missing = [n for n in names if n not in values]
    if missing:
        raise ArgumentError(f"{signature} is missing argument{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(repr(m) for m in missing)}")
    return [values[n] for n in names]


def bind_arguments(d: Definition, args: Sequence[object],
                   kwargs: Mapping[str, object] | None = None) -> BoundArguments:
    """Check ``args`` against ``d``'s parameters and infer the sizes."""
    ordered = order_arguments(d, args, kwargs or {})
    values: dict[str, object] = {}
    for p, v in zip(d.params, ordered):
        values[p.name] = _scalar(d, p, v) if isinstance(p, ScalarDecl) else _tensor(d, p, v)
    shapes = [None if isinstance(p, ScalarDecl) else tuple(values[p.name].shape) for p in d.params]
    return BoundArguments(values, sizes_of_shapes(d, shapes))


def _tensor(d: Definition, p: TensorDecl, v: object) -> np.ndarray | DeviceArray:
    """``v`` checked as the tensor ``p``: a numpy array, or an array in GPU memory (for
    the cuda target)."""
    device = None if isinstance(v, (np.ndarray, np.generic)) else as_device_array(v)
    if device is not None:
        return _checked(d, p, device)
    if not isinstance(v, (np.ndarray, np.generic)):
        raise ArgumentError(f"{d.name}: argument '{p.name}' must be a numpy array, got "
                            f"{type(v).__name__}; wrap it with np.asarray(..., dtype=np.{p.dtype.numpy.name})")
    return _checked(d, p, np.asarray(v))


def _checked(d: Definition, p: TensorDecl, array: np.ndarray | DeviceArray) -> np.ndarray | DeviceArray:
    if array.dtype != p.dtype.numpy:
        raise DTypeError(f"{d.name}: argument '{p.name}' must be {p.dtype}, got {array.dtype}; "
                         f"convert it with .astype({p.dtype.numpy_name}) if that is intended")
    if array.ndim != p.rank:
        raise ShapeError(f"{d.name}: argument '{p.name}' must have rank {p.rank} "
                         f"({p.dtype}({', '.join(map(str, p.shape))})), got shape {array.shape}")
    return array

def check_scalars(d: Definition, values: dict[str, object]) -> dict[str, object]:
    """``values`` with each scalar parameter's value checked and converted to its dtype:
    what a call whose tensors were checked before (the same kinds of arguments) still
    needs, since a scalar's value can be out of range where the last one was not."""
    for p in d.scalars:
        values[p.name] = _scalar(d, p, values[p.name])
    return values


def _scalar(d: Definition, p: ScalarDecl, v: object) -> object:
    """``v`` as a numpy scalar of ``p``'s dtype: a Python or numpy bool, int or float (or a
    0-d array) of a kind the dtype holds, whose value it holds (no wrapping, no overflow
    to infinity); bools only for bool parameters."""
    what = f"{d.name}: argument '{p.name}'"
    if isinstance(v, np.ndarray) and v.ndim != 0 or not isinstance(v, (np.generic, np.ndarray)) \
            and hasattr(v, "shape") and tuple(getattr(v, "shape")) != ():
        raise ArgumentError(f"{what} is a scalar {p.dtype}, got an array of shape "
                            f"{tuple(getattr(v, 'shape'))}; pass one value, e.g. a Python number")
    if isinstance(v, (np.generic, np.ndarray)):
        kind, got = v.dtype.kind, str(v.dtype)
        v = v.item() if v.dtype.kind in "biuf" else v
    else:
        kind = "b" if isinstance(v, bool) else "i" if isinstance(v, int) else \
            "f" if isinstance(v, float) else None
        got = type(v).__name__
    ok_kinds = "b" if p.dtype.is_bool else "iuf" if p.dtype.is_float else "iu"
    if kind is None or kind not in ok_kinds:
        hint = ("True or False" if p.dtype.is_bool else "a float, e.g. float(x)" if p.dtype.is_float
                else "an int, e.g. int(x)")
        raise DTypeError(f"{what} must be {'an' if str(p.dtype)[0] in 'aeiou' else 'a'} {p.dtype} "
                         f"scalar, got {got}; pass {hint}")
    if p.dtype.is_bool:
        return np.bool_(v)
    if p.dtype.is_int:
        info = np.iinfo(p.dtype.numpy)
        if not info.min <= v <= info.max:
            raise ArgumentError(f"{what} is {_shown(v)}, outside the range of {p.dtype} "
                                f"[{info.min}, {info.max}]; pass a value in range, or declare "
                                "the parameter with a wider type")
        return p.dtype.numpy.type(v)
    try:
        value = float(v)
    except OverflowError:  # an int beyond float64
        value = math.inf
    with np.errstate(over="ignore"):
        converted = p.dtype.numpy.type(value)
    if math.isinf(converted) and (math.isfinite(value) or kind in "iu"):
        limit = float(np.finfo(p.dtype.numpy).max)
        raise ArgumentError(f"{what} is {_shown(v)}, beyond the range of {p.dtype} (±{limit:.6g}): "
                            "it would become infinite; pass a smaller value, or declare the "
                            "parameter with a wider type")
    return converted


def _shown(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    text = str(v)
    return text if len(text) <= 40 else f"an integer of {len(text.lstrip('-'))} digits"


def abi_scalar(value: object) -> object:
    """A checked scalar as a kernel's 8-byte argument slot holds it: a Python int, float
    or bool, with a uint64 at or above 2**63 as the int64 of the same bits."""
    v = np.asarray(value)
    return (v.view(np.int64) if v.dtype == np.uint64 else v).item()
