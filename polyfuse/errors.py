"""Every error polyfuse raises on purpose.

All of them derive from :class:`PolyfuseError`. Errors about a user's TC text carry
the location and print the offending source line with a caret under it; errors
about call arguments name the argument, the size or dtype and both values.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SourceLocation:
    """A 1-based line and column in a source text, and the length to underline."""

    line: int
    col: int
    length: int = 1

    def __str__(self) -> str:
        return f"{self.line}:{self.col}"


class PolyfuseError(Exception):
    """Base class of every error polyfuse raises on purpose."""


class FrontendError(PolyfuseError):
    """An error in user source text; prints ``line:col``, the line and a caret."""

    def __init__(self, message: str, loc: SourceLocation | None = None,
                 source: str | None = None, *, hint: str | None = None,
                 filename: str = "<tc>") -> None:
        self.message = message
        self.loc = loc
        self.source = source
        self.hint = hint
        self.filename = filename
        super().__init__(self._render())

    @property
    def line(self) -> int | None:
        return self.loc.line if self.loc else None

    @property
    def col(self) -> int | None:
        return self.loc.col if self.loc else None

    def with_source(self, source: str, filename: str = "<tc>") -> FrontendError:
        """The same error, rendered against ``source`` (used when raised deep inside)."""
        return type(self)(self.message, self.loc, source, hint=self.hint, filename=filename)

    def _render(self) -> str:
        if self.loc is None:
            head = f"{self.filename}: error: {self.message}"
        else:
            head = f"{self.filename}:{self.loc}: error: {self.message}"
        lines = [head]
        if self.loc is not None and self.source is not None:
            text = self.source.splitlines()
            if 1 <= self.loc.line <= len(text):
                src, col = _window(text[self.loc.line - 1].expandtabs(1), self.loc.col)
                lines.append("    " + src)
                width = max(1, min(self.loc.length, len(src) - col + 1, _WINDOW))
                lines.append("    " + " " * (col - 1) + "^" + "~" * (width - 1))
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return "\n".join(lines)


_WINDOW = 72  # characters of a long source line shown on each side of the caret


def _window(line: str, col: int) -> tuple[str, int]:
    """A long line cut to the part around ``col`` (``...`` where cut), and the column of
    ``col`` in it."""
    if len(line) <= 2 * _WINDOW + 8:
        return line, col
    start = max(0, col - 1 - _WINDOW)
    end = min(len(line), col - 1 + _WINDOW)
    head = "..." if start else ""
    return head + line[start:end] + ("..." if end < len(line) else ""), col - start + len(head)


class TCSyntaxError(FrontendError):
    """The TC text does not parse."""


class GraphSyntaxError(FrontendError):
    """Graph IR or Plan IR text does not parse."""


class WeightError(FrontendError):
    """A constant printed by digest in graph IR text has no data in the weights given,
    or data with another digest."""


class TCSemanticError(FrontendError):
    """The TC text parses but means nothing valid (unknown names, bad types, ...)."""


class RangeInferenceError(TCSemanticError):
    """An index's range cannot be inferred from the accesses; a ``where`` clause is needed."""


class IRVerificationError(PolyfuseError):
    """An IR object breaks an invariant of its level (a compiler bug or a hand-built IR)."""


class ArgumentError(PolyfuseError, TypeError):
    """A kernel was called with the wrong number, names or kinds of arguments."""


class OptionError(PolyfuseError, ValueError):
    """A setting (of tuning, measuring, ...) has a value polyfuse cannot use."""


class RecordError(PolyfuseError, ValueError):
    """A saved record (a disk-cache entry, a kernel artifact) does not hold the fields, or
    the kinds of values, of the record polyfuse reads: it was written by another version
    or damaged. The disk cache rebuilds such an entry."""


class ShapeError(PolyfuseError, ValueError):
    """Ranks or sizes of arguments disagree with the kernel or with each other."""


class DTypeError(PolyfuseError, TypeError):
    """An argument has a dtype the kernel does not accept (no silent casts)."""


class BoundsError(PolyfuseError, IndexError):
    """A tensor read fell outside the tensor at run time (e.g. a bad indirect index)."""

    @staticmethod
    def in_kernel(label: str) -> BoundsError:
        """The error of a kernel whose checked index (one taken from another tensor, or
        one not proven in bounds when it was compiled) fell outside its dimension."""
        return BoundsError(f"kernel '{label}' read a tensor out of bounds: a value of an index "
                           "tensor, or an index that could not be proven in bounds when the kernel "
                           "was compiled, fell outside the dimension it indexes; no output was "
                           "returned")


class AccessRangeError(RangeInferenceError, BoundsError):
    """A statement would read or write outside a tensor for the sizes of a call: found
    before any code runs, with the statement, tensor, dimension and index range."""


class ModelError(PolyfuseError):
    """A model file or object that cannot be read (missing, not ONNX, truncated, invalid)."""


class UnsupportedOpError(PolyfuseError):
    """A model uses ops (or op features) polyfuse cannot compile; lists every one."""


class NeedsValue(UnsupportedOpError):
    """A lowering needs the value of ``value_name`` at compile time; the model runtime
    specializes on it when it is a small graph input."""

    def __init__(self, message: str, value_name: str) -> None:
        super().__init__(message)
        self.value_name = value_name


class SizeLimitError(PolyfuseError, MemoryError):
    """A tensor (or a model's activation arena) would take more memory than polyfuse
    allows; the message names it, its shape and bytes, the limit and how to change it."""


class ScheduleError(PolyfuseError):
    """The scheduler cannot model or schedule a kernel (e.g. a non-affine range bound)."""


class CodegenError(PolyfuseError):
    """A target cannot generate or compile code for a kernel."""


class TargetError(PolyfuseError):
    """An unknown target, or one that cannot compile or run on this machine."""


class DeviceError(TargetError):
    """A GPU cannot be used: no driver or device, or a CUDA call (allocation, copy,
    module load, launch) failed; the message names the call and CUDA's error."""


__all__ = [name for name, obj in list(globals().items())
           if isinstance(obj, type) and issubclass(obj, builtins.BaseException)] + ["SourceLocation"]
