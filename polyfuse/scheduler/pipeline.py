"""The scheduler in one function per kind of target: definition + sizes + options ->
loop kernel (CPUs) or GPU kernel (CUDA)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from polyfuse.ir.affine import Affine
from polyfuse.ir.comprehension import Definition, Read, walk
from polyfuse.ir.gpu import GpuKernel
from polyfuse.ir.loops import BufferRole, LoopKernel
from polyfuse.ir.loops_verify import verify_kernel
from polyfuse.ir.machine import DEFAULT_MACHINE, Machine
from polyfuse.ir.passes import IR, Pass, PassManager
from polyfuse.scheduler.ast_lowering import lower_schedule
from polyfuse.scheduler.bounds import affine_in, check_accesses, in_bounds, value
from polyfuse.scheduler.gpu_barriers import place_barriers
from polyfuse.scheduler.gpu_epilogues import fuse_epilogues as fuse_gpu_epilogues
from polyfuse.scheduler.gpu_launches import fuse_launches
from polyfuse.scheduler.gpu_mapping import DeviceLimits, map_to_gpu, shared_budget
from polyfuse.scheduler.gpu_matrix_units import use_matrix_units
from polyfuse.scheduler.gpu_pipeline import pipeline_copies
from polyfuse.scheduler.gpu_reciprocals import hoist_reciprocals
from polyfuse.scheduler.gpu_split import split_options, split_reductions
from polyfuse.scheduler.gpu_promotion import promote_to_shared
from polyfuse.scheduler.heuristics import PACK_MIN_REUSE, WHOLE_BYTES
from polyfuse.scheduler.loop_passes import (LoopPass, LoopPassManager, drop_dead_stores, fuse_epilogues,
                                            pack_operands, promote_accumulators, promote_register_blocks,
                                            separate_full_tiles, unroll_and_jam, use_matrix_tiles,
                                            widen_partial_blocks)
from polyfuse.scheduler.model import build_model, covers, first_writers, skipped_inits, zero_filled_outputs
from polyfuse.scheduler.options import MappingOptions
from polyfuse.scheduler.schedule import compute_schedule
from polyfuse.scheduler.symbolic_facts import Facts

GpuPass = Callable[[GpuKernel], GpuKernel]


@dataclass(frozen=True)
class Usage:
    """What a kernel's caller (a model's plan) promises about its tensors: ``constants``,
    parameters with the same values on every call (weights: their panels packed once,
    ahead of time, by :func:`~polyfuse.scheduler.loop_passes.pack_operands`);
    ``discarded``, outputs it never reads (a fusion group's intermediates: stores to them
    that the kernel does not read back are dropped, see
    :func:`~polyfuse.scheduler.loop_passes.drop_dead_stores`). A TC caller, which gets
    every output back, promises nothing."""

    constants: frozenset[str] = frozenset()
    discarded: frozenset[str] = frozenset()
    precision: str = "ieee"   # "tf32": float32 products may round their operands to TF32

    def key(self) -> str:
        """A text that identifies the promises (for cache keys: the same in every process)."""
        return repr((sorted(self.constants), sorted(self.discarded), self.precision))


def cpu_loop_passes(options: MappingOptions, zeroed: frozenset[str] = frozenset(),
                    initialized: set[str] | None = None, whole: frozenset[str] = frozenset(),
                    usage: Usage = Usage(), tiles: frozenset[str] = frozenset(),
                    machine: Machine = DEFAULT_MACHINE) -> tuple[LoopPass, ...]:
    """The loop passes of a CPU kernel, in order (``zeroed`` and ``initialized`` as
    :func:`~polyfuse.scheduler.loop_passes.promote_register_blocks` takes them, ``whole``
    as :func:`~polyfuse.scheduler.loop_passes.fuse_epilogues`; ``usage`` says which inputs
    to pack ahead of time and which outputs need no stores; ``tiles`` names the dot
    products the target's matrix tiles sum, which
    :func:`~polyfuse.scheduler.loop_passes.use_matrix_tiles` puts on them; ``machine``
    sizes the packed boxes and says what a cache line is)."""
    matrix = (Pass("use_matrix_tiles", lambda k: use_matrix_tiles(k, tiles, usage.constants)),) if tiles else ()
    separate = Pass("separate_full_tiles", lambda k: separate_full_tiles(k, Facts()))
    return (separate, *matrix, Pass("unroll_and_jam", lambda k: unroll_and_jam(k, options.unroll_jam)),
            promote_accumulators,
            Pass("promote_register_blocks", lambda k: promote_register_blocks(k, zeroed, initialized)),
            Pass("fuse_epilogues", lambda k: fuse_epilogues(k, whole)),
            Pass("drop_dead_stores", lambda k: drop_dead_stores(k, usage.discarded)),
            Pass("pack_operands", lambda k: pack_operands(k, usage.constants, min_reuse=PACK_MIN_REUSE,
                                                          box_bytes=WHOLE_BYTES,
                                                          line_bytes=machine.line_bytes)),
            widen_partial_blocks)


def written_whole(d: Definition) -> frozenset[str]:
    """Tensors one statement writes, every element of them (distinct indices whose ranges
    cover the shape)."""
    writers = Counter(st.tensor for st in d.statements)
    return frozenset(st.tensor for st in d.statements if writers[st.tensor] == 1
                     and len(set(st.indices)) == len(st.indices) and covers(st, d.tensor(st.tensor).shape))


def zero_started(d: Definition) -> frozenset[str]:
    """Tensors written by one statement alone, a ``+=!`` whose init the runtime's zeros
    replace (:func:`~polyfuse.scheduler.model.skipped_inits`)."""
    writers = Counter(st.tensor for st in d.statements)
    return frozenset(d.statements[k].tensor for k in skipped_inits(d) if writers[d.statements[k].tensor] == 1)


def gpu_loop_passes(options: MappingOptions) -> tuple[LoopPass, ...]:
    """The loop passes of a GPU kernel before it is mapped onto launches."""
    return (promote_accumulators,) if options.use_private_memory else ()


def gpu_passes(options: MappingOptions, limits: DeviceLimits, precision: str = "ieee") -> tuple[GpuPass, ...]:
    """The passes of a GPU kernel after it is mapped onto launches (``precision`` as
    :func:`~polyfuse.scheduler.gpu_matrix_units.use_matrix_units` takes it)."""
    shared = Pass("promote_to_shared", lambda g: promote_to_shared(g, shared_budget(options, limits)))
    pipeline = Pass("pipeline_copies",
                    lambda g: pipeline_copies(g, options.stages, shared_budget(options, limits), limits.arch))
    return (fuse_gpu_epilogues, fuse_launches) + ((shared,) if options.use_shared_memory else ()) + \
        (hoist_reciprocals, place_barriers) + \
        ((pipeline,) if options.use_shared_memory and options.stages > 1 else ()) + \
        ((Pass("use_matrix_units", lambda g: use_matrix_units(g, precision, limits.arch)),)
         if options.use_private_memory and options.use_shared_memory else ())


class GpuPassManager(PassManager[GpuKernel]):
    level: ClassVar[str] = "gpu"
    unit: ClassVar[str] = "kernel"


def run_loop_passes(kernel: LoopKernel, passes: Sequence[LoopPass],
                    stages: dict[str, str] | None) -> LoopKernel:
    """Run ``passes`` on ``kernel``, verified after each; ``stages`` (if given) receives
    the loop IR as lowered (``loops:lower_schedule``), after each pass
    (``loops:<pass name>``) and at the end (``loops``, what the target gets)."""
    verify_kernel(kernel)
    manager = LoopPassManager(passes, verify=True, keep=stages is not None,
                              input_name="lower_schedule")
    return _run(manager, kernel, stages, "loops")


def _run(manager: PassManager[IR], ir: IR, stages: dict[str, str] | None, stage: str) -> IR:
    ir = manager.run(ir)
    if stages is not None:
        stages.update((f"{stage}:{name}", text) for name, text in manager.dumps)
        stages[stage] = str(ir)
    return ir


def symbolic_signature(d: Definition, sizes: dict[str, int], symbolic: frozenset[str]) -> str:
    """What a kernel of ``d`` compiled for the ``symbolic`` sizes depends on at ``sizes``:
    the other sizes' values, the reads :func:`~polyfuse.scheduler.bounds.check_accesses`
    leaves to run-time checks, and the outputs the runtime must zero. Two sizes with the
    same signature run the same code (the symbolic sizes from 1 to
    :data:`~polyfuse.scheduler.model.SYMBOLIC_MAX`)."""
    return _signature(sizes, symbolic, _checked(d, sizes), zero_filled_outputs(d, sizes))


def _checked(d: Definition, sizes: dict[str, int]) -> tuple[tuple[int, ...], ...]:
    """Each read's checked dimensions at ``sizes``, in order."""
    return tuple(r.checked for st in check_accesses(d, sizes).statements for r in walk(st.rhs)
                 if isinstance(r, Read))


