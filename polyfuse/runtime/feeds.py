"""What a compiled model is called with, checked before anything runs: feeds (names,
kinds, dtypes, ranks, fixed sizes) and shapes given for its inputs. Errors list the
inputs as the model declares them.

Inputs and outputs of a narrow type (float8, int4, ...) cross the API in their ml_dtypes
dtype; the kernels hold them in their storage type (see :mod:`polyfuse.ir.types`), so
the feed converts them on the way in and :func:`declared_outputs` on the way out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from polyfuse.errors import ArgumentError, DTypeError, ShapeError
from polyfuse.ir.graph import Value
from polyfuse.runtime.device_arrays import as_device_array, is_device_array


def signature(inputs: tuple[Value, ...]) -> str:
    """The inputs as a user passes them: ``'x' float32 (N, 3, 224, 224), ...``."""
    return ", ".join(f"'{v.name}' {v.type.dtype} {v.type.shape}" for v in inputs) or "none"


def shape_arg(name: str, shape: Any, symbolic: bool = False) -> tuple:
    """A shape given for input ``name``: a sequence of sizes (ints >= 0; with
    ``symbolic``, dimension names left unbound too)."""
    ok = (str,) if symbolic else ()
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__") or not all(
            isinstance(d, ok) or isinstance(d, (int, np.integer)) and not isinstance(d, bool)
            and d >= 0 for d in shape):
        raise ShapeError(f"the shape of input '{name}' must be a tuple of sizes (ints >= 0), "
                         f"got {shape!r}")
    return tuple(d if isinstance(d, str) else int(d) for d in shape)


def all_shapes(inputs: tuple[Value, ...], shapes: Mapping[str, Any],
               what: str) -> dict[str, tuple[int, ...]]:
    """``shapes`` checked to give one shape (a tuple of sizes) to every input."""
    if not isinstance(shapes, Mapping):
        raise ArgumentError(f"{what} takes a dict {{name: shape}}, got {type(shapes).__name__}")
    names = [v.name for v in inputs]
    missing = [n for n in names if n not in shapes]
    unknown = sorted(str(n) for n in shapes if n not in names)
    if missing or unknown:
        raise ArgumentError(f"{what} needs the shape of every input and only those: "
                            + (f"missing {missing}; " if missing else "")
                            + (f"unknown {unknown}; " if unknown else "")
                            + f"the inputs are {signature(inputs)}")
    return {n: shape_arg(n, shapes[n]) for n in names}


def check_shapes(inputs: tuple[Value, ...], shapes: Mapping[str, tuple]) -> None:
    """Shapes agree with the declared inputs: names, ranks, fixed dimensions, and one
    size for each symbolic dimension across all inputs."""
    expected = {v.name: v for v in inputs}
    unknown = sorted(set(shapes) - set(expected))
    if unknown:
        raise ShapeError(f"input_shapes names {unknown}, which the model does not have; "
                         f"its inputs are {sorted(expected)}")
    symbols: dict[str, tuple[str, int]] = {}
    for name, shape in shapes.items():
        declared = expected[name].type.shape
        if len(shape) != len(declared):
            raise ShapeError(f"input '{name}' has rank {len(declared)} (shape "
                             f"{list(declared)}), got shape {tuple(shape)}")
        for k, (d, e) in enumerate(zip(declared, shape)):
            if isinstance(d, int) and isinstance(e, int) and d != e:
                raise ShapeError(f"dimension {k} of input '{name}' is {d} in the model, "
                                 f"got {e} (shape {tuple(shape)})")
            if isinstance(d, str) and isinstance(e, int):
                first = symbols.setdefault(d, (name, e))
                if first[1] != e:
                    raise ShapeError(f"dimension '{d}' is {first[1]} in input '{first[0]}' "
                                     f"but {e} in input '{name}'; it must have one size")


def check_feed(inputs: tuple[Value, ...], feed: Any, *, on_gpu: bool
               ) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """``feed`` checked against the model's inputs: a dict naming every input and only
    those, each a C-ordered numpy array (on the GPU also a CUDA array, used in place) of
    the declared dtype and rank with the fixed sizes; the arrays and their shapes."""
    expected = {v.name: v for v in inputs}
    if not isinstance(feed, Mapping):
        raise ArgumentError(f"run takes a dict {{input name: array}}, got {type(feed).__name__}; "
                            f"the inputs are {signature(inputs)} (model(*arrays) takes them "
                            "in that order)")
    unknown = sorted(str(n) for n in feed if n not in expected)
    missing = [n for n in expected if n not in feed]
    if unknown or missing:
        raise ArgumentError("the feed must give every model input and only those: "
                            + (f"unknown: {unknown} " if unknown else "")
                            + (f"missing: {missing} " if missing else "")
                            + f"(the inputs are {signature(inputs)})")
    env: dict[str, Any] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for name, v in expected.items():
        a = feed[name]
        if on_gpu and not isinstance(a, (np.ndarray, np.generic)) and is_device_array(a) \
                and not v.type.dtype.is_narrow:
            view = as_device_array(a)   # torch, CuPy, ...: used in place on the GPU
            assert view is not None
            shape, dtype = view.shape, view.dtype
        elif isinstance(a, (np.ndarray, np.generic)):
            a = np.asarray(a, order="C")  # keeps 0-d arrays 0-d
            shape, dtype = a.shape, a.dtype
        else:
            kinds = "a numpy array or a CUDA array (torch, CuPy)" if on_gpu and not v.type.dtype.is_narrow \
                else "a numpy array"
            raise ArgumentError(f"input '{name}' must be {kinds}, got {type(a).__name__}; pass "
                                f"np.asarray(x, dtype={v.type.dtype.numpy_name}) of shape "
                                f"{v.type.shape}")
        if dtype != v.type.dtype.numpy:
            raise DTypeError(f"input '{name}' must be {v.type.dtype}, got {dtype}; convert it "
                             f"with .astype({v.type.dtype.numpy_name})")
        if len(shape) != v.type.rank or any(isinstance(d, int) and d != e
                                            for d, e in zip(v.type.shape, shape)):
            raise ShapeError(f"input '{name}' must have shape {v.type.shape}, got {tuple(shape)}"
                             f" (names are sizes bound by the call; rank {v.type.rank})")
        env[name] = a.astype(v.type.dtype.storage.numpy) if v.type.dtype.is_narrow else a
        shapes[name] = tuple(int(d) for d in shape)
    return env, shapes


def declared_outputs(outputs: tuple[Value, ...], values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (by output name) with those of a narrow type converted from their
    storage type, whose every value the narrow type holds exactly, to its ml_dtypes dtype."""
    narrow = {v.name: v.type.dtype.numpy for v in outputs if v.type.dtype.is_narrow}
    return {n: np.asarray(a).astype(narrow[n]) if n in narrow else a for n, a in values.items()}


def positional_feed(inputs: tuple[Value, ...], arrays: tuple, named: dict[str, Any]
                    ) -> dict[str, Any]:
    """The feed of ``model(*arrays)`` or ``model(**named)``."""
    if named and arrays:
        raise ArgumentError("pass the inputs either all in order or all by name, not both; "
                            f"the inputs are {signature(inputs)}")
    if not named and len(arrays) != len(inputs):
        raise ArgumentError(f"the model takes {len(inputs)} inputs "
                            f"({', '.join(v.name for v in inputs)}), got {len(arrays)}; they are "
                            f"{signature(inputs)}")
    return named or dict(zip((v.name for v in inputs), arrays))
