"""Scheduling: isl's scheduler under mapping options, then tiling and parallel marks."""

from __future__ import annotations

import logging

import islpy as isl

from polyfuse.scheduler.loop_nest import band_order
from polyfuse.scheduler.model import Model
from polyfuse.scheduler.options import Fusion, MappingOptions

logger = logging.getLogger("polyfuse.scheduler")

PARALLEL_MARK = "parallel"
GPU_BLOCK_MARK = "gpu_block"    # coincident members of a GPU schedule's tile band
GPU_THREAD_MARK = "gpu_thread"  # ... and of its point band


def _configure(ctx: isl.Context, fusion: Fusion) -> None:
    # ISL_NOTES: a small constant-term bound avoids blow-ups with fixed sizes and
    # still allows shifted fusion.
    ctx.set_schedule_max_constant_term(4)
    ctx.set_schedule_serialize_sccs(1 if fusion is Fusion.MIN else 0)
    ctx.set_schedule_maximize_coincidence(1 if fusion is Fusion.PRESERVE else 0)
    ctx.set_schedule_outer_coincidence(1 if fusion is Fusion.PRESERVE else 0)
    ctx.set_schedule_whole_component(0)


def compute_schedule(model: Model, options: MappingOptions,
                     sizes: dict[str, int] | None = None, *, gpu: bool = False) -> isl.Schedule:
    """A legal schedule of the model, tiled and marked as the options ask: parallel
    marks for CPUs, or (``gpu``) block and thread marks on the tile and point bands."""
    deps = model.dependences
    context = model.context(sizes if options.fix_sizes else None)
    validity = model.relaxed if options.reorder_reductions else model.exact
    constraints = (isl.ScheduleConstraints.on_domain(model.domain).set_context(context)
                   .set_validity(validity).set_proximity(validity).set_coincidence(deps))
    schedule = _solve(constraints, model.ctx, options.fusion)
    for path in reversed(_outer_band_paths(schedule.get_root(), ())):
        schedule = _transform_band(_node_at(schedule, path), options, validity, gpu).get_schedule()
    return schedule


# isl operations one fusing schedule may take. Fixed sizes can make isl's solver blow up
# (ISL_NOTES): 18 attention statements reach this in 0.6 s and ran for minutes past it,
# while every kernel of ResNet-18, a MobileNetV2-style net, a BERT layer and the TC
# programs stays below it (two TC programs pass 100,000).
SCHEDULE_OPERATIONS = 300_000

# What to ask of isl when a fusion strategy runs out of operations: fuse less.
_FALLBACK = {Fusion.MAX: Fusion.PRESERVE, Fusion.PRESERVE: Fusion.MIN}


def _solve(constraints: isl.ScheduleConstraints, ctx: isl.Context, fusion: Fusion) -> isl.Schedule:
    """isl's schedule under ``fusion``, or under less fusion where that takes too long;
    minimal fusion (a nest per component) is always fast and has no limit."""
    while True:
        _configure(ctx, fusion)
        ctx.reset_operations()
        ctx.set_max_operations(SCHEDULE_OPERATIONS if fusion in _FALLBACK else 0)
        try:
            return constraints.compute_schedule()
        except isl.Error:
            if fusion not in _FALLBACK:
                raise
            logger.debug("isl's %s-fusion schedule took too long; trying %s", fusion.value,
                         _FALLBACK[fusion].value)
            fusion = _FALLBACK[fusion]
        finally:
            ctx.reset_operations()
            ctx.set_max_operations(0)


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


def _tile(band: isl.ScheduleNode, sizes: tuple[int, ...]) -> isl.ScheduleNode:
    """Tile a permutable band; returns the tile band, whose child is the point band."""
    n = band.band_n_member()
    big = 1 << 30  # size 0, "do not tile" this member: one tile covers it
    mv = isl.MultiVal.zero(band.band_get_space())
    for j in range(n):
        t = sizes[j] if j < len(sizes) else 0
        mv = mv.set_val(j, isl.Val.int_from_si(band.get_ctx(), t or big))
    return band.band_tile(mv)