def _signature(sizes: dict[str, int], symbolic: frozenset[str], checked: tuple[tuple[int, ...], ...],
               zeroed: Iterable[str]) -> str:
    return repr((sorted((n, v) for n, v in sizes.items() if n not in symbolic), sorted(symbolic),
                 checked, sorted(zeroed)))


class SymbolicSignatures:
    """:func:`symbolic_signature` of one definition, cheaper at each new size: sizes that
    meet the definition's :func:`~polyfuse.scheduler.bounds.in_bounds` conditions (for
    its other sizes' values) have every access proven without a check, as at the first
    such sizes, so only the conditions and which outputs need zeros are evaluated again
    (as affine forms of the sizes, where the writers' ranges and shapes are)."""

    def __init__(self, d: Definition, symbolic: frozenset[str]) -> None:
        self.d = d
        self.symbolic = symbolic
        # per value of the other sizes: the conditions, the checks where they hold, and
        # the forms telling which outputs need zeros
        self._proven: dict[tuple[tuple[str, int], ...], tuple[tuple[Affine, ...] | None, list, _Fills | None]] = {}
        self._unchecked = all(not r.checked for st in d.statements for r in walk(st.rhs)
                              if isinstance(r, Read))

    def _entry(self, sizes: dict[str, int]) -> tuple[tuple[Affine, ...] | None, list, _Fills | None]:
        fixed = tuple(sorted((n, v) for n, v in sizes.items() if n not in self.symbolic))
        entry = self._proven.get(fixed)
        if entry is None:
            conditions = in_bounds(self.d, sizes, self.symbolic) if self._unchecked else None
            entry = self._proven[fixed] = (conditions, [], _fills(self.d, sizes, self.symbolic))
        return entry

    def forms(self, sizes: dict[str, int]) -> tuple[tuple[Affine, ...], _Fills] | None:
        """At the values of ``sizes``' other sizes: the affine forms of the symbolic sizes
        that, all >= 0, make the signature that of the sizes' checks and zeroed outputs
        alone; and per output its first writer's forms (as ``__call__`` reads them). None
        where some is not affine."""
        conditions, _, fills = self._entry(sizes)
        return None if conditions is None or fills is None else (conditions, fills)

    def __call__(self, sizes: dict[str, int]) -> str:
        conditions, checked, fills = self._entry(sizes)
        if conditions is None or fills is None or not all(value(f, sizes) >= 0 for f in conditions):
            return symbolic_signature(self.d, sizes, self.symbolic)
        if not checked:
            checked.append(_checked(self.d, sizes))
        zeroed = (t for t, always, covers in fills
                  if always or not all(value(lo, sizes) <= 0 and value(hi, sizes) >= value(dim, sizes)
                                       for lo, hi, dim in covers))
        return _signature(sizes, self.symbolic, checked[0], zeroed)


