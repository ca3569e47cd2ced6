"""A plan template's program at a new shape, laid out without instantiating the plan.

:meth:`PlanTemplate.instantiate <polyfuse.runtime.plan_template.PlanTemplate.instantiate>`
makes the whole plan at a new shape: its buffers' types, its steps with each kernel's
definition bound to its sizes, the memory plan, then the program's layout from them. A
decoding step pays that on every token (the past grows by one). What runs is only the
layout (:class:`~polyfuse.runtime.program.ProgramLayout`): where each argument of each
call lives, the sizes each symbolic kernel gets, the bytes to zero, the outputs'
shapes. :class:`TemplateProgram` keeps the template's base layout and, at new sizes,
changes only those numbers:

* **Memory**: the arena's values placed first-fit by liveness, as the planner places
  them (:func:`~polyfuse.ir.plan.plan_memory`), the liveness computed once: only the
  values' bytes change.
* **Kernels**: a symbolic kernel runs code compiled before
  (:meth:`~polyfuse.runtime.kernel.Kernel.compiled_at`) where its sizes agree with its
  input buffers, its outputs have the buffers' types and its accesses check as at a size
  it ran at. Where none is compiled (a size outside the symbolic range, accesses that
  check differently), the call instantiates the plan instead, and compiles.
* **Views** read inside their sources; every buffer's size is checked against the
  tensor limit, and every expression stays in its bucket, as when instantiating.

The plan and kernels of the instance (what ``dump``, ``profile`` and bundles read) are
instantiated when first read (:class:`TemplatedPlan`), with the memory plan its program runs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from polyfuse.errors import IRVerificationError, ShapeError
from polyfuse.ir.comprehension import Binary, BinaryOp, Expr, Literal, SizeVar, TensorDecl, Unary, UnaryOp
from polyfuse.ir.limits import check_tensor_size, max_tensor_bytes
from polyfuse.ir.graph import TensorType
from polyfuse.ir.plan import MemoryPlan, aligned, check_view, first_fit
from polyfuse.ir.sizes import sizes_of_shapes
from polyfuse.ir.steps import KernelStep, ViewStep, live_ranges, view_roots
from polyfuse.ir.symbolic import evaluate_int
from polyfuse.runtime.generalize import evaluate
from polyfuse.runtime.instructions import Run
from polyfuse.runtime.program import ARENA, CONSTANT, Call, CompiledPlan, ProgramLayout, Tensor

ALIGNMENT = 64   # a value's start in the arena (plan_memory's block alignment)


@dataclass(frozen=True)
class _KernelCall:
    """A call of the layout whose kernel is compiled for symbolic sizes: its step and the
    template's expression of each size it is given."""

    call: int
    step: KernelStep
    kernel: Any                       # the Kernel (polyfuse.runtime.kernel)
    given: Mapping[str, Any]          # size name -> slot of the template
    base: Mapping[str, int]           # ... its values in the base plan
    proven: bool = False              # its shapes are its buffers' at every size (agree)


