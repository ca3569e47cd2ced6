"""Loop-IR passes: pure functions loop kernel -> loop kernel, one per module, run by the
scheduler's pipeline through :class:`LoopPassManager` after the isl AST is lowered.

* :func:`separate_full_tiles` (``separate_tiles.py``): full tiles split from partial ones,
  so their inner loops have constant bounds;
* :func:`use_matrix_tiles` (``matrix_tiles.py``): a product of dot-product words put on
  a CPU's matrix tiles (AMX), block by block, where the target has them;
* :func:`unroll_and_jam` (``unroll_and_jam.py``): register blocking of the loop right
  around the innermost one;
* :func:`promote_accumulators` (``promote_accumulators.py``): reductions kept in locals;
* :func:`promote_register_blocks` (``register_blocks.py``): a register block's
  accumulators kept in a ``local`` array across its reduction;
* :func:`fuse_epilogues` (``epilogues.py``): a contraction's pointwise consumer applied
  in its register blocks' stores;
* :func:`drop_dead_stores` (``dead_stores.py``): stores to outputs the caller discards
  and the kernel never reads back, dropped;
* :func:`pack_operands` (``pack_operands.py``): a micro-kernel's vector operand copied
  into contiguous panels (a ``local`` buffer per thread), the last one zero-padded;
* :func:`widen_partial_blocks` (``widen_blocks.py``): a partial register block run in
  whole vectors over such panels.

Passes import only :mod:`polyfuse.ir` (``tests/test_layering.py`` checks): what one needs
from the scheduler (a heuristic's threshold) is an argument the pipeline gives. Each walks
the kernel with the loop IR's walkers, never by its own recursion over loop bodies:
:class:`~polyfuse.ir.loops.LoopRewriter` (with the scope of each statement: enclosing
loops, known ranges, guards), :func:`~polyfuse.ir.loops.walk_scoped`,
:func:`~polyfuse.ir.loops.walk_stmts`, :func:`~polyfuse.ir.loops.fold_stmts` or
:func:`~polyfuse.ir.loops.rewrite`; :func:`~polyfuse.ir.loops.perfect_nest` gives the loops
of a perfect nest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from polyfuse.ir.loops import LoopKernel
from polyfuse.ir.loops_verify import verify_kernel
from polyfuse.ir.passes import Pass, PassManager
from polyfuse.scheduler.loop_passes.dead_stores import drop_dead_stores
from polyfuse.scheduler.loop_passes.epilogues import fuse_epilogues
from polyfuse.scheduler.loop_passes.pack_operands import pack_operands
from polyfuse.scheduler.loop_passes.promote_accumulators import promote_accumulators
from polyfuse.scheduler.loop_passes.register_blocks import promote_register_blocks
from polyfuse.scheduler.loop_passes.separate_tiles import separate_full_tiles
from polyfuse.scheduler.loop_passes.matrix_tiles import use_matrix_tiles
from polyfuse.scheduler.loop_passes.unroll_and_jam import unroll_and_jam
from polyfuse.scheduler.loop_passes.widen_blocks import widen_partial_blocks

LoopPass = Callable[[LoopKernel], LoopKernel]

__all__ = ["LoopPass", "LoopPassManager", "Pass", "drop_dead_stores", "fuse_epilogues", "pack_operands", "promote_accumulators",
           "promote_register_blocks", "separate_full_tiles",
           "unroll_and_jam", "use_matrix_tiles", "widen_partial_blocks"]


class LoopPassManager(PassManager[LoopKernel]):
    """Runs loop passes, verifying the kernel after each with ``verify_kernel``."""

    level: ClassVar[str] = "loop"
    unit: ClassVar[str] = "kernel"

    def check(self, ir: LoopKernel) -> None:
        verify_kernel(ir)
