"""The scheduler in one function per kind of target: definition + sizes + options ->
loop kernel (CPUs) or GPU kernel (CUDA)."""

from __future__ import annotations

from dataclasses import replace

from polyfuse.ir.comprehension import Definition
from polyfuse.ir.gpu import GpuKernel
from polyfuse.ir.loops import LoopKernel
from polyfuse.ir.loops_verify import verify_kernel
from polyfuse.lowering.promote_accumulators import promote_accumulators
from polyfuse.lowering.unroll_jam import unroll_and_jam
from polyfuse.scheduler.ast_lowering import lower_schedule
from polyfuse.scheduler.bounds import check_accesses
from polyfuse.scheduler.gpu_barriers import place_barriers
from polyfuse.scheduler.gpu_mapping import DeviceLimits, map_to_gpu, shared_budget
from polyfuse.scheduler.gpu_promotion import promote_to_shared
from polyfuse.scheduler.model import build_model
from polyfuse.scheduler.options import MappingOptions
from polyfuse.scheduler.schedule import compute_schedule


def schedule_definition(d: Definition, sizes: dict[str, int], options: MappingOptions,
                        stages: dict[str, str] | None = None) -> LoopKernel:
    """Model, schedule, tile and lower ``d`` for concrete ``sizes``.

    ``stages`` (if given) receives the text of the isl schedule tree and the loop IR.
    Accesses not proven inside their tensors are refused or checked at run time
    (:mod:`polyfuse.scheduler.bounds`).
    """
    model = build_model(check_accesses(d, sizes))
    schedule = compute_schedule(model, options, sizes)
    kernel = lower_schedule(model, schedule, sizes, options)
    kernel = promote_accumulators(unroll_and_jam(kernel, options.unroll_jam))
    verify_kernel(kernel)
    if stages is not None:
        stages["schedule"] = str(schedule)
        stages["loops"] = str(kernel)
    return kernel


def schedule_gpu_definition(d: Definition, sizes: dict[str, int], options: MappingOptions,
                            limits: DeviceLimits, stages: dict[str, str] | None = None) -> GpuKernel:
    """Model, schedule with block and thread marks, lower, keep accumulators in registers,
    map onto launches, promote reused input boxes to shared memory, place barriers.

    ``stages`` (if given) receives the schedule tree, the loop IR and the GPU kernel.
    """
    model = build_model(check_accesses(d, sizes))
    schedule = compute_schedule(model, options, sizes, gpu=True)
    kernel = lower_schedule(model, schedule, sizes, replace(options, vector_width=1))
    if options.use_private_memory:
        kernel = promote_accumulators(kernel)
    verify_kernel(kernel)
    gpu = map_to_gpu(kernel, options, limits)
    if options.use_shared_memory:
        gpu = promote_to_shared(gpu, shared_budget(options, limits))
    gpu = place_barriers(gpu)
    if stages is not None:
        stages["schedule"] = str(schedule)
        stages["loops"] = str(kernel)
        stages["gpu"] = str(gpu)
    return gpu