# per output's first writer: the output, whether it is zeroed whatever the sizes, and
# the forms of each index's range and the dimension it must cover (zero_filled_outputs)
_Fills = list[tuple[str, bool, list[tuple[Affine, Affine, Affine]]]]


def _fills(d: Definition, sizes: dict[str, int], symbolic: frozenset[str]) -> _Fills | None:
    """:func:`~polyfuse.scheduler.model.zero_filled_outputs` as forms of the symbolic
    sizes, or None where a range or shape is not affine in them."""
    out: _Fills = []
    for st, relies in first_writers(d):
        covers = []
        for i, dim in zip(st.indices, d.tensor(st.tensor).shape):
            lo, hi, extent = (affine_in(e, sizes, symbolic) for e in (st.range_of(i).lo, st.range_of(i).hi, dim))
            if lo is None or hi is None or extent is None:
                return None
            covers.append((lo, hi, extent))
        out.append((st.tensor, relies, covers))
    return out


def schedule_definition(d: Definition, sizes: dict[str, int], options: MappingOptions,
                        stages: dict[str, str] | None = None,
                        initialized: set[str] | None = None, usage: Usage = Usage(),
                        tiles: frozenset[str] = frozenset(), machine: Machine = DEFAULT_MACHINE,
                        symbolic: frozenset[str] = frozenset()) -> LoopKernel:
    """Model, schedule, tile and lower ``d`` for concrete ``sizes`` on ``machine``; sizes
    named in ``symbolic`` stay parameters of the kernel (it runs at any of their values
    for which :func:`symbolic_signature` is the same).

    ``stages`` (if given) receives the text of the isl schedule tree and the loop IR.
    Accesses not proven inside their tensors are refused or checked at run time
    (:mod:`polyfuse.scheduler.bounds`). ``initialized`` (if given) receives the outputs
    the kernel starts at zero itself, which the runtime then need not fill. ``usage``
    says what the caller promises (:class:`Usage`): weights whose panels are packed once,
    before the kernel runs (packed input buffers), and outputs it never reads. ``tiles``:
    the dot products the target's matrix tiles sum (AMX's), see :func:`cpu_loop_passes`.
    """
    model = build_model(check_accesses(d, sizes))
    schedule = compute_schedule(model, options, sizes)
    if stages is not None:
        stages["schedule"] = str(schedule)
    kernel = lower_schedule(model, schedule, sizes, options, symbolic)
    return run_loop_passes(kernel, cpu_loop_passes(options, zero_started(d), initialized, written_whole(d),
                                                    usage, tiles, machine), stages)


