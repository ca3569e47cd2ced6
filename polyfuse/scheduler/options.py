"""Mapping options: how a kernel is scheduled, after TC's MappingOptions.

One frozen, hashable dataclass; the autotuner searches over it, so every field changes
the generated code. The CPU targets read the fields up to ``num_threads``; the CUDA
target reads ``fusion``, ``tile_sizes``, ``tile_order``, ``point_order``, ``unroll``,
``reorder_reductions``, ``fix_sizes`` and the GPU fields after ``num_threads``.

Every field is checked when options are made: lists become tuples, numpy integers
ints and fusion names :class:`Fusion` members; any other value of the wrong type or
out of range is an :class:`~polyfuse.errors.OptionError` naming the field, the value
and what is allowed. :func:`number` checks the numeric settings of other parts the same way.
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from polyfuse.errors import OptionError

LOOP_FACTOR_MAX = 64       # unroll, unroll-and-jam and vector factors (code size grows with them)
THREADS_MAX = 4096         # the native thread pool's largest size
INT_MAX = 2**31 - 1        # sizes and counts the generated code holds in 32-bit fields


class Fusion(enum.Enum):
    """How eagerly isl fuses statements into shared loops."""

    MAX = "max"                    # isl's default: fuse whatever the dependences allow
    PRESERVE = "preserve_coincident"  # fuse only where outer loops stay parallel
    MIN = "min"                    # every strongly connected component in its own nest
    ROWS = "rows"                  # one nest over the outer indices every statement shares
                                   # and no dependence crosses (a row pipeline such as
                                   # softmax), each statement's own loops inside it


@dataclass(frozen=True, slots=True)
class MappingOptions:
    fusion: Fusion = Fusion.MAX
    intra_tile_fusion: Fusion = Fusion.MAX  # MIN: each statement gets its own point loops
    tile_sizes: tuple[int, ...] = ()   # per member of each outermost band; 0 = do not tile
    tile_order: tuple[int, ...] = ()   # permutation of the tile loops (identity if empty)
    register_tile: tuple[int, ...] = ()  # second-level tiles inside the first (register blocks)
    point_order: tuple[int, ...] = ()  # permutation of the innermost point loops
    unroll_jam: int = 1                # unroll-and-jam factor of the loop around the innermost
    parallel: int = 1                  # outer coincident loops run on the thread pool (0 or 1)
    vector_width: int = 1              # SIMD width of the innermost loop; 1 = scalar (GPU: a
                                       # thread's consecutive iterations along x at a time)
    unroll: int = 1                    # unroll factor of the innermost loop
    reorder_reductions: bool = False   # let the schedule reorder the steps of a reduction
    fix_sizes: bool = False            # schedule with sizes fixed instead of symbolic
    num_threads: int = 0               # 0 = the runtime's default (POLYFUSE_NUM_THREADS / cores)
    block: tuple[int, ...] = ()        # GPU threads per block along x, y, z; () = 32 x 8
    grid: int = 0                      # GPU blocks launched at most (loops stride over the
                                       # rest); 0 = one block per tile
    use_shared_memory: bool = True     # GPU: copy reused tiles of inputs to shared memory
    use_private_memory: bool = True    # GPU: keep accumulators in registers
    shared_memory_bytes: int = 0       # GPU shared memory per block; 0 = the device's
    block_reduction: bool = False      # GPU: reduce over the block's threads along x (a strided
                                       # partial per thread, then warp shuffles)
    stages: int = 1                    # GPU: buffers per shared tile of a reduction loop; 2-4
                                       # copy the next steps' tiles (cp.async) during this one's
    split_k: int = 1                   # GPU: slices of a sum's reduction run by blocks of their
                                       # own, then added in a second launch (split-k)

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _checked(f.name, getattr(self, f.name)))
        for name in ("tile_order", "point_order"):
            order = getattr(self, name)
            if order and sorted(order) != list(range(len(order))):
                raise OptionError(f"MappingOptions: {name} must be a permutation of 0..n-1 "
                                  f"(e.g. (1, 0)), got {order}")
        if len(self.block) > 3 or any(b < 1 for b in self.block) or math.prod(self.block) > 1024:
            raise OptionError(f"MappingOptions: block must be 1 to 3 thread counts >= 1 with a "
                              f"product of at most 1024, got {self.block}")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (enums by value, tuples as lists)."""
        return {k: (v.value if isinstance(v, Fusion) else list(v) if isinstance(v, tuple) else v)
                for k, v in asdict(self).items()}

    @staticmethod
    def from_json(j: dict[str, Any]) -> MappingOptions:
        """The options :meth:`to_json` wrote; unknown keys and bad values raise
        :class:`~polyfuse.errors.OptionError`."""
        if not isinstance(j, dict):
            raise OptionError(f"mapping options must be a JSON object of field: value, "
                              f"got {type(j).__name__}")
        unknown = sorted(set(j) - set(_FIELDS))
        if unknown:
            raise OptionError(f"unknown mapping options {unknown}; known: {', '.join(_FIELDS)}")
        return MappingOptions(**j)


