"""The default mapping options, chosen from the kernel's shape and the machine model
(:mod:`polyfuse.ir.machine`: vectors, registers).

Two kinds of kernels:

* *contractions*, whose heaviest statement is a big reduction (matmul, convolution,
  tensor contractions): each statement gets its own loop nest, the nest is tiled for
  the caches (column panels outermost, then reduction panels, then rows, as BLIS
  orders its loops), then tiled again into register blocks; inside a block the rows of one
  index are unrolled and jammed and another index is vectorized, so the accumulators
  stay in registers (a BLIS-style micro-kernel). The vectorized index is an output
  index that some operand reads contiguously (``n`` of ``B(k, n)`` in a matmul); the
  jammed one is an output index that operand does not use (``m``), so one vector load
  feeds every jammed row. When no operand reads an output index contiguously
  (``X(b, k) * W(n, k)``), the reduction index is vectorized instead (dot products).
  A small reduction takes these options too when the plain ones would vectorize its
  reduction index across an operand's rows (:func:`_gathers`).
* *row sums* (a global pool over a channels-last map): the contiguous output index
  innermost and vectorized, the reduction loops around it (:func:`_reduces_rows`).
* everything else: fused loops, the outer loop parallel, the innermost vectorized.

The choices are made by index name; :class:`~polyfuse.scheduler.loop_nest.LoopNest`
places them on the band members that the options' tuples refer to.
"""

from __future__ import annotations

import math
from collections import Counter

from polyfuse.ir.comprehension import Call, Definition, Read, SizeVar, Statement, index_names, walk
from polyfuse.ir.machine import Machine
from polyfuse.scheduler.loop_nest import LoopNest, work
from polyfuse.scheduler.options import Fusion, MappingOptions

MR = 4                     # jammed rows of a register block (when 6 to 8 do not fit)
FAR_ROWS = 6               # jammed rows far apart in a block of 4 vectors each, where they fit
FAR_ROWS_ANYWAY = 512      # rows past which FAR_ROWS jam even with a partial last block
FAR_ROWS_SOME = 48         # the same for rows that slide no window (a matmul's, a 1x1 conv's)
CACHE_ROWS, CACHE_COLS, CACHE_DEPTH = 64, 256, 128  # cache tile (elements)
PROLOGUE_RATIO = 64        # a statement this much heavier than the others runs alone
MIN_COLS = 64             # the narrowest cache tile of the vector index
PARALLEL_TILES = 2         # column tiles below which the rows go on the threads instead
CONTRACTION_MIN = 1 << 18  # iterations of the heaviest statement before tiling pays off
MIN_DEPTH = 8              # reduction steps per output before register blocking pays off
                           # (a depthwise 3x3 convolution has 9, an RGB 3x3 stem 27;
                           # a dot4 step counts 4: 16 int8 channels make 4 steps of 16)
SPLIT_ROWS = 2             # cache tiles of rows, at most, that a product split over rows alone cuts finer
PACK_MIN_REUSE = 4         # reads of each element of a packed operand copy, at least: else the
                           # copy costs more than it saves (pack_operands copies no less reused operand)
MIN_REUSE_ROWS = 16        # output rows that a transposed operand's packed panel serves, at least
DEEP_BLOCKS = 2            # register blocks across a deep panel whose reduction it cannot hold whole
WHOLE_VECTORS = 2          # full vectors of a block that beat an exact block of half vectors


def element_bits(d: Definition) -> int:
    """Bits of the narrowest output element as computed in registers (16-bit floats in 32)."""
    return min((max(t.dtype.compute.bits, 32) if t.dtype.is_float else 64) for t in d.outputs)



def _operands(st: Statement) -> list[Read]:
    """The statement's reads of tensors other than the one it writes (not scalars)."""
    return [r for r in walk(st.rhs) if isinstance(r, Read) and r.tensor != st.tensor and r.indices]


def _slides(reads: list[Read], outputs: set[str], summed: set[str]) -> bool:
    """Whether a read slides a window: one index moves with both an output index of
    ``outputs`` and a reduction index of ``summed`` (``w + kw``, a pool's ``2 * h + kh``)."""
    return any(index_names(x) & outputs and index_names(x) & summed for r in reads for x in r.indices)


