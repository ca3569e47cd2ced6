"""Scheduling: isl's scheduler under mapping options, then tiling and parallel marks."""

from __future__ import annotations

import logging
from dataclasses import replace

import islpy as isl

from polyfuse.scheduler.loop_nest import band_order, heaviest
from polyfuse.scheduler.model import SYMBOLIC_MAX, Model, StatementInfo
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
    rows = row_schedule(model, validity) if options.fusion is Fusion.ROWS else None
    # (no row pipeline: on the GPU each statement's own nest, on a CPU fused as isl can)
    fallback = Fusion.PRESERVE if gpu else Fusion.MAX
    schedule = rows or _solve(constraints, model.ctx, fallback if options.fusion is Fusion.ROWS
                              else options.fusion)
    tiled = _heaviest(model, sizes) if not gpu else None   # the statements the options' tiles fit
    for path in reversed(_outer_band_paths(schedule.get_root(), ())):
        band = _node_at(schedule, path)
        chosen = options if tiled is None or _schedules(band, tiled) else _untiled(options)
        schedule = _transform_band(band, chosen, validity, gpu).get_schedule()
    if rows is not None and gpu:
        schedule = _mark_inner_threads(schedule.get_root()).get_schedule()
    return schedule


def _heaviest(model: Model, sizes: dict[str, int] | None) -> frozenset[str] | None:
    """The isl statements of the TC statement the options' tiles and orders were made for
    (the one of the most iterations), where the sizes say which; else None."""
    if sizes is None or len(model.definition.statements) < 2:
        return None
    st = heaviest(model.definition, sizes)
    return frozenset(name for name, info in model.statements.items() if info.statement is st)


def _schedules(band: isl.ScheduleNode, names: frozenset[str]) -> bool:
    """Whether ``band`` schedules one of the statements ``names``."""
    found: list[bool] = []
    band.get_domain().foreach_set(lambda s: found.append(s.get_tuple_name() in names))
    return any(found)


def _untiled(options: MappingOptions) -> MappingOptions:
    """``options`` for a nest of other statements than the one its tiles and orders were
    made for (their members would be another statement's, position by position: a
    convolution's copy of its result into the output's layout would take the sum's
    tiles and put a strided index innermost): loops in the statement's own order."""
    return replace(options, tile_sizes=(), register_tile=(), tile_order=(), point_order=())


def row_schedule(model: Model, validity: isl.UnionMap) -> isl.Schedule | None:
    """The statements in one nest over the longest prefix of left-hand side indices they
    all have, over the same rows, and no dependence crosses (distinct rows never touch
    the same data),
    then in program order, each in its own nest of its other indices in order: softmax's
    max, exponentials, sum and quotients per row. None where no such prefix exists, or
    one statement (nothing to fuse)."""
    infos = sorted(model.statements.values(), key=lambda i: 2 * i.index + (0 if i.init else 1))
    if len(infos) < 2:
        return None
    prefix = min(len(i.statement.indices) for i in infos)
    while prefix and not _rows_apart(model, infos, prefix):
        prefix -= 1
    if not prefix or not validity.is_subset(_lex_order(model, infos, prefix)):
        return None
    space = model.param_space()

    def band(parts: list[str]) -> isl.MultiUnionPwAff:
        return isl.MultiUnionPwAff.from_union_map(isl.UnionMap.read_from_str(model.ctx, f"{space} -> {{ {'; '.join(parts)} }}"))

    node = isl.Schedule.from_domain(model.domain).get_root().child(0)
    node = node.insert_partial_schedule(band([_dims(i, range(prefix)) for i in infos])).band_set_permutable(1)
    for j in range(prefix):
        node = node.band_member_set_coincident(j, 1)
    filters = isl.UnionSetList.alloc(model.ctx, len(infos))
    for i in infos:
        filters = filters.add(model.domain.intersect(isl.UnionSet.read_from_str(
            model.ctx, f"{space} -> {{ {i.name}[{', '.join(f't{j}' for j in range(len(i.iterators)))}] }}")))
    node = node.child(0).insert_sequence(filters)
    for k, i in enumerate(infos):
        rest = range(prefix, len(i.iterators))
        if rest:
            inner = node.child(k).child(0).insert_partial_schedule(band([_dims(i, rest)]))
            for j in range(len(rest)):
                inner = inner.band_member_set_coincident(j, int(not member_carries_dependence(model, inner, j)))
            node = inner.parent().parent()
    return node.get_schedule()


def _dims(info: StatementInfo, dims: range) -> str:
    tup = ", ".join(f"t{j}" for j in range(len(info.iterators)))
    return f"{info.name}[{tup}] -> [{', '.join(f't{j}' for j in dims)}]"


def _rows_apart(model: Model, infos: list[StatementInfo], prefix: int) -> bool:
    """Whether the first ``prefix`` indices of every statement range over the same rows
    and every dependence stays within one row."""
    maps = [isl.UnionMap.read_from_str(model.ctx, f"{model.param_space()} -> {{ {_dims(i, range(prefix))} }}")
            for i in infos]
    rows = [isl.Set.from_union_set(model.domain.apply(m)).gist_params(model.context()) for m in maps]
    if any(not r.is_equal(rows[0]) for r in rows[1:]):
        return False
    together = maps[0]
    for m in maps[1:]:
        together = together.union(m)
    deps = model.dependences.apply_domain(together).apply_range(together)
    return deps.is_subset(deps.domain().identity())


def _lex_order(model: Model, infos: list[StatementInfo], prefix: int) -> isl.UnionMap:
    """Pairs of instances in the order :func:`row_schedule` runs them."""
    depth = max(len(i.iterators) for i in infos)
    parts = []
    for position, i in enumerate(infos):
        tup = ", ".join(f"t{j}" for j in range(len(i.iterators)))
        time = [f"t{j}" for j in range(prefix)] + [str(position)] + \
            [f"t{j}" for j in range(prefix, len(i.iterators))] + ["0"] * (depth - len(i.iterators))
        parts.append(f"{i.name}[{tup}] -> [{', '.join(time)}]")
    smap = isl.UnionMap.read_from_str(model.ctx, f"{model.param_space()} -> {{ {'; '.join(parts)} }}")
    return smap.lex_lt_union_map(smap)


def _mark_inner_threads(node: isl.ScheduleNode, marked: bool = False, split: bool = False) -> isl.ScheduleNode:
    """Mark the coincident members (the innermost three) of every band below a sequence
    below a GPU mark for threads: a row pipeline's per-statement nests. Returns the node
    at the same position."""
    kind = node.get_type()
    if kind == isl.schedule_node_type.band and marked and split:
        members = _coincident(node)
        return _mark_members(node, GPU_THREAD_MARK, members[-3:]).parent() if members else node
    if kind == isl.schedule_node_type.mark:
        marked = marked or node.mark_get_id().get_name().startswith((GPU_BLOCK_MARK, GPU_THREAD_MARK))
    split = split or (marked and kind == isl.schedule_node_type.sequence)
    for k in range(node.n_children()):
        node = _mark_inner_threads(node.child(k), marked, split).parent()
    return node


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
    big = SYMBOLIC_MAX + 1  # size 0, "do not tile" this member: one tile covers it
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
