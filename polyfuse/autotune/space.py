"""The search space of a tuning task: the mapping options worth measuring.

After Tensor Comprehensions' tuner, each option takes its values from a small set
drawn from the kernel: tile sizes of a band member are 0 (do not tile), the powers of
two up to its extent and the extent halved k times, rounded up (56, 28, 14, 7, 4, 2, 1);
register tiles are a few rows (1, 2, 4, 6, 7, 8) or 1 to 4 SIMD vectors; orders are
every permutation of up to four members, and for more, each ordered pair of members
innermost with the others in statement order or with the reductions first. The tile sizes,
register tiles and orders refer to the band members of the heaviest statement: its
left-hand side indices, then its reduction indices, without those whose range is one
value in the text (:class:`~polyfuse.scheduler.loop_nest.LoopNest`).

Points are kept in a *canonical* form: options that make the same code are written one
way (an identity order is ``()``; register tiles and a tile order without tiles, or
intra-tile fusion with one statement, are dropped), so the search does not measure one
kernel twice. A point is *valid* when, in canonical form:

* tile sizes and register tiles have one entry per member, orders are permutations of
  the members (or empty); no tile size is larger than its member's extent;
* a register tile divides both the member's cache tile and its extent (its loops have
  a constant trip count, as unroll-and-jam needs);
* the vector width is 1 or a SIMD width of the target dividing the trip count of the
  innermost loop, and ``unroll * vector_width`` does not exceed that trip count;
* ``unroll_jam > 1`` jams the loop right around the innermost one, which must be a
  register-tile loop whose size the factor divides (else lowering silently skips it);
* ``fix_sizes`` only when no member has extent 1: with fixed sizes isl drops such a
  member from the band, and the tile sizes would refer to the next indices.

The heuristic's options (:meth:`SearchSpace.default`) are valid by definition: they are
what the compiler does untuned, and the search starts from them (they may break a rule,
e.g. 6 register rows in a 64-row tile; :meth:`SearchSpace.violations` says which).

For a GPU target (:meth:`SearchSpace.for_task` of a task whose target runs on the GPU: cuda) the
genes are the GPU's: tile sizes and orders as above (the tile loops go to blocks, the
point loops to threads, the innermost to x), threads per block (``BLOCKS``), unroll,
fusion, shared-memory and register promotion on or off, reductions across a block's
threads or not, the stages of pipelined copies (1 to 4), the shared memory a block
asks for (the 48 KiB it gets, or ``DYNAMIC_SHARED``, for deeper pipelines) and the
slices of a sum's reduction on blocks of their own (``split_k``, 1 to 8) and the
iterations a thread takes at a time along x (``vector_width`` 1, 2, 4: neighbouring
elements read as one word); register tiles, unroll-and-jam and the CPU thread pool keep
one value. (Warp tiles
follow from the block's tile and threads where the products go on tensor cores.)

The space models the band as holding every member. isl may split it (a convolution
scheduled without ``reorder_reductions`` gets a band of its output indices and first
reduction index only); then the genes of the members left out change nothing, and some
points make the same kernel.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from polyfuse.autotune.task import Task
from polyfuse.ir.machine import DEFAULT_MACHINE, Machine
from polyfuse.scheduler.gpu_heuristics import default_gpu_options
from polyfuse.scheduler.heuristics import default_options, divisor_at_most, element_bits
from polyfuse.scheduler.loop_nest import LoopNest, Shape
from polyfuse.scheduler.options import Fusion, MappingOptions
from polyfuse.targets import Device, Target

ROWS = (1, 2, 4, 6, 7, 8)      # register tile rows (6 and 7 where they divide the extent)
VECTORS = (1, 2, 3, 4)         # register tile columns, in SIMD vectors
UNROLLS = (1, 2, 4, 8)
MAX_JAM = 8
ALL_ORDERS_UP_TO = 4           # members up to which every permutation is a candidate
ENUMERABLE = 50_000            # raw size up to which a space is listed exhaustively (about 1 s)
DYNAMIC_SHARED = 96 * 1024   # a GPU gene's shared memory above the 48 KiB (sm_80 and later hold it)
BLOCKS = ((32, 8), (32, 4), (16, 16), (32, 16), (64, 4), (128, 2), (256,), (32, 32))  # GPU threads


@dataclass(frozen=True, eq=False)
class SearchSpace:
    """The mapping options of one task that the search may measure."""

    task: Task
    nest: LoopNest
    widths: tuple[int, ...]                         # SIMD widths in elements, widest first
    candidates: Mapping[str, tuple[Any, ...]] = field(repr=False)  # gene -> its values
    heuristic: MappingOptions = field(repr=False)

    @staticmethod
    def of_target(task: Task) -> SearchSpace:
        """The space of ``task``'s options on its own target (the SIMD width and registers
        compilation uses)."""
        return SearchSpace.for_task(task, target_machine_model(task.target))

    @staticmethod
    def for_task(task: Task, machine: Machine = DEFAULT_MACHINE) -> SearchSpace:
        """The space of ``task``'s options on ``machine`` (what the heuristic gets too)."""
        d, sizes = task.definition, task.sizes
        nest = LoopNest.of(d, sizes)
        if task.target.backend.device is Device.GPU:
            heuristic = default_gpu_options(d, sizes)
            return SearchSpace(task, nest, (), _gpu_candidates(nest, heuristic), heuristic)
        width = max(1, machine.vector_bits // element_bits(d))
        widths = tuple(w for w in (width, width // 2, width // 4) if w >= 2)
        heuristic = default_options(d, sizes, machine)
        return SearchSpace(task, nest, widths, _candidates(nest, widths, heuristic), heuristic)

    # --- points -------------------------------------------------------------------
    def default(self) -> MappingOptions:
        """The heuristic's options: valid, and the first point every search measures."""
        return self.heuristic

    def sample(self, rng: np.random.Generator) -> MappingOptions:
        """A random valid point: each gene drawn uniformly, then repaired."""
        return self.repair(self._build({g: _pick(c, rng) for g, c in self.candidates.items()}))

    def mutate(self, options: MappingOptions, rng: np.random.Generator, rate: float) -> MappingOptions:
        """``options`` with each gene redrawn with probability ``rate`` (half the time a
        neighbouring value, half the time any), then repaired."""
        genes = self._genes(options)
        for g, values in self.candidates.items():
            if len(values) > 1 and rng.random() < rate:
                genes[g] = _neighbour(values, genes[g], rng) if rng.random() < 0.5 else _pick(values, rng)
        return self.repair(self._build(genes))

    def crossover(self, parents: Sequence[MappingOptions], rng: np.random.Generator) -> MappingOptions:
        """A child taking each gene from one of the parents (three in TC's tuner), repaired."""
        genes = [self._genes(p) for p in parents]
        child = {g: genes[int(rng.integers(len(genes)))][g] for g in self.candidates}
        return self.repair(self._build(child))

    def points(self) -> Iterator[MappingOptions]:
        """Every distinct valid point, in a fixed order (only sensible for small spaces)."""
        seen: set[MappingOptions] = set()
        names = list(self.candidates)
        for values in itertools.product(*self.candidates.values()):
            o = self.canonical(self._build(dict(zip(names, values))))
            if o not in seen and not self.violations(o):
                seen.add(o)
                yield o

    @property
    def enumerable(self) -> bool:
        return self.raw_size <= ENUMERABLE

    @property
    def raw_size(self) -> int:
        """The number of gene combinations, before pruning."""
        return math.prod(len(c) for c in self.candidates.values())

    @cached_property
    def size(self) -> int:
        """The number of distinct valid points: counted when the space is enumerable, else
        estimated as the raw size times the share of uniform gene draws that are valid
        (fixed seed), which overestimates (one canonical form covers several draws)."""
        if self.enumerable:
            return sum(1 for _ in self.points())
        rng = np.random.default_rng(0)
        draws = 400
        ok = sum(not self.violations(self._build({g: _pick(c, rng) for g, c in self.candidates.items()}))
                 for _ in range(draws))
        return max(1, round(self.raw_size * ok / draws))

    # --- validity -----------------------------------------------------------------
    def is_valid(self, options: MappingOptions) -> bool:
        return options == self.heuristic or not self.violations(options)

    def violations(self, options: MappingOptions) -> list[str]:
        """Why ``options`` is outside the space (empty when valid); the rules are in the
        module's docstring. The heuristic's options are checked like any other here."""
        n = len(self.nest.members)
        out = [f"{name} has {len(v)} entries; the band has {n} members"
               for name, v in (("tile_sizes", options.tile_sizes), ("register_tile", options.register_tile),
                               ("tile_order", options.tile_order), ("point_order", options.point_order))
               if len(v) not in (0, n)]
        if out:
            return out
        o = self.canonical(options)
        shape = self.nest.shape(o)
        out += [f"tile size {t} of '{m}' is larger than its extent {e}"
                for m, t, e in zip(self.nest.members, o.tile_sizes, self.nest.extents) if t > e]
        for j, r in enumerate(o.register_tile):
            if r and math.gcd(shape.tiles[j], self.nest.extents[j]) % r:
                out.append(f"register tile {r} of '{self.nest.members[j]}' does not divide both its "
                           f"tile {shape.tiles[j]} and its extent {self.nest.extents[j]}")
        trip = shape.trips[shape.innermost] if shape.innermost is not None else 1
        if o.vector_width > 1 and (o.vector_width not in self.widths or trip % o.vector_width):
            out.append(f"vector width {o.vector_width} is not a SIMD width ({self.widths}) "
                       f"dividing the innermost trip count {trip}")
        if o.unroll > 1 and o.unroll * o.vector_width > trip:
            out.append(f"unroll {o.unroll} x vector width {o.vector_width} exceeds the innermost trip count {trip}")
        if o.unroll_jam > 1:
            jam = shape.jammed
            r = o.register_tile[jam] if jam is not None and o.register_tile else 0
            if not r or r % o.unroll_jam or o.unroll_jam > MAX_JAM:
                out.append(f"unroll_jam {o.unroll_jam} needs a register tile it divides on the loop "
                           "around the innermost one")
        if o.fix_sizes and 1 in self.nest.extents:
            out.append("fix_sizes with a member of extent 1 (isl drops it from the band)")
        return out

    def canonical(self, options: MappingOptions) -> MappingOptions:
        """The one way of writing the kernel ``options`` make (lengths must match the band)."""
        n = len(self.nest.members)
        identity = tuple(range(n))
        # non-empty tile sizes or point order put the members in statement order first
        ordered = bool(options.tile_sizes or options.point_order)
        tiles = self.nest.fit(options.tile_sizes) if ordered else ()
        tiled = any(tiles)
        registers: tuple[int, ...] = ()
        if tiled and any(options.register_tile):
            # one register tile per cache tile is no register tile (an untiled member's
            # register tile is left alone: another statement's band may be longer there)
            registers = tuple(0 if t and r >= t else r for r, t in zip(self.nest.fit(options.register_tile), tiles))
            registers = registers if any(registers) else ()
        tile_order = options.tile_order if tiled and options.tile_order != identity else ()
        point_order = options.point_order if options.point_order != identity else ()
        intra = Fusion.MIN if options.intra_tile_fusion is Fusion.MIN and tiled and \
            self.nest.statements > 1 else Fusion.MAX
        return replace(options, tile_sizes=tiles, register_tile=registers, tile_order=tile_order,
                       point_order=point_order, intra_tile_fusion=intra,
                       reorder_reductions=options.reorder_reductions and self.nest.reduces)

    def repair(self, options: MappingOptions) -> MappingOptions:
        """A valid point near ``options``: wrong lengths padded or cut, tile sizes cut to
        the extents, then register tiles, vector width, unroll and unroll_jam lowered until
        they fit. Also adapts options tuned for another task of the same family."""
        n, ext = len(self.nest.members), self.nest.extents
        tiles = tuple(min(t, e) for t, e in zip(self.nest.fit(options.tile_sizes), ext))
        fixed = replace(options, tile_sizes=tiles, register_tile=self.nest.fit(options.register_tile),
                        tile_order=options.tile_order if len(options.tile_order) == n else (),
                        point_order=options.point_order if len(options.point_order) == n else ())
        o = self.canonical(fixed)
        if o.register_tile:
            tiles = self.nest.shape(o).tiles
            o = replace(o, register_tile=tuple(divisor_at_most(math.gcd(t, e), r) if r else 0
                                               for r, t, e in zip(o.register_tile, tiles, ext)))
            o = self.canonical(o)
        shape = self.nest.shape(o)
        trip = shape.trips[shape.innermost] if shape.innermost is not None else 1
        width = max(w for w in (1,) + self.widths if w <= o.vector_width and trip % w == 0)
        unroll = o.unroll
        while unroll > 1 and unroll * width > trip:
            unroll //= 2
        jam = shape.jammed
        rows = o.register_tile[jam] if jam is not None and o.register_tile else 0
        unroll_jam = divisor_at_most(rows, min(o.unroll_jam, MAX_JAM)) if rows else 1
        return replace(o, vector_width=width, unroll=max(unroll, 1), unroll_jam=unroll_jam,
                       fix_sizes=o.fix_sizes and 1 not in ext)

    # --- features -----------------------------------------------------------------
    def features(self, options: MappingOptions) -> np.ndarray:
        """Numbers describing the kernel ``options`` make, for a cost model."""
        o = self.canonical(options)
        return np.array(_features(self.nest, o, self.nest.shape(o)), dtype=np.float64)

    def feature_names(self) -> tuple[str, ...]:
        per = ("log_tile", "log_trip", "tiled", "point_pos", "tile_pos", "innermost", "jammed",
               "contiguous", "log_extent")
        return tuple(f"{m}.{p}" for m in self.nest.members for p in per) + _GLOBAL_FEATURES

    # --- genes: the options as independent choices ----------------------------------
    def _genes(self, o: MappingOptions) -> dict[str, Any]:
        n = len(self.nest.members)
        identity = tuple(range(n))
        genes: dict[str, Any] = {f.name: getattr(o, f.name) for f in _SCALAR_FIELDS}
        tiles, registers = self.nest.fit(o.tile_sizes), self.nest.fit(o.register_tile)
        genes |= {f"tile_sizes.{j}": tiles[j] for j in range(n)}
        genes |= {f"register_tile.{j}": registers[j] for j in range(n)}
        genes["tile_order"] = () if o.tile_order == identity else o.tile_order
        genes["point_order"] = () if o.point_order == identity else o.point_order
        return genes

    def _build(self, genes: Mapping[str, Any]) -> MappingOptions:
        n = len(self.nest.members)
        return MappingOptions(
            **{f.name: genes[f.name] for f in _SCALAR_FIELDS},
            tile_sizes=tuple(genes[f"tile_sizes.{j}"] for j in range(n)),
            register_tile=tuple(genes[f"register_tile.{j}"] for j in range(n)),
            tile_order=genes["tile_order"], point_order=genes["point_order"])


_SCALAR_FIELDS = tuple(f for f in MappingOptions.__dataclass_fields__.values()
                       if f.name not in ("tile_sizes", "register_tile", "tile_order", "point_order"))
_GLOBAL_FEATURES = (*(f"fusion_{f.name.lower()}" for f in Fusion), "intra_min", "parallel",
                    "log_vector_width", "log_unroll", "log_unroll_jam", "reorder_reductions", "fix_sizes",
                    "log_register_block", "log_tile_footprint", "log_tiles", "vector_tail",
                    "innermost_contiguous", "log_work", "statements", "log_block_threads",
                    "shared_memory", "private_memory", "stages", "log_split_k")


def _features(nest: LoopNest, o: MappingOptions, shape: Shape) -> list[float]:
    n = len(nest.members)
    point = o.point_order or tuple(range(n))
    tile = o.tile_order or tuple(range(n))
    out: list[float] = []
    for j in range(n):
        out += [math.log2(shape.tiles[j]), math.log2(shape.trips[j]), float(bool(o.tile_sizes and o.tile_sizes[j])),
                point.index(j) / max(n - 1, 1), tile.index(j) / max(n - 1, 1), float(shape.innermost == j),
                float(shape.jammed == j), nest.contiguous[j], math.log2(nest.extents[j])]
    inner = shape.innermost
    trip = shape.trips[inner] if inner is not None else 1
    tiles = math.prod(-(-e // t) for e, t in zip(nest.extents, shape.tiles))
    out += [float(o.fusion is f) for f in Fusion]
    out += [float(o.intra_tile_fusion is Fusion.MIN), float(o.parallel), math.log2(o.vector_width),
            math.log2(o.unroll), math.log2(o.unroll_jam), float(o.reorder_reductions), float(o.fix_sizes),
            math.log2(math.prod(shape.trips)), math.log2(math.prod(shape.tiles)), math.log2(tiles),
            float(trip % o.vector_width != 0), nest.contiguous[inner] if inner is not None else 0.0,
            math.log2(nest.work), float(nest.statements), math.log2(math.prod(o.block)),
            float(o.use_shared_memory), float(o.use_private_memory), float(o.stages), math.log2(o.split_k)]
    return out


def target_machine_model(target: Target) -> Machine:
    """The machine model of ``target`` (:func:`polyfuse.targets.cpu.machine`); for a target
    without a CPU (cuda) the default one, which its GPU options do not read."""
    if target.backend.cpus:
        from polyfuse.targets.cpu import machine
        return machine(target)
    return DEFAULT_MACHINE


# --- candidate values ------------------------------------------------------------------

def _candidates(nest: LoopNest, widths: tuple[int, ...], heuristic: MappingOptions) -> dict[str, tuple[Any, ...]]:
    n = len(nest.members)
    c: dict[str, tuple[Any, ...]] = {
        "fusion": _fusions(nest),
        "intra_tile_fusion": (Fusion.MAX, Fusion.MIN) if nest.statements > 1 else (Fusion.MAX,),
        "parallel": (0, 1),
        "vector_width": (1,) + tuple(sorted(widths)),
        "unroll": UNROLLS,
        "unroll_jam": tuple(range(1, MAX_JAM + 1)) if n > 1 else (1,),
        "reorder_reductions": (False, True) if nest.reduces else (False,),
        "fix_sizes": (False, True) if min(nest.extents, default=1) > 1 else (False,),
        "num_threads": (0,),
    } | _ONE_VALUE_ON_CPUS
    tiles, registers = nest.fit(heuristic.tile_sizes), nest.fit(heuristic.register_tile)
    for j, e in enumerate(nest.extents):
        c[f"tile_sizes.{j}"] = _below(e + 1, _tile_sizes(e) | {tiles[j]})
        c[f"register_tile.{j}"] = _below(e, set(ROWS) | {k * w for w in widths for k in VECTORS} | {registers[j]})
    orders = _orders(n, nest.reductions)
    c["tile_order"] = _with(orders, heuristic.tile_order, n)
    c["point_order"] = _with(orders, heuristic.point_order, n)
    return dict(sorted(c.items()))


def _fusions(nest: LoopNest) -> tuple[Fusion, ...]:
    """isl's strategies, and row pipelines where statements reduce rows."""
    return (Fusion.MAX, Fusion.PRESERVE, Fusion.MIN) + ((Fusion.ROWS,) if nest.reduces and nest.statements > 1 else ())


# the GPU fields, which CPU code ignores
_ONE_VALUE_ON_CPUS: dict[str, tuple[Any, ...]] = {
    "block": ((),), "grid": (0,), "use_shared_memory": (True,), "use_private_memory": (True,),
    "shared_memory_bytes": (0,), "block_reduction": (False,), "stages": (1,), "split_k": (1,)}


def _gpu_candidates(nest: LoopNest, heuristic: MappingOptions) -> dict[str, tuple[Any, ...]]:
    n = len(nest.members)
    c: dict[str, tuple[Any, ...]] = {
        "fusion": _fusions(nest),
        "intra_tile_fusion": (Fusion.MAX,),
        "parallel": (heuristic.parallel,),
        # a thread's consecutive iterations along x at a time (words of up to 128 bits)
        "vector_width": tuple(sorted({1, 2, 4, heuristic.vector_width})),
        "unroll": UNROLLS,
        "unroll_jam": (1,),
        "reorder_reductions": (False, True) if nest.reduces else (False,),
        "fix_sizes": (False, True) if min(nest.extents, default=1) > 1 else (False,),
        "num_threads": (0,),
        "block": tuple(sorted(set(BLOCKS) | {heuristic.block})),
        "grid": (0,),
        "use_shared_memory": (False, True),
        "use_private_memory": (False, True),
        # 0: the 48 KiB a block gets; more: dynamic shared memory, for deeper pipelines
        "shared_memory_bytes": (0, DYNAMIC_SHARED) if nest.reduces else (0,),
        "block_reduction": (False, True) if nest.reduces else (False,),
        "stages": tuple(sorted({1, 2, 3, 4, heuristic.stages})) if nest.reduces else (1,),
        # slices of a sum's one reduction index on blocks of their own (where it divides)
        "split_k": tuple(sorted({1, 2, 4, 8, heuristic.split_k})) if nest.reductions == 1 else (1,),
    }
    tiles = nest.fit(heuristic.tile_sizes)
    for j, e in enumerate(nest.extents):
        c[f"tile_sizes.{j}"] = _below(e + 1, _tile_sizes(e) | {tiles[j]})
        c[f"register_tile.{j}"] = (0,)
    orders = _orders(n, nest.reductions)
    c["tile_order"] = _with(orders, heuristic.tile_order, n)
    c["point_order"] = _with(orders, heuristic.point_order, n)
    return dict(sorted(c.items()))


def _tile_sizes(extent: int) -> set[int]:
    """TC's candidates: powers of two up to the extent, and the extent halved k times."""
    powers = {1 << k for k in range(extent.bit_length())}
    halves = {-(-extent // (1 << k)) for k in range(extent.bit_length() + 1)}
    return powers | halves


def _below(limit: int, values: set[int]) -> tuple[int, ...]:
    """0 (do not tile or block), then the values below ``limit``."""
    return (0,) + tuple(sorted(v for v in values if 0 < v < limit))


def _orders(n: int, reductions: int) -> tuple[tuple[int, ...], ...]:
    """Every permutation for a few members; for more, each ordered pair of members
    innermost with the others in statement order or with the reductions first."""
    if n <= ALL_ORDERS_UP_TO:
        found = set(itertools.permutations(range(n)))
    else:
        found = {tuple(range(n))}
        for a, b in itertools.permutations(range(n), 2):
            rest = [j for j in range(n) if j not in (a, b)]
            found.add(tuple(rest + [a, b]))
            found.add(tuple(sorted(rest, key=lambda j: j < n - reductions) + [a, b]))
    identity = tuple(range(n))
    return tuple(sorted(() if p == identity else p for p in found))


def _with(orders: tuple[tuple[int, ...], ...], extra: tuple[int, ...], n: int) -> tuple[tuple[int, ...], ...]:
    if len(extra) != n or extra == tuple(range(n)) or extra in orders:
        return orders
    return tuple(sorted(orders + (extra,)))


def _pick(values: tuple[Any, ...], rng: np.random.Generator) -> Any:
    return values[int(rng.integers(len(values)))]


def _neighbour(values: tuple[Any, ...], current: Any, rng: np.random.Generator) -> Any:
    """The value next to ``current`` in the candidate list, on a random side."""
    k = values.index(current) if current in values else int(rng.integers(len(values)))
    step = 1 if rng.random() < 0.5 else -1
    return values[min(max(k + step, 0), len(values) - 1)]