def schedule_gpu_definition(d: Definition, sizes: dict[str, int], options: MappingOptions,
                            limits: DeviceLimits, stages: dict[str, str] | None = None,
                            initialized: set[str] | None = None, precision: str = "ieee") -> GpuKernel:
    """Model, schedule with block and thread marks, lower, keep accumulators in registers,
    map onto launches, promote reused input boxes to shared memory, place barriers.

    ``stages`` (if given) receives the schedule tree, the loop IR and the GPU kernel, each
    after every pass (``gpu:map_to_gpu``, ``gpu:<pass name>``, ``gpu``). ``initialized``
    (if given) receives the outputs the kernel starts at zero itself, which the runtime
    then need not fill. ``precision="tf32"`` lets float32 contractions run on the matrix
    units, their operands rounded to TF32 (bfloat16 and float16 ones always do).

    With ``options.split_k`` > 1 the sums it can split run in slices on more blocks
    (:mod:`polyfuse.scheduler.gpu_split`), their partial sums in scratch buffers
    (``TEMP``, after the outputs) that the kernel fills whole: where the mapping would
    leave one to the runtime's zeros, the definition is scheduled unsplit.
    """
    split, scratch, position = split_reductions(d, sizes, options.split_k)
    if not scratch:
        return _schedule_gpu(d, sizes, options, limits, stages, initialized, precision)
    started: set[str] = set()
    tried: dict[str, str] | None = None if stages is None else {}
    kernel = _schedule_gpu(split, sizes, split_options(options, position), limits, tried, started, precision)
    if set(scratch) & (zero_filled_outputs(split, sizes) - started):
        return _schedule_gpu(d, sizes, replace(options, split_k=1), limits, stages, initialized, precision)
    if initialized is not None:
        initialized |= started - set(scratch)
    temp = tuple(replace(b, role=BufferRole.TEMP) for b in kernel.buffers if b.name in scratch)
    rest = [b for b in kernel.buffers if b.name not in scratch]
    last = max((k for k, b in enumerate(rest) if b.role is BufferRole.OUT), default=-1) + 1
    kernel = replace(kernel, buffers=(*rest[:last], *temp, *rest[last:]))
    if stages is not None and tried is not None:
        stages.update(tried, gpu=str(kernel))
    return kernel


def _schedule_gpu(d: Definition, sizes: dict[str, int], options: MappingOptions, limits: DeviceLimits,
                  stages: dict[str, str] | None, initialized: set[str] | None, precision: str) -> GpuKernel:
    model = build_model(check_accesses(d, sizes))
    schedule = compute_schedule(model, options, sizes, gpu=True)
    if stages is not None:
        stages["schedule"] = str(schedule)
    kernel = lower_schedule(model, schedule, sizes, replace(options, vector_width=1))
    kernel = run_loop_passes(kernel, gpu_loop_passes(options), stages)
    manager = GpuPassManager(gpu_passes(options, limits, precision), keep=stages is not None,
                             input_name="map_to_gpu")
    return _run(manager, map_to_gpu(kernel, options, limits, zero_started(d), initialized), stages, "gpu")
