"""The default mapping options, chosen from the kernel's shape and the target's SIMD width."""

from __future__ import annotations

from polyfuse.ir.comprehension import Definition
from polyfuse.scheduler.options import MappingOptions


def default_options(d: Definition, sizes: dict[str, int], vector_bits: int) -> MappingOptions:
    """Parallel outer loop, SIMD on the innermost loop at the widest register width.

    The vector width counts elements of the narrowest output type (16-bit floats are
    computed in float32, so they count as 32 bits).
    """
    bits = min((max(t.dtype.compute.bits, 32) if t.dtype.is_float else 64) for t in d.outputs)
    return MappingOptions(vector_width=max(1, vector_bits // bits), unroll=4)
