"""The loop nest of a definition as mapping options see it.

``tile_sizes``, ``register_tile``, ``tile_order`` and ``point_order`` of
:class:`~polyfuse.scheduler.options.MappingOptions` hold one entry per *member* of each
outermost band. Member ``j`` is the ``j``-th index of the definition's heaviest
statement (the most iterations at the given sizes): its left-hand side indices, then its
reduction indices (the order in which the polyhedral model gives a statement its
dimensions, :func:`loop_indices`), less those whose range is one value fixed in the
text, for which isl schedules no loop. An order lists members outermost first:
``point_order=(2, 0, 1)`` of a matmul's ``m, n, k`` runs ``k`` outermost. The scheduler
puts a band's members in this order before it tiles (:func:`band_order`); the heuristics
write their choices by index name and the tuner's search space is built on the nest.

Options can also be written by index name (:class:`NamedOptions`), which is how tuning
records map options tuned for one definition onto another of the same family whose
nest has other members, or the same members in another order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import islpy as isl

from polyfuse.errors import OptionError
from polyfuse.ir.comprehension import Definition, IndexVar, Literal, Read, Statement, walk
from polyfuse.ir.symbolic import evaluate_int
from polyfuse.scheduler.options import MappingOptions

SIZED = ("tile_sizes", "register_tile")     # per-member sizes
ORDERS = ("tile_order", "point_order")      # permutations of the members


def loop_indices(st: Statement) -> tuple[str, ...]:
    """A statement's indices in loop order: left-hand side, then reductions."""
    return st.indices + st.reduction_indices


def extent(st: Statement, index: str, sizes: dict[str, int]) -> int:
    """The trip count of ``index`` in ``st`` at these sizes."""
    r = st.range_of(index)
    return evaluate_int(r.hi, sizes) - evaluate_int(r.lo, sizes)


def work(st: Statement, sizes: dict[str, int]) -> int:
    """The iterations of ``st`` at these sizes."""
    return math.prod(extent(st, r.index, sizes) for r in st.ranges)


def heaviest(d: Definition, sizes: dict[str, int]) -> Statement:
    """The statement with the most iterations (what tile sizes and orders refer to)."""
    return max(d.statements, key=lambda s: work(s, sizes))


def single_valued(st: Statement, index: str) -> bool:
    """A range of one value fixed in the text: isl schedules no loop (no band member) for it."""
    r = st.range_of(index)
    return isinstance(r.lo, Literal) and isinstance(r.hi, Literal) and int(r.hi.value) - int(r.lo.value) == 1


@dataclass(frozen=True)
class Shape:
    """The loops that options make of the band (as far as the options decide them)."""

    tiles: tuple[int, ...]         # per member: its cache tile (the extent when untiled)
    trips: tuple[int, ...]         # per member: the trip count of its innermost-level loop
    innermost: int | None          # the member of the innermost loop (None: no loop left)
    jammed: int | None             # the member of the loop around it


@dataclass(frozen=True, slots=True)
class NamedOptions:
    """The per-member fields of mapping options keyed by index name: sizes per name,
    orders as names outermost first. Its JSON form is
    ``{"tile_sizes": {"m": 32, "n": 64, "k": 0}, "register_tile": {}, "tile_order": [],
    "point_order": ["k", "m", "n"]}``."""

    tile_sizes: tuple[tuple[str, int], ...] = ()
    register_tile: tuple[tuple[str, int], ...] = ()
    tile_order: tuple[str, ...] = ()
    point_order: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {**{f: dict(getattr(self, f)) for f in SIZED}, **{f: list(getattr(self, f)) for f in ORDERS}}

    @staticmethod
    def from_json(j: Any) -> NamedOptions:
        """The named options :meth:`to_json` wrote; anything else is an
        :class:`~polyfuse.errors.OptionError`."""
        if not isinstance(j, dict) or set(j) - set(SIZED + ORDERS):
            raise OptionError(f"named options are an object of {', '.join(SIZED + ORDERS)}, got {j!r:.80}")
        for f in SIZED:
            sizes = j.get(f, {})
            if not isinstance(sizes, dict) or not all(
                    isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in sizes.values()):
                raise OptionError(f"named {f} must map index names to sizes >= 0, got {sizes!r:.80}")
        for f in ORDERS:
            order = j.get(f, [])
            if not isinstance(order, list) or not all(isinstance(i, str) for i in order) \
                    or len(set(order)) != len(order):
                raise OptionError(f"named {f} must list distinct index names, got {order!r:.80}")
        return NamedOptions(*(tuple(j.get(f, {}).items()) for f in SIZED),
                            *(tuple(j.get(f, [])) for f in ORDERS))


