"""The default mapping options for the CUDA target, from the kernel's shape.

The heaviest statement's output indices become the thread axes: the last one x (a
row of 32 or 256 threads reading neighbouring elements), the one before it y, and
every earlier one a tile of one element, so it runs on blocks only. A contraction
(a reduction at least ``MIN_DEPTH`` deep: matmul, convolution) with two output indices
or more gets output tiles of up to ``BLOCK_TILE`` x ``BLOCK_TILE`` (halved while the
grid would have fewer than ``MIN_BLOCKS`` blocks, down to ``MIN_TILE``) and fewer threads
than outputs: up to ``THREAD_TILE`` outputs along each axis, a divisor of the tile's
extent that leaves at least ``MIN_THREADS`` threads along it, which each thread keeps in
registers through the whole reduction (a register tile, gpu_registers.py); one output
index gives one row of ``TILE_X_ALONE`` threads. Its deepest reduction is tiled by
``REDUCTION_TILE`` (32), which bounds the boxes of its operands that shared memory holds
(two 128 x 32 float tiles: 35 KiB of the 48); a register-tiled one by
``PIPELINED_REDUCTION_TILE`` (16) with ``STAGES`` (2) buffers per tile, so the copies of
the next step run during this step's products (gpu_pipeline.py) in the same 37 KiB. Kernels with
reductions keep each statement in its own loop nest, so a reduction does not hold the
elementwise statements of a fused nest to one thread per row.

A row reduction (a row sum, softmax's max and sum, layernorm's moments: a reduction of
at least ``ROW_MIN_REDUCTION`` steps over the contiguous end of an input it reads
whole, each element once) would, with one thread per output, read rows far apart.
Such a kernel gets one row per block and ``block_reduction``: the block's threads share
each reduction (neighbours read neighbouring elements) and combine it with warp
shuffles (gpu_reduction.py); a quarter as many threads as the row has elements, a
power of two from ``ROW_MIN_BLOCK`` (one warp) to ``ROW_MAX_BLOCK``, each taking
``ROW_STEPS`` neighbouring elements at a time (``vector_width``: one ``VECTOR_BYTES``
word of float32, half a word of bfloat16, where the row's alignment allows). Its statements run
as one row pipeline (``Fusion.ROWS``): softmax's max, exponentials, sum and quotients of
a row in one launch, one after another. Any other long reduction into few outputs (at
least ``TREE_MIN_REDUCTION`` steps into at most ``TREE_MAX_OUTPUTS`` elements, as a
matrix product of very few outputs) gets the same block-wide reduction, one output per
block, its statements in their own nests.
"""

from __future__ import annotations

import math

from polyfuse.ir.comprehension import Definition, Read, index_names, walk
from polyfuse.scheduler.heuristics import MIN_DEPTH
from polyfuse.scheduler.loop_nest import LoopNest
from polyfuse.scheduler.options import Fusion, MappingOptions

TILE_X, TILE_X_ALONE, TILE_Y, TILE_Y_CONTRACTION = 32, 256, 8, 32
REDUCTION_TILE = 32
PIPELINED_REDUCTION_TILE, STAGES = 16, 2
CONTRACTION_UNROLL = 4
TREE_MIN_REDUCTION = 256
TREE_MAX_OUTPUTS = 8192   # a few outputs per SM of a large GPU
TREE_BLOCK = 256
ROW_MIN_REDUCTION = 64
ROW_MIN_BLOCK, ROW_MAX_BLOCK = 32, 512
ROW_STEPS = 4             # elements of a row per thread, at least
VECTOR_BYTES = 16         # a row's elements a thread reads at a time: one 128-bit word
BLOCK_TILE, MIN_TILE = 128, 32
THREAD_TILE, MIN_THREADS = 8, 8
MIN_BLOCKS = 264          # two blocks per multiprocessor of a 132-SM GPU
MULTIPROCESSORS = MIN_BLOCKS // 2
MAX_SPLIT, MIN_SLICE = 8, 256   # split-k: slices at most, steps of the reduction per slice at least
MAX_BLOCK_THREADS = 1024


