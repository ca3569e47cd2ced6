"""The default mapping options for the CUDA target, from the kernel's shape.

The heaviest statement's output indices become the thread axes: the last one x (a
row of 32 or 256 threads reading neighbouring elements), the one before it y, and
every earlier one a tile of one element, so it runs on blocks only. A contraction
(a reduction at least ``MIN_DEPTH`` deep: matmul, convolution) gets 32 x 32 output
tiles on 32 x 8 threads (four outputs per thread) and its deepest reduction is tiled
by 32, which bounds the boxes of its operands that shared memory holds. Kernels with
reductions keep each statement in its own loop nest, so a reduction does not hold the
elementwise statements of a fused nest to one thread per row.

A long reduction into few outputs (a row sum, softmax's max and sum, layernorm's
moments: at least ``TREE_MIN_REDUCTION`` steps into at most ``TREE_MAX_OUTPUTS``
elements) would leave the GPU nearly idle with one thread per output, and those threads
would read rows far apart. Such a kernel gets one output element per block, untiled
reductions, ``TREE_BLOCK`` threads along x and ``block_reduction``: the block's threads
share each reduction (neighbours read neighbouring elements) and combine it in a tree.
"""

from __future__ import annotations

import math

from polyfuse.ir.comprehension import Definition
from polyfuse.scheduler.heuristics import MIN_DEPTH
from polyfuse.scheduler.loop_nest import LoopNest
from polyfuse.scheduler.options import Fusion, MappingOptions

TILE_X, TILE_X_ALONE, TILE_Y, TILE_Y_CONTRACTION = 32, 256, 8, 32
REDUCTION_TILE = 32
CONTRACTION_UNROLL = 4
TREE_MIN_REDUCTION = 256
TREE_MAX_OUTPUTS = 8192   # a few outputs per SM of a large GPU
TREE_BLOCK = 256


def default_gpu_options(d: Definition, sizes: dict[str, int]) -> MappingOptions:
    nest = LoopNest.of(d, sizes)
    lhs, red = nest.outputs, nest.reduction_members
    extents = nest.extent_of()
    depth = math.prod(extents[i] for i in red) if red else 0
    if depth >= TREE_MIN_REDUCTION and math.prod(extents[i] for i in lhs) <= TREE_MAX_OUTPUTS:
        return MappingOptions(fusion=Fusion.PRESERVE, tile_sizes=nest.per_member({i: 1 for i in lhs}),
                              parallel=0, block=(TREE_BLOCK,), block_reduction=True)
    contraction = bool(lhs) and depth >= MIN_DEPTH
    tiles = {i: 1 for i in lhs} | {i: 0 for i in red}
    if lhs:
        tiles[lhs[-1]] = TILE_X if len(lhs) > 1 else TILE_X_ALONE
    if len(lhs) > 1:
        tiles[lhs[-2]] = TILE_Y_CONTRACTION if contraction else TILE_Y
    if contraction:
        deepest = max(red, key=lambda i: extents[i])
        if extents[deepest] > REDUCTION_TILE:
            tiles[deepest] = REDUCTION_TILE
    return MappingOptions(
        fusion=Fusion.MIN if nest.reduces else Fusion.MAX, reorder_reductions=contraction,
        tile_sizes=nest.per_member(tiles), parallel=0,
        unroll=CONTRACTION_UNROLL if contraction else 1)