def _transform_band(band: isl.ScheduleNode, options: MappingOptions,
                    validity: isl.UnionMap, gpu: bool = False) -> isl.ScheduleNode:
    """Tile (twice with register tiles), reorder and mark one outermost band."""
    n = band.band_n_member()
    tiled = False
    if band.band_get_permutable() and (options.tile_sizes or options.point_order):
        order = band_order(band)   # the members as the options number them
        if order is not None:
            band = _permute_band(band, order)
    if band.band_get_permutable() and any(options.tile_sizes[:n]):
        tiled = True
        band = _tile(band, options.tile_sizes)
        point, ups = band.child(0), 1
        if any(options.register_tile[:n]):
            point = _tile(point, options.register_tile)
            if len(options.tile_order) == n:  # register blocks in the tiles' order
                point = _permute_band(point, options.tile_order)
            point, ups = point.child(0), 2
        if len(options.point_order) == n:
            point = _permute_band(point, options.point_order)
        if options.intra_tile_fusion is Fusion.MIN and point.n_children() and \
                point.child(0).get_type() == isl.schedule_node_type.sequence:
            sunk = point.band_sink()  # a copy of the point loops under each statement
            smap = sunk.get_schedule().get_map()
            if validity.is_subset(smap.lex_lt_union_map(smap)):  # distribution is legal
                point = sunk
        band = point
        for _ in range(ups):
            band = band.parent()
        if len(options.tile_order) == n:
            band = _permute_band(band, options.tile_order)
    elif band.band_get_permutable() and len(options.point_order) == n:
        band = _permute_band(band, options.point_order)
    if gpu:
        return _mark_gpu(band, tiled)
    if options.parallel:
        band = _mark_parallel(band)
    return band


def _mark_gpu(band: isl.ScheduleNode, tiled: bool) -> isl.ScheduleNode:
    """Mark a tiled band's coincident tile loops for blocks and its coincident point loops
    for threads; of an untiled band, the innermost coincident member for threads and the
    others for blocks (a single coincident member for blocks)."""
    if tiled:
        point = band.child(0)
        if point.get_type() == isl.schedule_node_type.band:  # not sunk below a sequence
            marked = _mark_members(point, GPU_THREAD_MARK, _coincident(point))
            band = marked.parent() if marked.parent().get_type() == isl.schedule_node_type.band \
                else marked.parent().parent()
        return _mark_members(band, GPU_BLOCK_MARK, _coincident(band))
    members = _coincident(band)
    if len(members) < 2:
        return _mark_members(band, GPU_BLOCK_MARK, members)
    band = _mark_members(band, GPU_THREAD_MARK, members[-1:]).child(0)
    return _mark_members(band, GPU_BLOCK_MARK, members[:-1])


def _coincident(band: isl.ScheduleNode) -> list[int]:
    return [j for j in range(band.band_n_member()) if band.band_member_get_coincident(j)]


def _mark_members(band: isl.ScheduleNode, mark: str, members: list[int]) -> isl.ScheduleNode:
    """A mark ``name:d1,d2`` above the band naming the schedule dimensions of ``members``
    (the AST calls them ``c<d>``); returns the band, or the band itself without members."""
    if not members:
        return band
    depth = band.get_schedule_depth()
    dims = ",".join(str(depth + j) for j in members)
    return band.insert_mark(isl.Id(f"{mark}:{dims}", context=band.get_ctx())).child(0)


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
    coincident = [j for j in range(n) if band.band_member_get_coincident(j)]
    if not coincident:
        return band
    # The AST names the loop of schedule dimension d "c<d>"; a degenerate (one-iteration)
    # loop disappears, so the mark lists every coincident dimension of the band (they
    # are parallel with any outer ones fixed) and lowering takes the first that exists.
    depth = band.get_schedule_depth()
    dims = ",".join(str(depth + j) for j in coincident)
    return band.insert_mark(isl.Id(f"{PARALLEL_MARK}:{dims}", context=band.get_ctx()))



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
            band = node.child(0)
            depth = band.get_schedule_depth()
            dims = [int(x) - depth for x in node.mark_get_id().get_name().split(":")[1].split(",")]
            ok[0] = ok[0] and not any(member_carries_dependence(model, band, j) for j in dims)
        for k in range(node.n_children()):
            visit(node.child(k))

    visit(schedule.get_root())
    return ok[0]
