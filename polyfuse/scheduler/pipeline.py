"""The scheduler in one function: definition + sizes + options -> loop kernel."""

from __future__ import annotations

from polyfuse.ir.comprehension import Definition
from polyfuse.ir.loops import LoopKernel
from polyfuse.ir.loops_verify import verify_kernel
from polyfuse.lowering.promote_accumulators import promote_accumulators
from polyfuse.lowering.unroll_jam import unroll_and_jam
from polyfuse.scheduler.ast_lowering import lower_schedule
from polyfuse.scheduler.model import build_model
from polyfuse.scheduler.options import MappingOptions
from polyfuse.scheduler.schedule import compute_schedule


def schedule_definition(d: Definition, sizes: dict[str, int], options: MappingOptions,
                        stages: dict[str, str] | None = None) -> LoopKernel:
    """Model, schedule, tile and lower ``d`` for concrete ``sizes``.

    ``stages`` (if given) receives the text of the isl schedule tree and the loop IR.
    """
    model = build_model(d)
    schedule = compute_schedule(model, options, sizes)
    kernel = lower_schedule(model, schedule, sizes, options)
    kernel = promote_accumulators(unroll_and_jam(kernel, options.unroll_jam))
    verify_kernel(kernel)
    if stages is not None:
        stages["schedule"] = str(schedule)
        stages["loops"] = str(kernel)
    return kernel