_FIELDS = {f.name: f.default for f in fields(MappingOptions)}


# integer fields (and the elements of tuple fields): lowest, highest, what the ends mean
_RANGES: dict[str, tuple[int, int, str]] = {
    "tile_sizes": (0, INT_MAX, "0: do not tile that loop"),
    "register_tile": (0, INT_MAX, "0: no register tile"),
    "tile_order": (0, 16, "a permutation"), "point_order": (0, 16, "a permutation"),
    "unroll_jam": (1, LOOP_FACTOR_MAX, "1: none"), "unroll": (1, LOOP_FACTOR_MAX, "1: none"),
    "vector_width": (1, LOOP_FACTOR_MAX, "1: scalar"), "parallel": (0, 1, "0: sequential"),
    "num_threads": (0, THREADS_MAX, "0: the runtime's default"),
    "block": (1, 1024, "threads"), "grid": (0, INT_MAX, "0: one block per tile"),
    "shared_memory_bytes": (0, INT_MAX, "0: the device's"),
    "stages": (1, 8, "1: copies not pipelined"),
    "split_k": (1, 64, "1: each block sums the whole reduction"),
}


def _checked(name: str, value: Any) -> Any:
    """``value`` as field ``name`` holds it: lists become tuples, numpy integers ints,
    fusion names the :class:`Fusion` member; anything else of the wrong kind is refused."""
    default = _FIELDS[name]
    if isinstance(default, Fusion):
        return _fusion(name, value)
    if isinstance(default, bool):
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise OptionError(f"MappingOptions: {name} must be True or False, got {value!r}")
    low, high, meaning = _RANGES[name]
    if isinstance(default, tuple):
        if not isinstance(value, (tuple, list)):
            raise OptionError(f"MappingOptions: {name} must be a tuple of integers, e.g. (32, 32), "
                              f"got {value!r}")
        return tuple(number("MappingOptions", f"{name}[{k}]", v, low=low, high=high, meaning=meaning)
                     for k, v in enumerate(value))
    return number("MappingOptions", name, value, low=low, high=high, meaning=meaning)


def number(owner: str, name: str, value: Any, kind: type = int, *, low: float | None = None,
           high: float | None = None, meaning: str = "") -> Any:
    """``value`` of setting ``name`` of ``owner`` as a ``kind`` (int, or float: any real
    number but NaN) within ``[low, high]``, else an :class:`~polyfuse.errors.OptionError`
    that says what is allowed (``meaning``: what the special values mean)."""
    reals = (int, float, np.integer, np.floating) if kind is float else (int, np.integer)
    limits = (f" from {low} to {high}" if high is not None else f" >= {low}") if low is not None else ""
    allowed = f"{'an integer' if kind is int else 'a number'}{limits}" + (f" ({meaning})" if meaning else "")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, reals) or value != value:
        raise OptionError(f"{owner}: {name} must be {allowed}, got {value!r} ({type(value).__name__})")
    if (low is not None and value < low) or (high is not None and value > high):
        raise OptionError(f"{owner}: {name} must be {allowed}, got {value!r}")
    return kind(value)


def _fusion(name: str, value: Any) -> Fusion:
    if isinstance(value, Fusion):
        return value
    if isinstance(value, str):
        for member in Fusion:
            if value.lower() in (member.value, member.name.lower()):
                return member
    allowed = ", ".join(f"'{m.value}'" for m in Fusion)
    raise OptionError(f"MappingOptions: {name} must be a Fusion or one of {allowed}, got {value!r}")


def check_options(options: object, where: str) -> MappingOptions | None:
    """``options`` given to a public entry (``where``, e.g. ``define()``): a
    :class:`MappingOptions` or None, else an :class:`~polyfuse.errors.OptionError`."""
    if options is None or isinstance(options, MappingOptions):
        return options
    hint = " (unpack it: MappingOptions(**options))" if isinstance(options, dict) else ""
    raise OptionError(f"{where}: options= takes a polyfuse.scheduler.options.MappingOptions, e.g. "
                      f"options=MappingOptions(tile_sizes=(32, 32)), or None for the heuristic "
                      f"schedule; got {type(options).__name__}{hint}")
