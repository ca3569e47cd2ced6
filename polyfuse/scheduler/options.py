"""Mapping options: how a kernel is scheduled, after TC's MappingOptions.

One frozen, hashable dataclass; the autotuner searches over it, so every field changes
the generated code. The CPU targets read the fields up to ``num_threads``; the CUDA
target reads ``fusion``, ``tile_sizes``, ``tile_order``, ``point_order``, ``unroll``,
``reorder_reductions``, ``fix_sizes`` and the GPU fields after ``num_threads``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, fields
from typing import Any


class Fusion(enum.Enum):
    """How eagerly isl fuses statements into shared loops."""

    MAX = "max"                    # isl's default: fuse whatever the dependences allow
    PRESERVE = "preserve_coincident"  # fuse only where outer loops stay parallel
    MIN = "min"                    # every strongly connected component in its own nest


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
    vector_width: int = 1              # SIMD width of the innermost loop; 1 = scalar
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
                                       # partial per thread, then a tree in shared memory)

    def __post_init__(self) -> None:
        if any(t < 0 for t in self.tile_sizes + self.register_tile):
            raise ValueError(f"tile sizes must be >= 0, got {self.tile_sizes} {self.register_tile}")
        for order in (self.tile_order, self.point_order):
            if order and sorted(order) != list(range(len(order))):
                raise ValueError(f"loop orders must be permutations, got {order}")
        if min(self.vector_width, self.unroll, self.unroll_jam) < 1 or self.num_threads < 0:
            raise ValueError("vector_width, unroll and unroll_jam must be >= 1, num_threads >= 0")
        if len(self.block) > 3 or any(b < 1 for b in self.block) or math.prod(self.block) > 1024:
            raise ValueError(f"block must be 1 to 3 thread counts >= 1 with a product of at most "
                             f"1024, got {self.block}")
        if self.grid < 0 or self.shared_memory_bytes < 0:
            raise ValueError("grid and shared_memory_bytes must be >= 0")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (enums by value, tuples as lists)."""
        return {k: (v.value if isinstance(v, Fusion) else list(v) if isinstance(v, tuple) else v)
                for k, v in asdict(self).items()}

    @staticmethod
    def from_json(j: dict[str, Any]) -> MappingOptions:
        """The options :meth:`to_json` wrote; unknown keys are refused (ValueError)."""
        known = {f.name: f for f in fields(MappingOptions)}
        unknown = sorted(set(j) - set(known))
        if unknown:
            raise ValueError(f"unknown mapping options {unknown}")
        values: dict[str, Any] = {}
        for k, v in j.items():
            default = getattr(MappingOptions(), k)
            if isinstance(default, Fusion):
                values[k] = Fusion(v)
            elif isinstance(default, tuple):
                values[k] = tuple(int(x) for x in v)
            elif isinstance(default, bool):
                values[k] = bool(v)
            else:
                values[k] = int(v)
        return MappingOptions(**values)