# The boxes below stay constants, not fractions of the machine's L2: measured on an
# AVX-512 machine with a 2 MiB L2 (where they were tuned) and on Zen 3 with 512 KiB, whose
# 32 MiB L3 serves them well; a quarter and three eighths of a 512 KiB L2 gained nothing
# there (benchmarks/LOG.md). A cache model that predicts both is still to come.
SWEPT_BYTES = 512 << 10   # output a reduction panel sweeps, past which panels go deeper
DEEP_BYTES = 512 << 10     # a deep panel's packed box of the vector operand
WHOLE_BYTES = 768 << 10    # a reduction's whole box of the vector operand that stays untiled
                           # (pack_operands' largest box too)


def row_vectors(m: Machine) -> int:
    """Accumulator vectors of a row sum's tile: 8, or half the vector registers where
    there are fewer than 16."""
    return max(1, min(8, m.vector_registers // 2))


def default_options(d: Definition, sizes: dict[str, int], machine: Machine,
                    symbolic: frozenset[str] = frozenset()) -> MappingOptions:
    """The options of ``d`` at ``sizes`` for ``machine`` (:mod:`polyfuse.ir.machine`): its
    vectors and its vector registers (a register block's accumulators and operands fit
    in them). ``symbolic``: the sizes a kernel leaves as parameters (it serves every value
    of them): the loops whose extents they decide are chosen for any extent (a symbolic
    reduction is always tiled, so that full tiles have constant bounds and their panels
    can be packed); the others as for their values in ``sizes``."""
    vector_bits = machine.vector_bits
    width = max(1, vector_bits // element_bits(d))
    nest = LoopNest.of(d, sizes)
    st = nest.statement
    if min(nest.extent_of().values(), default=1) < 1:
        return MappingOptions(vector_width=width, unroll=2)   # an empty range: nothing to tile
    if _reduces_rows(nest):
        return _row_reduction(nest, width, row_vectors(machine))
    contraction = nest.work >= CONTRACTION_MIN and bool(st.reduction_indices) and len(st.indices) >= 2 \
        and _reuses(nest)
    if contraction or nest.work < CONTRACTION_MIN and _gathers(nest):
        tiled = _contraction(nest, _accumulator_width(d, nest, vector_bits, width), element_bits(d) // 8,
                             machine, _unknown_members(nest, symbolic))
        if tiled is not None:
            return tiled
    if symbolic and len(d.statements) > 1 and any(s.reduction_indices for s in d.statements):
        # a row pipeline over symbolic sizes (softmax's max, exponentials, sum and
        # quotients): one nest over the rows, each statement's loop in turn, as isl
        # fuses it for known sizes but not for symbolic ones (a second pass over the
        # exponentials: BERT's softmax at 1 x 256 1.5x the specialized kernel)
        return MappingOptions(fusion=Fusion.ROWS, vector_width=width, unroll=2)
    rest = sum(work(s, sizes) for s in d.statements if s is not st)
    if rest and (nest.work >= PROLOGUE_RATIO * rest or _broadcasts_a_result(d, nest)):
        # small statements feeding a big one (a squeeze-excite gate scaling a whole map,
        # a resize's tables of source indices and weights): fused, their loops would
        # lead the big statement's (isl skews them together) and could put its
        # contiguous index outermost; alone, each keeps its own order
        return MappingOptions(fusion=Fusion.MIN, vector_width=width, unroll=2)
    return MappingOptions(vector_width=width, unroll=2)


def _unknown_members(nest: LoopNest, symbolic: frozenset[str]) -> frozenset[str]:
    """The members of ``nest`` whose extents the ``symbolic`` sizes decide."""
    if not symbolic:
        return frozenset()
    bounds = {r.index: (r.lo, r.hi) for r in nest.statement.ranges}
    return frozenset(i for i in nest.members if i not in bounds or any(
        isinstance(n, SizeVar) and n.name in symbolic for e in bounds[i] for n in walk(e)))


def _reuses(nest: LoopNest) -> bool:
    """Whether an operand of the heaviest statement serves several outputs: it misses an
    output index (``B(k, n)`` of a matmul misses ``m``) or slides a window over one (a
    pool's ``2 * h + kh``), so cache tiles and register blocks reuse its elements.
    Reductions reading every element once (a softmax's maximum and sum over its rows, a
    mean) gain nothing from them: their rows run plainly, each reduced in a register,
    without the tile and block loops (a ViT's 12 x 197 x 197 softmax; benchmarks/LOG.md)."""
    st, lhs, red = nest.statement, set(nest.outputs), set(nest.reduction_members)
    reads = _operands(st)
    return _slides(reads, lhs, red) or any(lhs - set().union(*(index_names(x) for x in r.indices)) for r in reads)


def _accumulator_width(d: Definition, nest: LoopNest, vector_bits: int, width: int) -> int:
    """The vector width of a contraction: ``width``, or the lanes of its accumulator when
    that is a 32-bit integer (an integer product's int32 sums, 16 to a 512-bit register,
    where :func:`element_bits` counts integer outputs as 64 bits)."""
    acc = next((t for t in d.outputs if t.name == nest.statement.tensor), None)
    if acc is not None and acc.dtype.is_int and acc.dtype.bits == 32:
        return max(width, vector_bits // 32)
    return width


def _gathers(nest: LoopNest) -> bool:
    """Whether the plain schedule of a small reduction would vectorize its innermost
    reduction index across an operand's rows (a gather per vector) where an operand
    reads the last output index contiguously: ``H(b, j) * R(j, g)`` of a recurrence's
    step, a small matmul. The register blocks vectorize that output index instead."""
    st, lhs, red = nest.statement, list(nest.outputs), list(nest.reduction_members)
    if len(lhs) < 2 or not red:
        return False
    reads = _operands(st)
    across = any(red[-1] not in index_names(r.indices[-1]) and any(red[-1] in index_names(x) for x in r.indices)
                 for r in reads)
    return across and any(lhs[-1] in index_names(r.indices[-1]) for r in reads)


def _broadcasts_a_result(d: Definition, nest: LoopNest) -> bool:
    """Whether the heaviest statement reads what another statement of ``d`` computes
    across a broadcast (a squeeze-excite gate, one value per channel, scaling a whole
    map): fusing them gains no locality (the producer runs once per many of its
    reads), while its loops would lead the big statement's."""
    st = nest.statement
    produced = {s.tensor for s in d.statements if s is not st}
    return any(isinstance(r, Read) and r.tensor in produced and r.tensor != st.tensor
               and set(nest.members) - set().union(*(index_names(x) for x in r.indices))
               for r in walk(st.rhs))


def _reduces_rows(nest: LoopNest) -> bool:
    """Whether the heaviest statement sums whole rows: every operand that varies along
    the last output index reads it contiguously, with no reduction index there, and no
    read slides a window (a global average pool over a channels-last map, a column sum;
    not a depthwise convolution, whose output rows a register block jams). Operands
    that do not vary along it are broadcast, which only a vector of outputs can take (a
    matrix-vector product, a squeeze-excite gate's 1x1 convolution; with rows to jam it
    is a matrix product). The plain schedule would vectorize its innermost reduction
    index, a gather per vector; the output index goes innermost instead."""
    st, lhs, red = nest.statement, nest.outputs, nest.reduction_members
    if not lhs or not red or not st.indices or lhs[-1] != st.indices[-1]:
        return False
    reads = _operands(st)
    vec, others, summed = lhs[-1], set(lhs[:-1]), set(red)
    along = [r for r in reads if any(vec in index_names(x) for x in r.indices)]
    # a window (o + k) makes neighbouring outputs share reads, which register blocks reuse
    return bool(along) and not _slides(reads, others, summed) and \
        (len(along) == len(reads) or not others) and \
        all(vec in index_names(r.indices[-1]) and not index_names(r.indices[-1]) & summed for r in along)


def _row_reduction(nest: LoopNest, width: int, most_vectors: int) -> MappingOptions:
    """Rows summed into a vector of accumulators (:func:`_reduces_rows`): the output index
    innermost and vectorized, in tiles of whole vectors (several when the other outputs
    leave the threads too few tiles), the reduction loops around it. A tile's
    accumulators stay in registers: at most ``most_vectors`` vectors of them."""
    lhs, red = list(nest.outputs), list(nest.reduction_members)
    vec, extents = lhs[-1], nest.extent_of()
    others = math.prod(extents[i] for i in lhs[:-1])
    extent = extents[vec]
    most = most_vectors * width
    fits = [c for c in range(width, min(extent, most) + 1, width) if extent % c == 0]
    fits = fits + [extent] if extent <= most else fits or [most]
    # the widest tile, of those that give the threads enough tiles if any do
    spread = [c for c in fits if others * -(-extent // c) >= PARALLEL_TILES]
    chunk = max(spread or fits)
    return MappingOptions(fusion=Fusion.MIN, reorder_reductions=True,
                          tile_sizes=nest.per_member({i: 1 for i in lhs[:-1]} | {vec: chunk}),
                          point_order=nest.order(lhs[:-1] + red + [vec]), vector_width=width,
                          unroll=2 if chunk >= 2 * width else 1)


def _contraction(nest: LoopNest, width: int, element_bytes: int, machine: Machine,
                 unknown: frozenset[str] = frozenset()) -> MappingOptions | None:
    """The options of a contraction's register blocks, cache tiles and threads; None where
    the nest is none to tile (too shallow, one output index, or its output not contiguous
    along the vector): the caller's plain loops. ``unknown``: the members whose extent
    may be any (a symbolic kernel's)."""
    vector_registers = machine.vector_registers
    st, lhs, red = nest.statement, list(nest.outputs), list(nest.reduction_members)
    extents = nest.extent_of()
    words = any(isinstance(c, Call) and c.fn == "dot4" for c in walk(st.rhs))
    depth = math.prod(extents[i] for i in red) * (4 if words else 1)
    if len(lhs) < 2 or not red or depth < MIN_DEPTH:
        return None
    reads = _operands(st)
    last = Counter(i for r in reads for i in index_names(r.indices[-1]) if i in lhs)
    tiles = {i: 1 for i in lhs} | {i: 0 for i in red}
    registers: dict[str, int] = {}
    vec = max(last, key=lambda i: (last[i], lhs.index(i))) if last else None
    rows = math.prod(extents[i] for i in lhs[:-1])
    if vec != lhs[-1] and rows >= MIN_REUSE_ROWS and _transposed(reads, lhs[-1]):
        # an operand reads the output's contiguous index, but not contiguously (B(n, k)
        # of A·Bᵀ, W(b, n, k) of a batched one): pack_operands copies its panels
        # transposed, and the register blocks vectorize that index as for B(k, n)
        last, vec = Counter({lhs[-1]: 1}), lhs[-1]
    if vec is not None:
        if vec != lhs[-1]:
            # the output is not contiguous along the vector: its accumulators would be
            # gathered and scattered on every step; plain loops do better (LLVM keeps one
            # accumulator per output element in a register)
            return None
        vec_reads = [r for r in reads if any(vec in index_names(x) for x in r.indices)]
        others = [i for i in lhs if i != vec]
        known = [i for i in others[:-1] if i not in unknown and extents[i] > 1]
        if others[0] in unknown and known:
            # the outermost rows, which the threads share, of an extent the kernel knows
            # (a symbolic batch may be 1: attention's heads instead)
            others.remove(known[0])
            others.insert(0, known[0])
        free = [i for i in others if not any(i in index_names(x) for r in vec_reads for x in r.indices)]
        jam = (free or others)[-1]
        depth = max(red, key=lambda i: extents[i])
        order = red + [i for i in others if i != jam] + [jam, vec]
        # tiles the threads finish together (768 columns in three tiles of 256 keep one
        # thread idle a third of the time, six of 128 do not; 800 in four, the last of 32,
        # end less evenly than seven of 128; benchmarks/LOG.md)
        cols = _balanced_columns(extents[vec], width)
        # or one tile per thread a little wider than a cache tile, in whole 4-vector blocks:
        # each thread then reads the rows once, not once per narrower tile (768 columns: two
        # tiles of 384, not six of 128; the CNNs' channels never split so; benchmarks/LOG.md)
        split = extents[vec] // PARALLEL_TILES
        if extents[vec] % PARALLEL_TILES == 0 and CACHE_COLS < split <= CACHE_COLS * 3 // 2 \
                and split % (4 * width) == 0:
            cols = split
        first = others[0] if len(others) > 1 else None   # the rows outside the jammed ones
        # rows on the threads when the columns make no more tiles than threads and the
        # first row index makes several pairs: each thread then packs all the columns
        # (up to a cache tile) and shares no panel, where packing half of them each would
        # read the whole input twice (a 28x28 map of 128 channels; benchmarks/LOG.md)
        # (not by a symbolic first index, which may be 1: a batch of one left on one thread)
        rows_first = extents[vec] // cols < PARALLEL_TILES or (
            first is not None and first not in unknown and extents[vec] // cols == PARALLEL_TILES
            and extents[first] >= 4 * PARALLEL_TILES)
        if rows_first and extents[vec] <= CACHE_COLS:
            cols = extents[vec]
        # (the rows, others, are lhs[:-1] here: the vector is the output's last index)
        jammed, per_row = _register_block(reads, extents, jam, vec, red, vector_registers, jam in unknown)
        block = per_row * width   # a register block's columns
        if rows <= CACHE_ROWS:
            # few rows (a 7x7 map's 49), all in one cache tile: each packed element of
            # the vector operand serves only those rows, so the kernel streams it from
            # memory. A column tile of one register block makes each thread's stream one
            # sequential pass over its panels, each reused from L1 by every row (ResNet-50's
            # 3x3 convolutions of 7x7 maps; benchmarks/LOG.md).
            # Rows too few for the pass to pack the panels (fewer than PACK_MIN_REUSE register
            # blocks: a matrix-vector product's one) read the operand in place instead,
            # and wider tiles keep those reads along its rows (1 x 4096 x 4096)
            packed = rows >= PACK_MIN_REUSE * jammed
            if extents[vec] % block == 0 and extents[vec] // block >= PARALLEL_TILES and packed:
                cols, rows_first = block, False
        # the output a reduction panel sweeps: every row, a tile of columns; each panel
        # loads and stores it once more, from memory once it outgrows L2 (C of a 2048
        # matmul: 2 MiB per 256 columns), so such panels go deeper
        swept = rows * cols * element_bytes
        # (a whole reduction not much deeper than a panel stays untiled, unless its box
        # would outgrow a deep panel's; below that, one whose box L2 holds whole)
        total = math.prod(extents[i] for i in red)
        if swept > SWEPT_BYTES:
            in_place = all(depth in index_names(r.indices[-1]) for r in reads if r not in vec_reads)
            cols = _deep_columns(cols, extents[vec], total, block, in_place, element_bytes)
            steps = most = DEEP_BYTES // (cols * element_bytes)
        else:
            # a product's whole reduction (no window slides) whose box of the vector operand
            # fits WHOLE_BYTES stays untiled: one pass over the output instead of one per
            # panel (BERT's and ViT-B/16's 768-deep products over 256-column tiles,
            # ResNet-50's 1x1 convolutions). A 3x3 convolution keeps its panels of a few
            # channels, which L1 holds for every row of the window, as it would not hold
            # a whole reduction (4608 steps on ResNet-50's 7x7 maps; benchmarks/LOG.md)
            whole = 0 if _slides(reads, set(lhs), set(red)) else WHOLE_BYTES
            if not rows_first:
                cols = _whole_columns(cols, extents[vec], total * element_bytes, block, whole)
            steps, most = CACHE_DEPTH, max(2 * CACHE_DEPTH, whole // (cols * element_bytes))
        if vec in unknown:   # (any number of columns: whole register blocks, enough tiles to share out evenly; benchmarks/LOG.md)
            cols = min(-(-cols // block) * block, max(block, CACHE_COLS // PARALLEL_TILES // block * block))
        tiles |= {jam: CACHE_ROWS, vec: cols, depth: _depth_tile(extents, red, depth, steps, most, depth in unknown)}
        if rows_first and first is None and extents[jam] <= SPLIT_ROWS * CACHE_ROWS:
            # the threads' rows are the jammed index's alone (a matmul's, its columns too few
            # for tiles): whole register blocks of them, in a tile per thread
            # (50 x 2000 x 50 ran on one thread in one tile of 64 rows)
            tiles[jam] = min(CACHE_ROWS, max(jammed, -(-extents[jam] // (PARALLEL_TILES * jammed)) * jammed))
        # BLIS's loop order: column panels (on the threads), then reduction panels, then
        # rows, so a packed panel of the vector operand serves every row of the output;
        # with rows on the threads the first row index goes first instead
        tile_order = [vec] + red + others
        if rows_first:
            tile_order = others[:1] + [vec] + red + others[1:]
            if first is not None:   # a few of its rows per tile, in an even number of tiles
                tiles[first] = divisor_at_most(extents[first], 2 * CACHE_ROWS // max(1, extents[jam]),
                                                PARALLEL_TILES)
                registers[first] = 1
                if jam in unknown and any(first in index_names(x) for r in vec_reads for x in r.indices):
                    # (rows of any number, and a panel of the vector operand per row of
                    # ``first`` (attention's heads): a tile of several would pack each
                    # panel again for every tile of rows: P.V at 1 x 256 1.4x specialized)
                    tiles[first] = 1
        outer = [i for i in others if i != jam and tile_order[0] != i]
        if outer:
            # a tile holds several rows of the index outside the jammed one (a few rows
            # of a 7 or 14 wide map), so a panel serves about CACHE_ROWS rows; each
            # row is its own register block, outside the reduction
            tiles[outer[-1]] = divisor_at_most(extents[outer[-1]],
                                                2 * CACHE_ROWS // max(1, extents[jam]))
            registers[outer[-1]] = 1
    else:  # dot products: vectorize the reduction, jam an output index
        vec, jam, depth = red[-1], lhs[-1], red[-1]
        order, tile_order = lhs + red, []
        tiles |= {lhs[-2]: CACHE_ROWS, jam: CACHE_ROWS, vec: CACHE_COLS}
    for i in unknown - {jam, vec} - set(red):
        # (a symbolic row index outside the blocks: one row per tile, no partial tile to
        # split off and compile twice)
        tiles[i] = min(tiles[i], 1)
    cols = tiles[vec] if vec in unknown and tiles[vec] else min(extents[vec], tiles[vec] or extents[vec])
    mr, vectors = _register_block(reads, extents, jam, vec, red, vector_registers, jam in unknown)
    if tiles[jam] and (tiles[jam] < extents[jam] or jam in unknown):
        tiles[jam] = tiles[jam] // mr * mr   # whole register blocks in a cache tile
    # (a partial last block only where the rows make the pass pack its panel)
    nr, vw = _vector_block(cols, width, vectors if last else 4, rows >= CACHE_ROWS)
    registers |= {jam: mr, vec: nr if last else 0}
    return MappingOptions(
        fusion=Fusion.MIN, reorder_reductions=True, tile_sizes=nest.per_member(tiles),
        register_tile=nest.per_member(registers), point_order=nest.order(order), vector_width=vw,
        tile_order=nest.order(tile_order),
        unroll=max(1, nr // vw) if last else 2, unroll_jam=mr)


def _balanced_columns(columns: int, width: int) -> int:
    """The widest column tile, :data:`CACHE_COLS` halved down to :data:`MIN_COLS`, whose
    tiles over ``columns`` the threads finish soonest, each taking the next chunk of
    them as it frees (the thread pool's dynamic schedule), the last, partial tile
    counted in whole vectors of ``width``; where none makes at least
    :data:`PARALLEL_TILES` whole tiles, :data:`MIN_COLS`."""
    best, pick, cols = 0, MIN_COLS, CACHE_COLS
    while cols >= MIN_COLS:
        if columns // cols >= PARALLEL_TILES:
            span = _makespan(columns, cols, width)
            if not best or span < best:
                best, pick = span, cols
        cols //= 2
    return pick


def _makespan(columns: int, cols: int, width: int) -> int:
    """The columns the busiest thread computes when tiles of ``cols`` (the last one
    partial, in whole vectors of ``width``) go to :data:`PARALLEL_TILES` threads in the
    thread pool's chunks (at most 4 per thread, contiguous), each thread claiming the
    next chunk as it frees."""
    tiles = [cols] * (columns // cols) + ([-(-(columns % cols) // width) * width] if columns % cols else [])
    chunks = min(len(tiles), 4 * PARALLEL_TILES)
    base, extra = divmod(len(tiles), chunks)
    busy = [0] * PARALLEL_TILES
    start = 0
    for c in range(chunks):
        size = base + (c < extra)
        busy[busy.index(min(busy))] += sum(tiles[start:start + size])
        start += size
    return max(busy)


def _deep_columns(cols: int, columns: int, total: int, block: int, in_place: bool,
                  element_bytes: int) -> int:
    """The column tile of a deep panel (a box of :data:`DEEP_BYTES` of the vector operand)
    over ``columns`` columns and a reduction of ``total`` steps, register blocks of
    ``block`` columns; ``cols`` where the panel holds the whole reduction."""
    if DEEP_BYTES // (cols * element_bytes) >= total:
        return cols
    if in_place:
        # the broadcast operand read in place along its rows (A(m, k), not packed):
        # narrower columns for deeper panels, so each output is loaded and stored fewer
        # times and each row's scalars serve more steps. Two register blocks wide, or one
        # where that holds the whole reduction (one block where it does not gained nothing
        # on a 1024 SGEMM). A packed broadcast operand (A(k, m) of Aᵀ·B) would grow with
        # the depth, and ran slower so (benchmarks/LOG.md)
        narrow = next((b * block for b in range(DEEP_BLOCKS, 0, -1)
                       if DEEP_BYTES // (b * block * element_bytes) >= total), DEEP_BLOCKS * block)
        return narrow if cols > narrow and columns % narrow == 0 else cols
    # the broadcast operand packed (A(k, m) of Aᵀ·B): each copy of its rows serves one
    # column tile, so wider tiles of shallower panels copy it fewer times (Aᵀ·B 1024 and
    # 2048; benchmarks/LOG.md)
    tiles = columns // (2 * cols)
    whole = columns % (2 * cols) == 0 and tiles >= PARALLEL_TILES and tiles % PARALLEL_TILES == 0
    return 2 * cols if whole else cols


def _whole_columns(cols: int, columns: int, column_bytes: int, block: int, whole: int) -> int:
    """Half of ``cols`` (of ``columns``; register blocks of ``block`` columns) where that
    makes the whole reduction's box, ``column_bytes`` per column, fit ``whole`` bytes and
    leaves two register blocks (256 x 1024 x 1024 with Wᵀ and its GELU layer;
    benchmarks/LOG.md); else ``cols``."""
    half = cols // 2
    fits = cols * column_bytes > whole >= half * column_bytes
    return half if fits and half >= 2 * block and columns % half == 0 else cols


def _register_block(reads: list[Read], extents: dict[str, int], jam: str, vec: str,
                    red: list[str], vector_registers: int, any_extent: bool = False) -> tuple[int, int]:
    """The jammed rows of a register block and its vectors per row (:func:`_register_rows`;
    ``any_extent``: the jammed index's extent is symbolic), as many as the vector
    registers hold (:func:`_fit_registers`)."""
    # the jammed rows' scalars: neighbours in memory (a convolution's window) or rows
    # far apart (a matmul's A(m, k), one cache line and TLB entry per row)?
    near = any(jam in index_names(r.indices[-1]) for r in reads if vec not in index_names(r.indices[-1]))
    # does the jammed index slide a window (w + kw of a convolution)?
    return _fit_registers(*_register_rows(extents[jam], near, _slides(reads, {jam}, set(red)), any_extent),
                          vector_registers)


def _fit_registers(rows: int, vectors: int, registers: int) -> tuple[int, int]:
    """``rows`` x ``vectors`` accumulators, with the row's ``vectors`` of the vector
    operand and one broadcast scalar beside them, in ``registers`` vector registers:
    fewer vectors per row, then fewer rows, where they would not fit. What does not fit
    spills every reduction step (AVX2's 16 registers: a 6 x 4 block's 24 accumulators ran
    a 1024 matmul at 68 GFLOP/s on two Zen 3 cores, its 6 x 2 block at 161)."""
    while vectors > 1 and rows * vectors + vectors + 1 > registers:
        vectors -= 1
    while rows > 1 and rows * vectors + vectors + 1 > registers:
        rows -= 1
    return rows, vectors


def _transposed(reads: list[Read], vec: str) -> bool:
    """Whether the operands that read output index ``vec`` read it in one index each, an
    index other than their last (so a copy transposes their panels), plainly (``n``, not
    a window ``n + k``)."""
    uses = [[index_names(x) for x in r.indices if vec in index_names(x)] for r in reads]
    along = [(u, r) for u, r in zip(uses, reads) if u]
    return bool(along) and all(u == [{vec}] and vec not in index_names(r.indices[-1]) for u, r in along)


def _depth_tile(extents: dict[str, int], red: list[str], depth: str, steps: int, most: int,
                symbolic: bool = False) -> int:
    """The tile of the reduction index ``depth``: about ``steps`` reduction steps with the
    other reduction indices untiled (a 3x3 convolution's window), a power of two; 0
    (untiled) when the whole reduction takes at most ``most`` steps (a 7x7 stem over 3
    channels), or for a ``symbolic`` kernel (whose depth may be any: a tile keeps the
    bounds of its loops constant, or bounded by the tile) a tile of about ``most`` steps."""
    rest = math.prod(extents[i] for i in red if i != depth)
    if rest * extents[depth] <= most:
        return 1 << (max(1, most // rest).bit_length() - 1) if symbolic else 0
    return 1 << (max(1, steps // rest).bit_length() - 1)


def divisor_at_most(extent: int, most: int, parts: int = 1) -> int:
    """The largest divisor of ``extent`` no larger than ``most`` that cuts it into a
    multiple of ``parts`` tiles (at least 1)."""
    fits = [d for d in range(1, max(1, min(extent, most)) + 1)
            if extent % d == 0 and (extent // d) % parts == 0]
    return max(fits, default=1)


def _register_rows(extent: int, near: bool, window: bool, any_extent: bool = False) -> tuple[int, int]:
    """Jammed rows of a register block and the vectors per row. Rows whose scalars are
    neighbours in memory take 6 to 8 rows of two vectors (7 x 2 divides the 7, 14, 28
    and 56 wide maps of convolutions, where a 4 x 4 block ran far slower); rows far apart
    take 4 rows of four vectors (a 1024 matmul ran slower in 8 x 2 blocks). Either falls
    back to the other where its rows do not divide the extent; where neither does, the
    first that fits stays, and the last, partial block is jammed by its own rows (the
    ``unroll_and_jam`` pass). Far rows take 6 x 4 (24 accumulators: more rows share each
    loaded vector than in a 4 x 4 block) where 6 divides the rows, or there are at least
    :data:`FAR_ROWS_ANYWAY` of them, or :data:`FAR_ROWS_SOME` that slide no window (a
    matmul's 197 rows, a 56-wide map's 1x1 convolution); a partial last block is jammed by
    its own rows. A 3x3 convolution's rows of a 56-wide map ran slower in blocks of 6.
    Near rows that slide no window (``A(k, m)`` of ``Aᵀ·B``, packed in panels of their
    rows) take 6 x 4 on the same first two terms (256 rows keep 8 x 2). What each choice
    measured, and where: benchmarks/LOG.md. An ``any_extent`` (a symbolic kernel's)
    takes the block of many rows: a partial last block is jammed by its own rows."""
    many = any_extent or extent % FAR_ROWS == 0 or extent >= FAR_ROWS_ANYWAY
    if (many and not (near and window)) or (not near and not window and extent >= FAR_ROWS_SOME):
        return FAR_ROWS, 4
    wide, narrow = [(r, 2) for r in (8, 7, 6)], [(MR, 4)]
    preferred = wide + narrow if near else narrow + wide
    for rows, vectors in preferred:
        if extent % rows == 0:
            return rows, vectors
    # no block divides the extent: full blocks jam, and the last, partial one (split off
    # by separate_full_tiles) runs unjammed
    return next(((r, v) for r, v in preferred if r <= extent), (1, 4))


def _vector_block(cols: int, width: int, vectors: int, partial: bool = False) -> tuple[int, int]:
    """Columns of a register block and the vector width: the most full vectors, up to
    ``vectors``, whose block divides ``cols`` (96 columns: three vectors of 16, not one),
    or of half vectors where those divide it; full vectors and a last, partial block
    where only one half vector would (56 columns: 48 and 8); else, where ``partial``,
    ``vectors`` (or as many as ``cols`` fill) of ``width``."""
    for vw in (width, width // 2):
        if vw >= 1 and cols % vw == 0:
            n = max(v for v in range(1, vectors + 1) if cols % (v * vw) == 0)
            whole = min(vectors, cols // width) * width
            if n * vw < width and whole >= WHOLE_VECTORS * width:
                # only one half vector divides the columns (56, 40, 88): full vectors, and
                # a last, partial block, whose FMAs feed more lanes each (56 columns: 48
                # and 8; benchmarks/LOG.md)
                return whole, width
            return min(cols, n * vw), vw
    if partial and cols > width:
        # no whole vectors: full blocks, and a last, partial one (separated, and run in
        # whole vectors over a zero-padded panel where its operand is packed): 100 columns
        # as 64 and 36, not one block of 100 whose accumulators outnumber the registers
        # (with 20 rows, too few for the panel to be packed, the masked partial block ran
        # slower; benchmarks/LOG.md)
        return min(vectors, -(-cols // width)) * width, width
    return 0, width
