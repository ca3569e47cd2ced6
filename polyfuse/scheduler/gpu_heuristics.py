"""The default mapping options for the CUDA target, from the kernel's shape.

The heaviest statement's output indices become the thread axes: the last one x (a
row of 32 or 256 threads reading neighbouring elements), the one before it y, and
every earlier one a tile of one element, so it runs on blocks only. A contraction
(a reduction at least ``MIN_DEPTH`` deep: matmul, convolution) gets 32 x 32 output
tiles on 32 x 8 threads (four outputs per thread) and its deepest reduction is tiled
by 32, which bounds the boxes of its operands that shared memory holds. Kernels with
reductions keep each statement in its own loop nest, so a reduction does not hold the
elementwise statements of a fused nest to one thread per row.
"""

from __future__ import annotations

import math

from polyfuse.ir.comprehension import Definition
from polyfuse.scheduler.heuristics import MIN_DEPTH, extent, heaviest, single_valued
from polyfuse.scheduler.options import Fusion, MappingOptions

TILE_X, TILE_X_ALONE, TILE_Y, TILE_Y_CONTRACTION = 32, 256, 8, 32
REDUCTION_TILE = 32
CONTRACTION_UNROLL = 4


def default_gpu_options(d: Definition, sizes: dict[str, int]) -> MappingOptions:
    st = heaviest(d, sizes)
    lhs = [i for i in st.indices if not single_valued(st, i)]
    red = [i for i in st.reduction_indices if not single_valued(st, i)]
    extents = {i: extent(st, i, sizes) for i in lhs + red}
    contraction = bool(lhs) and bool(red) and math.prod(extents[i] for i in red) >= MIN_DEPTH
    tiles = {i: 1 for i in lhs} | {i: 0 for i in red}
    if lhs:
        tiles[lhs[-1]] = TILE_X if len(lhs) > 1 else TILE_X_ALONE
    if len(lhs) > 1:
        tiles[lhs[-2]] = TILE_Y_CONTRACTION if contraction else TILE_Y
    if contraction:
        deepest = max(red, key=lambda i: extents[i])
        if extents[deepest] > REDUCTION_TILE:
            tiles[deepest] = REDUCTION_TILE
    reduces = any(s.reduction_indices for s in d.statements)
    return MappingOptions(
        fusion=Fusion.MIN if reduces else Fusion.MAX, reorder_reductions=contraction,
        tile_sizes=tuple(tiles[i] for i in lhs + red), parallel=0,
        unroll=CONTRACTION_UNROLL if contraction else 1)
