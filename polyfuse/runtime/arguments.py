"""Checking call arguments against a definition before anything runs.

Generated code never sees a wrong shape: argument count, kinds, ranks, dtypes (no
silent casts) and size agreement across arguments are all checked here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from polyfuse.errors import ArgumentError, DTypeError, ShapeError
from polyfuse.ir.comprehension import Definition, Literal, ScalarDecl, SizeVar, TensorDecl
from polyfuse.ir.types import DType
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
    sizes: dict[str, int] = {}
    origin: dict[str, str] = {}
    for p, v in zip(d.params, ordered):
        if isinstance(p, ScalarDecl):
            values[p.name] = _scalar(d, p, v)
            continue
        array = _tensor(d, p, v)
        for dim, (expr, extent) in enumerate(zip(p.shape, array.shape)):
            where = f"dimension {dim} of '{p.name}'"
            if isinstance(expr, SizeVar):
                if expr.name in sizes and sizes[expr.name] != extent:
                    raise ShapeError(
                        f"{d.name}: size {expr.name} is {sizes[expr.name]} from {origin[expr.name]} "
                        f"but {extent} from {where} (shape {array.shape})")
                sizes.setdefault(expr.name, int(extent))
                origin.setdefault(expr.name, f"{where} (shape {array.shape})")
            elif isinstance(expr, Literal) and int(expr.value) != extent:
                raise ShapeError(f"{d.name}: {where} must be {expr.value}, got {extent} "
                                 f"(shape {array.shape})")
        values[p.name] = array
    return BoundArguments(values, sizes)


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
                         f"convert it with .astype({_numpy_name(p.dtype)}) if that is intended")
    if array.ndim != p.rank:
        raise ShapeError(f"{d.name}: argument '{p.name}' must have rank {p.rank} "
                         f"({p.dtype}({', '.join(map(str, p.shape))})), got shape {array.shape}")
    return array


def _numpy_name(dt: DType) -> str:
    return "ml_dtypes.bfloat16" if dt is DType.BFLOAT16 else f"np.{dt.numpy.name}"


def _scalar(d: Definition, p: ScalarDecl, v: object) -> object:
    kind = np.asarray(v).dtype.kind if isinstance(v, (np.generic, np.ndarray)) else None
    if isinstance(v, np.ndarray) and v.ndim != 0:
        raise ArgumentError(f"{d.name}: argument '{p.name}' is a scalar {p.dtype}, got an array "
                            f"of shape {v.shape}")
    ok_kinds = "fiub" if p.dtype.is_float else "iub" if p.dtype.is_int else "b"
    py_ok = (float, int) if p.dtype.is_float else int if p.dtype.is_int else bool
    if kind is None and not isinstance(v, py_ok) or kind is not None and kind not in ok_kinds:
        got = np.asarray(v).dtype if kind else type(v).__name__
        raise DTypeError(f"{d.name}: argument '{p.name}' must be a {p.dtype} scalar, got {got}")
    return p.dtype.numpy.type(v)


def abi_scalar(value: object) -> object:
    """A checked scalar as a kernel's 8-byte argument slot holds it: a Python int, float
    or bool, with a uint64 at or above 2**63 as the int64 of the same bits."""
    v = np.asarray(value)
    return (v.view(np.int64) if v.dtype == np.uint64 else v).item()
