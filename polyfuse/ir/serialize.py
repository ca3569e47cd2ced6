"""Records as JSON values and back, from the fields of their dataclasses alone.

What polyfuse writes to disk and reads in another process (a kernel's layout in the
disk cache or in a saved artifact) is a frozen dataclass. :func:`encode` turns one into
JSON values (objects, lists, strings, numbers) field by field, and :func:`decode` makes
it again from the type hints of the same fields, so a field added to a record is saved
and loaded with no code to update, and cannot be forgotten on one side (a ``Packing``'s
``padded`` flag once was: packed kernels then broke in the next process).

:func:`schema` describes a record's fields and their types, recursively; a reader keeps
it beside the record and trusts the record only where it is the schema of the type it
reads now. Decoding is strict: a missing or unknown field, or a value of the wrong kind,
is a :class:`~polyfuse.errors.RecordError`, never a record with a default filled in.

The types a field may have: ``str``, ``int``, ``float``, ``bool``, ``None``, enums,
nested dataclasses, ``tuple[X, ...]``, fixed tuples ``tuple[X, Y]``, ``list[X]``,
``dict[str, X]`` and ``X | None``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import numbers
import types
import typing
from typing import Any, TypeVar

from polyfuse.errors import RecordError

R = TypeVar("R")


def encode(value: Any) -> Any:
    """``value`` (a dataclass record, or any value its fields hold) as JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return encode(value.value)
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (tuple, list)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise RecordError(f"a record's dict has keys that are not strings: {list(value)[:4]}")
        return {k: encode(v) for k, v in value.items()}
    raise RecordError(f"a record holds a {type(value).__name__}, which polyfuse does not save")


def decode(kind: type[R], data: Any) -> R:
    """The record of type ``kind`` that :func:`encode` turned into ``data``."""
    return _decode(kind, data, kind.__name__)   # type: ignore[no-any-return]


@functools.cache
def schema(kind: Any) -> str:
    """A digest of ``kind``'s fields, their names and types, and those of the records
    they hold: it changes whenever what :func:`encode` writes for ``kind`` changes."""
    return hashlib.sha256(_describe(kind).encode()).hexdigest()[:16]


@functools.cache
def _hints(kind: type) -> tuple[tuple[str, Any], ...]:
    """The init fields of dataclass ``kind`` and their resolved types."""
    hints = typing.get_type_hints(kind)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(kind) if f.init)


def _decode(kind: Any, data: Any, where: str) -> Any:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return data
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) != 1:
            raise RecordError(f"{where}: a field of type {kind} cannot be saved (one type or None)")
        return _decode(options[0], data, where)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        fields = _hints(kind)
        if not isinstance(data, dict) or set(data) != {name for name, _ in fields}:
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise RecordError(f"{where}: a {kind.__name__} has fields {[n for n, _ in fields]}, "
                              f"the saved record {got}")
        return kind(**{name: _decode(hint, data[name], f"{where}.{name}") for name, hint in fields})
    if origin is tuple:
        _expect(data, list, where)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v, f"{where}[{k}]") for k, v in enumerate(data))
        if len(data) != len(args):
            raise RecordError(f"{where}: {len(args)} values expected, {len(data)} saved")
        return tuple(_decode(a, v, f"{where}[{k}]") for k, (a, v) in enumerate(zip(args, data)))
    if origin is list:
        _expect(data, list, where)
        return [_decode(args[0], v, f"{where}[{k}]") for k, v in enumerate(data)]
    if origin is dict:
        _expect(data, dict, where)
        return {str(k): _decode(args[1], v, f"{where}[{k!r}]") for k, v in data.items()}
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind(data)
        except ValueError:
            raise RecordError(f"{where}: {data!r} is no {kind.__name__}") from None
    if kind is bool:
        return _expect(data, bool, where)
    if kind is int:
        if isinstance(data, bool):
            raise RecordError(f"{where}: an int expected, a bool saved")
        return _expect(data, int, where)
    if kind is float:
        if isinstance(data, bool):
            raise RecordError(f"{where}: a float expected, a bool saved")
        return float(_expect(data, (int, float), where))
    if kind is str:
        return _expect(data, str, where)
    if kind is type(None):
        return _expect(data, type(None), where)
    raise RecordError(f"{where}: a field of type {kind} cannot be saved")


def _expect(data: Any, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(data, kind):
        name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise RecordError(f"{where}: a {name} expected, a {type(data).__name__} saved")
    return data


def _describe(kind: Any) -> str:
    """``kind`` as text, with the fields of every record it names spelled out."""
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return f"{kind.__qualname__}({', '.join(f'{n}: {_describe(h)}' for n, h in _hints(kind))})"
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return f"{kind.__qualname__}{{{', '.join(repr(m.value) for m in kind)}}}"
    args = typing.get_args(kind)
    if args:
        origin = typing.get_origin(kind)
        name = "union" if origin in (typing.Union, types.UnionType) else getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join('...' if a is Ellipsis else _describe(a) for a in args)}]"
    return getattr(kind, "__name__", str(kind))