def default_gpu_options(d: Definition, sizes: dict[str, int]) -> MappingOptions:
    nest = LoopNest.of(d, sizes)
    lhs, red = nest.outputs, nest.reduction_members
    extents = nest.extent_of()
    depth = math.prod(extents[i] for i in red) if red else 0
    if depth >= ROW_MIN_REDUCTION and _streams_rows(nest):
        threads = min(ROW_MAX_BLOCK, max(ROW_MIN_BLOCK, 1 << ((depth // ROW_STEPS).bit_length() - 1)))
        widest = max(t.dtype.numpy.itemsize for t in d.inputs + d.outputs)
        return MappingOptions(fusion=Fusion.ROWS, tile_sizes=nest.per_member({i: 1 for i in lhs}),
                              parallel=0, block=(threads,), block_reduction=True,
                              vector_width=max(1, min(ROW_STEPS, VECTOR_BYTES // widest)))
    if depth >= TREE_MIN_REDUCTION and math.prod(extents[i] for i in lhs) <= TREE_MAX_OUTPUTS:
        return MappingOptions(fusion=Fusion.PRESERVE, tile_sizes=nest.per_member({i: 1 for i in lhs}),
                              parallel=0, block=(TREE_BLOCK,), block_reduction=True)
    contraction = bool(lhs) and depth >= MIN_DEPTH
    tiles = {i: 1 for i in lhs} | {i: 0 for i in red}
    if lhs:
        tiles[lhs[-1]] = TILE_X if len(lhs) > 1 else TILE_X_ALONE
    if len(lhs) > 1:
        tiles[lhs[-2]] = TILE_Y_CONTRACTION if contraction else TILE_Y
    registers: dict[str, object] = {}
    if contraction and len(lhs) > 1:
        tiles |= _block_tile(lhs, extents)
        spans = [min(tiles[i], extents[i]) for i in (lhs[-1], lhs[-2])]
        micro = tuple(_thread_tile(n) for n in spans)
        block = tuple(n // m for n, m in zip(spans, micro))
        registers = {"block": block} if math.prod(block) <= MAX_BLOCK_THREADS else {}
    if contraction:
        deepest = max(red, key=lambda i: extents[i])
        depth_tile = PIPELINED_REDUCTION_TILE if registers else REDUCTION_TILE
        if extents[deepest] > depth_tile:
            tiles[deepest] = depth_tile
        if registers:
            registers["stages"] = STAGES
            blocks = math.prod(-(-extents[i] // tiles[i]) for i in lhs)
            if len(red) == 1:
                registers["split_k"] = _split(blocks, extents[deepest])
    return MappingOptions(
        fusion=Fusion.MIN if nest.reduces else Fusion.MAX, reorder_reductions=contraction,
        tile_sizes=nest.per_member(tiles), parallel=0,
        unroll=CONTRACTION_UNROLL if contraction else 1, **registers)  # type: ignore[arg-type]


def _streams_rows(nest: LoopNest) -> bool:
    """Whether the nest's statement reduces over the contiguous end of an input it reads
    at every index (each element once: a row reduction, not a contraction)."""
    red = nest.reduction_members
    if not red:
        return False
    members = set(nest.members)
    return any(isinstance(r, Read) and r.indices and members <= index_names(r)
               and red[-1] in index_names(r.indices[-1]) for r in walk(nest.statement.rhs))


def _block_tile(lhs: tuple[str, ...], extents: dict[str, int]) -> dict[str, int]:
    """Tiles of the last two output indices: ``BLOCK_TILE``, or the largest power of two
    within a shorter extent (a span of 37 gets tiles of 32, which micro-tiles divide; a
    span under ``MIN_TILE`` is one tile),
    the one with the longer span halved while the grid has fewer than ``MIN_BLOCKS``
    blocks and halving shortens a span without going under ``MIN_TILE``."""
    tiles = {i: min(BLOCK_TILE, max(MIN_TILE, 1 << (extents[i].bit_length() - 1))) for i in (lhs[-2], lhs[-1])}

    def blocks() -> int:
        return math.prod(-(-extents[i] // tiles.get(i, 1)) for i in lhs)
    while blocks() < MIN_BLOCKS:
        shorter = [i for i in tiles if tiles[i] // 2 >= MIN_TILE and extents[i] > tiles[i] // 2]
        if not shorter:
            break
        longer = max(shorter, key=lambda i: min(tiles[i], extents[i]))
        tiles[longer] //= 2
    return tiles


def _split(blocks: int, depth: int) -> int:
    """Slices of a contraction's reduction (``split_k``) where its output tiles fill no more
    than half of the ``MULTIPROCESSORS``: the most, up to ``MAX_SPLIT``, that divide
    ``depth`` into slices of ``MIN_SLICE`` steps or more and keep the grid within one
    block per multiprocessor; else 1."""
    if 2 * blocks > MULTIPROCESSORS:
        return 1
    return max((p for p in (1 << j for j in range(1, MAX_SPLIT.bit_length()))
                if blocks * p <= MULTIPROCESSORS and depth % p == 0 and depth // p >= MIN_SLICE), default=1)


def _thread_tile(span: int) -> int:
    """Outputs per thread along an axis of ``span`` outputs: the largest divisor of it up
    to ``THREAD_TILE`` that leaves ``MIN_THREADS`` threads (1 for a short span)."""
    return max((d for d in range(1, THREAD_TILE + 1) if span % d == 0 and span // d >= MIN_THREADS), default=1)
