"""A compiled plan run step by step from Python, where no program runs it whole (the
reference target, code a program cannot hold): each kernel called on its own, views
made by numpy, loops and branches (:class:`~polyfuse.ir.plan.LoopStep`,
:class:`~polyfuse.ir.plan.BranchStep`) interpreted here with what the native program
does (see :mod:`polyfuse.runtime.program`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from polyfuse.ir.control import trip_count
from polyfuse.ir.plan import BranchStep, LoopStep, Plan, Step, ViewStep
from polyfuse.ir.steps import leaves
from polyfuse.runtime.program import CompiledKernel, CompiledPlan


def run_steps(compiled: CompiledPlan, env: dict[str, Any], times: np.ndarray | None = None) -> None:
    """Run the plan's steps on ``env`` (values by name; the plan's constants added),
    adding what they define; ``times`` (one per kernel or view step, in
    :func:`~polyfuse.ir.steps.leaves` order) accumulates each one's seconds."""
    plan = compiled.plan
    env.update(plan.constants)
    position = {id(st): k for k, st in enumerate(leaves(plan.steps))}

    def run(steps: tuple[Step, ...]) -> None:
        for st in steps:
            if isinstance(st, LoopStep):
                _loop(plan, st, env, run)
            elif isinstance(st, BranchStep):
                block = st.then if bool(np.asarray(env[st.cond]).reshape(-1)[0]) else st.other
                run(block.steps)
                for name, result in zip(st.outputs, block.results):
                    env[name] = np.array(env[result], copy=True)
            else:
                k = position[id(st)]
                start = time.perf_counter()
                _run_leaf(st, compiled.kernels[k], env)
                if times is not None:
                    times[k] += time.perf_counter() - start
    run(plan.steps)


def _run_leaf(st: Step, kernel: CompiledKernel | None, env: dict[str, Any]) -> None:
    """Run one kernel or view step on ``env`` (values by name), adding what it defines."""
    if isinstance(st, ViewStep):
        size = int(np.prod(st.shape))
        env[st.output] = env[st.input].reshape(-1)[st.offset:st.offset + size].reshape(st.shape)
        return
    assert kernel is not None
    d = st.definition
    produced = kernel.run({p.name: env[n] for p, n in zip(d.params, st.inputs)})
    for name, t in zip(st.outputs, d.outputs):
        env[name] = produced[t.name]


def _loop(plan: Plan, st: LoopStep, env: dict[str, Any], run: Any) -> None:
    """Run a loop step: the body until the trip count or a false condition; the
    carried values copied back after each iteration, the scan values into their rows."""
    def copy(name: str, value: Any) -> np.ndarray:
        return np.array(value, dtype=plan.types[name].dtype.numpy, copy=True).reshape(plan.types[name].shape)

    limit = trip_count(env[st.trip]) if st.trip else None
    env[st.going] = copy(st.going, env[st.cond] if st.cond else True)
    for name, init in zip(st.carried, st.initial):
        env[name] = copy(name, env[init])
    for name in st.stacked:
        env[name] = np.empty(plan.types[name].shape, plan.types[name].dtype.numpy)
    k = 0
    while bool(env[st.going]) and (limit is None or k < limit):
        env[st.counter] = copy(st.counter, k)
        run(st.body.steps)
        for name, scan in zip(st.stacked, st.scans):
            env[name][k] = env[scan]
        values = [copy(name, env[r]) for name, r in zip((st.going, *st.carried), (st.next_cond, *st.results))]
        env.update(zip((st.going, *st.carried), values))
        k += 1
    env[st.counter] = copy(st.counter, k)

