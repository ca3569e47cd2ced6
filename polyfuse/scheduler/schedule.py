"""Scheduling: isl's scheduler under mapping options, then tiling and parallel marks."""

from __future__ import annotations

import islpy as isl

from polyfuse.scheduler.model import Model
from polyfuse.scheduler.options import Fusion, MappingOptions

PARALLEL_MARK = "parallel"


def _configure(ctx: isl.Context, fusion: Fusion) -> None:
    # ISL_NOTES: a small constant-term bound avoids blow-ups with fixed sizes and
    # still allows shifted fusion.
    ctx.set_schedule_max_constant_term(4)
    ctx.set_schedule_serialize_sccs(1 if fusion is Fusion.MIN else 0)
    ctx.set_schedule_maximize_coincidence(1 if fusion is Fusion.PRESERVE else 0)
    ctx.set_schedule_outer_coincidence(1 if fusion is Fusion.PRESERVE else 0)
    ctx.set_schedule_whole_component(0)


def compute_schedule(model: Model, options: MappingOptions,
                     sizes: dict[str, int] | None = None) -> isl.Schedule:
    """A legal schedule of the model, tiled and marked as the options ask."""
    _configure(model.ctx, options.fusion)
    deps = model.dependences
    context = model.context(sizes if options.fix_sizes else None)
    constraints = (isl.ScheduleConstraints.on_domain(model.domain).set_context(context)
                   .set_validity(deps).set_proximity(deps).set_coincidence(deps))
    schedule = constraints.compute_schedule()
    for path in reversed(_outer_band_paths(schedule.get_root(), ())):
        schedule = _transform_band(_node_at(schedule, path), options).get_schedule()
    return schedule


def _node_at(schedule: isl.Schedule, path: tuple[int, ...]) -> isl.ScheduleNode:
    node = schedule.get_root()
    for k in path:
        node = node.child(k)
    return node


def _outer_band_paths(node: isl.ScheduleNode, path: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Paths to the bands that no other band encloses."""
    if node.get_type() == isl.schedule_node_type.band:
        return [path]
    out: list[tuple[int, ...]] = []
    for k in range(node.n_children()):
        out += _outer_band_paths(node.child(k), path + (k,))
    return out


def _transform_band(band: isl.ScheduleNode, options: MappingOptions) -> isl.ScheduleNode:
    n = band.band_n_member()
    sizes = list(options.tile_sizes[:n])
    if band.band_get_permutable() and any(sizes):
        sizes += [0] * (n - len(sizes))
        big = 1 << 30  # "do not tile" this member: one tile covers it
        space = band.band_get_space()
        mv = isl.MultiVal.zero(space)
        for j, t in enumerate(sizes):
            mv = mv.set_val(j, isl.Val.int_from_si(band.get_ctx(), t or big))
        band = band.band_tile(mv)  # now the tile band; its child is the point band
        if options.tile_order and len(options.tile_order) == n:
            band = _permute_band(band, options.tile_order)
    if options.parallel:
        band = _mark_parallel(band)
    return band


def _permute_band(band: isl.ScheduleNode, order: tuple[int, ...]) -> isl.ScheduleNode:
    """Reorder the members of a permutable band (any order is legal there)."""
    partial = band.band_get_partial_schedule()
    upas = [partial.get_at(order[j]) for j in range(len(order))]
    lst = isl.UnionPwAffList.alloc(band.get_ctx(), len(upas))
    for u in upas:
        lst = lst.add(u)
    coincident = [band.band_member_get_coincident(order[j]) for j in range(len(order))]
    permuted = isl.MultiUnionPwAff.from_union_pw_aff_list(partial.get_space(), lst)
    child = band.delete()
    node = child.insert_partial_schedule(permuted)
    node = node.band_set_permutable(1)
    for j, c in enumerate(coincident):
        node = node.band_member_set_coincident(j, c)
    return node


def _mark_parallel(band: isl.ScheduleNode) -> isl.ScheduleNode:
    n = band.band_n_member()
    first = next((j for j in range(n) if band.band_member_get_coincident(j)), None)
    if first is None:
        return band
    if first > 0:
        band = band.band_split(first).child(0)
    # The AST names the loop of schedule dimension d "c<d>"; a degenerate (one-iteration)
    # loop disappears, so the mark says which dimension is parallel, not "the next loop".
    name = f"{PARALLEL_MARK}:{band.get_schedule_depth()}"
    return band.insert_mark(isl.Id(name, context=band.get_ctx()))



def member_carries_dependence(model: Model, band: isl.ScheduleNode, member: int) -> bool:
    """Whether band member ``member`` carries a dependence between instances of its subtree.

    Legality of a parallel loop: every dependence whose source and sink lie below the
    band and agree on the outer schedule (sequence positions and outer bands) and on the
    band's earlier members must also agree on this member.
    """
    domain = band.get_domain()
    deps = model.dependences.intersect_domain(domain).intersect_range(domain)
    if deps.is_empty():
        return False
    prefix = band.get_prefix_schedule_union_map()
    n_prefix = _out_dims(prefix.intersect_domain(domain))
    partial = band.band_get_partial_schedule_union_map()
    sched = prefix.flat_range_product(partial) if n_prefix else partial
    deltas = isl.Set.from_union_set(deps.apply_domain(sched).apply_range(sched).deltas())
    zero = isl.Val.zero(model.ctx)
    for k in range(n_prefix + member):
        deltas = deltas.fix_val(isl.dim_type.set, k, zero)
    same = deltas.fix_val(isl.dim_type.set, n_prefix + member, zero)
    return not deltas.subtract(same).is_empty()


def _out_dims(m: isl.UnionMap) -> int:
    dims: list[int] = []
    m.foreach_map(lambda x: dims.append(x.dim(isl.dim_type.out)))
    return max(dims, default=0)


def parallel_marks_are_legal(model: Model, schedule: isl.Schedule) -> bool:
    """Check every parallel mark of a schedule against the dependences (used by tests)."""
    ok = [True]

    def visit(node: isl.ScheduleNode) -> None:
        if node.get_type() == isl.schedule_node_type.mark and \
                node.mark_get_id().get_name().startswith(PARALLEL_MARK):
            ok[0] = ok[0] and not member_carries_dependence(model, node.child(0), 0)
        for k in range(node.n_children()):
            visit(node.child(k))

    visit(schedule.get_root())
    return ok[0]