class TemplateProgram:
    """A plan template's base layout and how its numbers change with the sizes (see the
    module docstring)."""

    def __init__(self, template: Any, layout: ProgramLayout) -> None:
        self.template = template
        self.layout = layout
        plan = template.base.plan
        self.plan = plan
        self.itemsize = {v: t.dtype.bits // 8 for v, t in plan.types.items()}
        self.shapes = {v: tuple(int(d) for d in t.shape) for v, t in plan.types.items()}   # the base's
        self.nbytes = {v: math.prod(shape) * self.itemsize[v] for v, shape in self.shapes.items()}
        self.roots, _ = view_roots(plan.steps, self.itemsize)
        kept = {self.roots.get(v, v) for v in plan.outputs}
        laid, span = live_ranges(plan.steps, self.roots)
        self.allocated = [v for ev in laid for v in ev.allocates]
        self.defined = [[v for v in ev.allocates if v not in kept] for ev in laid]   # per event
        self.last = {v: span[v][1] for vs in self.defined for v in vs}
        self.views = [(index, st) for index, st in enumerate(plan.steps) if isinstance(st, ViewStep)]
        self.outputs = set(plan.outputs)
        self.slot_values = [self.roots.get(name, name) for name, how, _ in layout.results if how == "slot"]
        calls: list[_KernelCall] = []
        kernel_steps = [(index, st) for index, st in enumerate(plan.steps) if isinstance(st, KernelStep)]
        for call, (index, st) in enumerate(kernel_steps):   # (a layout's calls: the kernel steps, in order)
            g = template.base.generics[index]
            if index in template.sizes:
                assert g is not None   # (a step with sizes has a symbolic kernel)
                c = _KernelCall(call, st, g.kernel, template.sizes[index], template.base_sizes[index])
                calls.append(replace(c, proven=self._agree(c)))
        self.symbolic = calls
        self.recipes = [self._recipe(call) for call in layout.calls]

    def _agree(self, c: _KernelCall) -> bool:
        """Whether the kernel's tensor shapes at the template's sizes for it are its
        buffers' types at every value of the template's sizes: both sides polynomials
        (of degree D at most) that agree on a grid of D + 1 values per size, which
        proves them equal. Then a call need not bind the kernel's sizes to its buffers."""
        d = c.kernel.definition
        pairs = [(e, slot) for p, name in zip(d.params, c.step.inputs) if isinstance(p, TensorDecl)
                 for e, slot in zip(p.shape, self.template.types.get(name, self.shapes[name]))]
        pairs += [(e, slot) for t, name in zip(d.outputs, c.step.defines)
                  for e, slot in zip(t.shape, self.template.types.get(name, self.shapes[name]))]
        if not set(d.sizes) <= set(c.given) or len(d.params) != len(c.step.inputs) \
                or len(d.outputs) != len(c.step.defines):
            return False
        inner = max([_degree(e) for e in c.given.values()] + [1])
        outer = [_expr_degree(e) for e, _ in pairs]
        if any(k is None for k in outer):
            return False
        bound = max([k * inner for k in outer] + [_degree(slot) for _, slot in pairs] + [1])  # type: ignore[operator]
        count = len(self.template.buckets)
        if (bound + 1) ** count > 4096:
            return False
        for values in itertools.product(range(2, bound + 3), repeat=count):
            sizes = {n: evaluate(e, list(values)) for n, e in c.given.items()}
            if any(evaluate_int(e, sizes) != evaluate(slot, list(values)) for e, slot in pairs):
                return False
        return True

    def _recipe(self, call: Call) -> list[tuple[int, Any, Any, Any]]:
        """How each argument of ``call`` is placed at new sizes: (0, the argument) as it
        is, (1, a kernel size's name), (2, the value's root in the arena, the value), (3, base,
        index, the value: at the value's start)."""
        out: list[tuple[int, Any, Any, Any]] = []
        for (where, index, offset), held in zip(call.args, call.holds):
            if held is None:
                out.append((0, (where, index, offset), None, None))
            elif held.startswith("<size>"):
                out.append((1, held[len("<size>"):], None, None))
            elif where == ARENA:
                out.append((2, self.roots.get(held, held), held, None))
            else:
                out.append((3, where, index, held))
        return out

    @staticmethod
    def of(template: Any) -> TemplateProgram | None:
        """The template's program, where its base plan runs as one native program of
        straight calls (no loops or branches), each of a kernel step; else None."""
        layout = getattr(template.base.program, "layout", None)
        steps = template.base.plan.steps
        if not isinstance(layout, ProgramLayout) or not all(isinstance(ins, Run) for ins in layout.code) \
                or sum(isinstance(st, KernelStep) for st in steps) != len(layout.calls) \
                or any(not call.holds for call in layout.calls):
            return None
        return TemplateProgram(template, layout)

    def lay_out(self, values: list[int]) -> tuple[ProgramLayout, MemoryPlan] | None:
        """The layout at the template's ``values`` (its sizes, in their buckets) and the
        memory plan it places values by, or None where a kernel has no code
        compiled for its sizes yet. Raises ShapeError or IRVerificationError where the
        template does not hold there (as instantiating)."""
        template, plan, base = self.template, self.plan, self.layout
        shapes, nbytes = dict(self.shapes), dict(self.nbytes)
        limit = max_tensor_bytes()
        for name, slots in template.types.items():
            dims = tuple(evaluate(s, values) for s in slots)
            shapes[name], nbytes[name] = dims, math.prod(dims) * self.itemsize[name]
            if nbytes[name] > limit or min(dims, default=0) < 0:   # (raises)
                check_tensor_size(f"value '{name}'", plan.types[name].dtype, dims)
        shape = shapes.__getitem__
        starts = self._starts(values, shape)
        offsets, arena = first_fit(self.defined, self.last,
                                   {v: aligned(max(1, nbytes[v]), ALIGNMENT) for v in self.last})
        constants = dict(base.constants)
        for name, slots in template.constants.items():
            array = plan.constants[name]
            constants[name] = np.array([evaluate(s, values) for s in slots], array.dtype).reshape(array.shape)
        runs = self._runs(values, shape)
        if runs is None:
            return None

        def size(value: int) -> tuple[int, Any, int]:
            key = f"<size {value}>"
            if key not in constants:
                constants[key] = np.array([value], np.int64)
            return (CONSTANT, key, 0)

        calls = []
        for k, (call, recipe) in enumerate(zip(base.calls, self.recipes)):
            run = runs.get(k, call.executable)
            args = [a if how == 0 else size(run.sizes[a]) if how == 1
                    else (ARENA, 0, offsets[a] + starts.get(b, 0)) if how == 2
                    else (a, b, starts.get(c, 0)) for how, a, b, c in recipe]
            outputs = run.layout.outputs
            first = len(run.layout.input_names)
            zero = tuple((first + j, nbytes[call.holds[first + j]]) for j, (_, _, _, zeroed) in enumerate(outputs)
                         if zeroed and nbytes[call.holds[first + j]])
            calls.append(Call(call.label, run, call.stages, tuple(args), zero, call.holds))
        memory = MemoryPlan(offsets, arena,
                            sum(aligned(max(1, nbytes[v]), ALIGNMENT) for v in self.allocated), self.roots, starts)
        return ProgramLayout([Tensor(t.name, shape(t.name), t.dtype) for t in base.inputs],
                             [Tensor(t.name, shape(t.name), t.dtype) for t in base.outputs],
                             [(shape(v), dtype) for v, (_, dtype) in zip(self.slot_values, base.slots)],
                             base.results, calls, constants, max(arena, 64), base.code), memory

    def _starts(self, values: list[int], shape: Callable[[str], tuple[int, ...]]) -> dict[str, int]:
        """Each view's bytes into its root, each view checked to read inside its source."""
        starts: dict[str, int] = {}
        types = self.plan.types
        for index, st in self.views:
            slots, offset = self.template.views.get(index, (st.shape, st.offset))
            at = evaluate(offset, values)
            check_view(f"step {st.label}", TensorType(types[st.input].dtype, shape(st.input)),
                       TensorType(types[st.output].dtype, shape(st.output)),
                       tuple(evaluate(s, values) for s in slots), at, st.output if st.output in self.outputs else None)
            start = starts.get(st.input, 0) + at * self.itemsize[st.input]
            if start:
                starts[st.output] = start
        return starts

    def _runs(self, values: list[int], shape: Callable[[str], tuple[int, ...]]) -> dict[int, Any] | None:
        """The code each symbolic kernel runs at these sizes (by call), checked against
        its buffers; None where some kernel has none compiled for them."""
        runs: dict[int, Any] = {}
        for c in self.symbolic:
            sizes = {n: evaluate(e, values) for n, e in c.given.items()}
            if sizes == c.base:
                continue
            outputs = tuple(shape(n) for n in c.step.defines)
            if not c.proven:   # the kernel's sizes bound to its buffers
                d = c.kernel.definition
                bound = sizes_of_shapes(d, [shape(n) for n in c.step.inputs])
                if any(bound.get(n, v) != v for n, v in sizes.items()):
                    raise ShapeError(f"step {c.step.label}: its kernel's sizes {sizes} disagree with its "
                                     f"inputs' sizes {bound}")
                sizes = {**bound, **sizes}
                if tuple(tuple(evaluate_int(e, sizes) for e in t.shape) for t in d.outputs) != outputs:
                    raise IRVerificationError(f"step {c.step.label}: the kernel's outputs do not have the "
                                              f"template's shapes {list(outputs)}")
            run = c.kernel.compiled_at(sizes, outputs)
            if run is None or run.executable.layout != self.layout.calls[c.call].executable.layout:
                return None
            runs[c.call] = run
        return runs


class TemplatedPlan:
    """A plan template's instance run by a program laid out from the template
    (``layout``; ``program`` what runs it); its plan and kernels, which dumps, profiles
    and bundles read, are instantiated by ``instantiate`` when first read."""

    tail = None   # (templates are of plans without control flow after their steps)

    def __init__(self, layout: ProgramLayout, memory: MemoryPlan, generic: tuple,
                 instantiate: Callable[[], CompiledPlan]) -> None:
        self.layout = layout
        self.memory = memory
        self.program: Any = None
        self.generic = generic
        self._instantiate = instantiate

    @cached_property
    def instance(self) -> CompiledPlan:
        """The plan instantiated, with the memory plan its program runs."""
        made = self._instantiate()
        return replace(made, plan=replace(made.plan, memory=self.memory))

    @property
    def plan(self) -> Any:
        return self.instance.plan

    @property
    def kernels(self) -> tuple:
        return self.instance.kernels

    def steps(self) -> Iterator[tuple[KernelStep, Any]]:
        return self.instance.steps()


def _degree(e: Any) -> int:
    """The degree of a template's slot (a constant, or an expression of its sizes)."""
    return 0 if isinstance(e, int) else max([len(factors) for _, factors in e[1]] + [0])


def _expr_degree(e: Expr) -> int | None:
    """The degree of a size expression in its sizes, or None where it is no polynomial
    (a division, a min)."""
    match e:
        case Literal():
            return 0
        case SizeVar():
            return 1
        case Unary(op=UnaryOp.NEG, operand=a):
            return _expr_degree(a)
        case Binary(op=BinaryOp.ADD | BinaryOp.SUB | BinaryOp.MUL, lhs=a, rhs=b):
            x, y = _expr_degree(a), _expr_degree(b)
            if x is None or y is None:
                return None
            return x + y if e.op is BinaryOp.MUL else max(x, y)
    return None