@dataclass(frozen=True)
class LoopNest:
    """The band of a definition's heaviest statement, which tile sizes and orders refer to."""

    statement: Statement
    members: tuple[str, ...]       # left-hand side, then reduction indices
    extents: tuple[int, ...]
    reductions: int                # the last ``reductions`` members are reduction indices
    reduces: bool                  # some statement of the definition reduces
    contiguous: tuple[float, ...]  # per member: share of the accesses whose last index uses it
    work: int                      # iterations of the statement
    statements: int                # in the definition

    @staticmethod
    def of(d: Definition, sizes: dict[str, int]) -> LoopNest:
        st = heaviest(d, sizes)
        members = tuple(i for i in loop_indices(st) if not single_valued(st, i))
        accesses = [r.indices[-1] for r in walk(st.rhs) if isinstance(r, Read) and r.indices]
        lasts = [{n.name for n in walk(e) if isinstance(n, IndexVar)} for e in accesses]
        lasts += [{st.indices[-1]}] if st.indices else []
        contiguous = tuple(sum(i in last for last in lasts) / max(len(lasts), 1) for i in members)
        return LoopNest(st, members, tuple(extent(st, i, sizes) for i in members),
                        sum(i in st.reduction_indices for i in members),
                        any(s.reduction_indices for s in d.statements), contiguous,
                        work(st, sizes), len(d.statements))

    @property
    def outputs(self) -> tuple[str, ...]:
        """The members that index the left-hand side."""
        return self.members[:len(self.members) - self.reductions]

    @property
    def reduction_members(self) -> tuple[str, ...]:
        return self.members[len(self.members) - self.reductions:]

    def extent_of(self) -> dict[str, int]:
        """Each member's extent, by index name."""
        return dict(zip(self.members, self.extents))

    # --- positions of the options' per-member fields --------------------------------
    def per_member(self, values: Mapping[str, int]) -> tuple[int, ...]:
        """Sizes by index name as a per-member tuple (a member not named gets 0)."""
        return tuple(values.get(i, 0) for i in self.members)

    def order(self, names: Sequence[str]) -> tuple[int, ...]:
        """An order of index names, outermost first, as a permutation of member positions."""
        return tuple(self.members.index(i) for i in names)

    def fit(self, values: tuple[int, ...]) -> tuple[int, ...]:
        """Per-member sizes cut or padded with 0 to one entry per member."""
        n = len(self.members)
        return tuple(values[:n]) + (0,) * max(0, n - len(values))

    def shape(self, o: MappingOptions) -> Shape:
        """The loops of canonical options ``o`` (see the tuner's ``SearchSpace.canonical``)."""
        n = len(self.members)
        tiles = tuple(min(t, e) if t else e for t, e in zip(self.fit(o.tile_sizes), self.extents))
        if any(o.tile_sizes) and any(o.register_tile):
            trips = tuple(min(r, t) if r else t for r, t in zip(self.fit(o.register_tile), tiles))
        else:
            trips = tiles
        inner = [j for j in (o.point_order or range(n)) if trips[j] > 1]
        return Shape(tiles, trips, inner[-1] if inner else None, inner[-2] if len(inner) > 1 else None)

    # --- options by index name -------------------------------------------------------
    def to_named(self, o: MappingOptions) -> NamedOptions:
        """The per-member fields of ``o`` by index name (entries past the members dropped)."""
        sized = [tuple(zip(self.members, getattr(o, f))) for f in SIZED]
        orders = [tuple(self.members[j] for j in getattr(o, f)) if len(getattr(o, f)) == len(self.members)
                  else () for f in ORDERS]
        return NamedOptions(*sized, *orders)

    def from_named(self, named: NamedOptions, base: MappingOptions) -> MappingOptions:
        """``base`` with the per-member fields of ``named`` placed on this nest's members:
        a member that ``named`` does not size gets 0; an order keeps the names of this
        nest's members, and is dropped (statement order) when it misses one of them."""
        sized = {f: self.per_member(dict(getattr(named, f))) if getattr(named, f) else () for f in SIZED}
        kept = {f: [i for i in getattr(named, f) if i in self.members] for f in ORDERS}
        orders = {f: self.order(names) if len(names) == len(self.members) else () for f, names in kept.items()}
        return replace(base, **sized, **orders)


def band_order(band: isl.ScheduleNode) -> tuple[int, ...] | None:
    """The permutation that puts a band's members in loop-nest order: by the dimension of
    its statement with the most dimensions that each member schedules, when each member
    is one of those dimensions alone (else None, as when isl's order is that already)."""
    partial = band.band_get_partial_schedule()
    n = band.band_n_member()
    dims: list[int] = []
    for j in range(n):
        pieces = partial.get_at(j).get_pw_aff_list()
        widest = max((pieces.get_at(k) for k in range(pieces.n_pw_aff())),
                     key=lambda pa: pa.dim(isl.dim_type.in_), default=None)
        dim = None if widest is None else _single_index(widest)
        if dim is None:
            return None
        dims.append(dim)
    order = tuple(sorted(range(n), key=lambda j: dims[j]))
    if len(set(dims)) != n or order == tuple(range(n)):
        return None
    return order


def _single_index(pa: isl.PwAff) -> int | None:
    """``d`` when the affine function is the input dimension ``d`` alone."""
    found: list[int | None] = []

    def piece(_: isl.Set, aff: isl.Aff) -> None:
        terms = [d for d in range(aff.dim(isl.dim_type.in_))
                 if not aff.get_coefficient_val(isl.dim_type.in_, d).is_zero()]
        one = len(terms) == 1 and aff.get_coefficient_val(isl.dim_type.in_, terms[0]).is_one()
        found.append(terms[0] if one and aff.get_constant_val().is_zero() else None)

    pa.foreach_piece(piece)
    return found[0] if len(found) == 1 else None
