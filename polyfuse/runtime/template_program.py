"""A plan template's program at a new shape, laid out without instantiating the plan.

:meth:`PlanTemplate.instantiate <polyfuse.runtime.plan_template.PlanTemplate.instantiate>`
makes the whole plan at a new shape: its buffers' types, its steps with each kernel's
definition bound to its sizes, the memory plan, then the program's layout from them. A
decoding step pays that on every token (the past grows by one). What runs is only the
native program: where each argument of each call lives, the code and sizes each
symbolic kernel gets, the bytes to zero. :class:`TemplateProgram` keeps the template's
base program and, at new sizes, patches only those numbers
(:meth:`~polyfuse.runtime.native.Program.patched`). Each number that changes is a
polynomial of the template's sizes, all evaluated at once
(:class:`~polyfuse.runtime.generalize.Polynomials`):

* **Memory**: the arena's values placed first-fit by liveness, as the planner places
  them (:func:`~polyfuse.ir.plan.plan_memory`; :func:`polyfuse.runtime.native.first_fit`
  over numbered values, the liveness computed once): only the values' bytes change.
* **Kernels**: a symbolic kernel runs code compiled before
  (:meth:`~polyfuse.runtime.kernel.Kernel.compiled_at`) where its sizes agree with its
  input buffers, its outputs have the buffers' types and its accesses check as at a size
  it ran at; where its code is picked by affine forms of its sizes
  (:meth:`~polyfuse.runtime.kernel.Kernel.signature_forms`), every such kernel's code is
  picked at once from one key (:class:`_Picks`). Where none is compiled (a size outside
  the symbolic range, accesses that check differently), the call instantiates the plan
  instead, and compiles.
* **Checks**: every buffer under the tensor limit with no negative dimension, every view
  inside its source, as forms of the sizes checked at once; where one fails, the check
  instantiating makes raises its error. Every expression stays in its bucket.

The layout's calls and memory plan are made only when read, and the plan and kernels of
the instance (what ``dump``, ``profile`` and bundles read) are instantiated when first
read (:class:`TemplatedPlan`), with the memory plan its program runs.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from polyfuse.errors import IRVerificationError, ShapeError
from polyfuse.ir.affine import Affine, combine
from polyfuse.ir.comprehension import Binary, BinaryOp, Expr, Literal, SizeVar, TensorDecl, Unary, UnaryOp
from polyfuse.ir.limits import check_tensor_size, max_tensor_bytes
from polyfuse.ir.graph import TensorType
from polyfuse.ir.plan import MemoryPlan, check_view
from polyfuse.ir.sizes import sizes_of_shapes
from polyfuse.ir.steps import KernelStep, ViewStep, live_ranges, view_roots
from polyfuse.ir.symbolic import evaluate_int
from polyfuse.runtime.generalize import Expression, Polynomials, evaluate, product, total
from polyfuse.runtime import native
from polyfuse.runtime.instructions import Run
from polyfuse.runtime.kernel import SizesBound
from polyfuse.scheduler.model import SYMBOLIC_MAX
from polyfuse.runtime.program import ARENA, CONSTANT, Call, CompiledPlan, ProgramLayout, Tensor

ALIGNMENT = 64   # a value's start in the arena (plan_memory's block alignment)


@dataclass(frozen=True)
class _KernelCall:
    """A call of the layout whose kernel is compiled for symbolic sizes: its step, the
    template's expression of each size it is given and where their values stand among
    the program's numbers."""

    call: int
    step: KernelStep
    kernel: Any                       # the Kernel (polyfuse.runtime.kernel)
    given: Mapping[str, Any]          # size name -> slot of the template
    base: Mapping[str, int]           # ... its values in the base plan
    at: tuple[int, ...] = ()          # ... the index of each among the numbers
    proven: bool = False              # its shapes are its buffers' at every size (agree)
    # where its code depends only on which outputs need zeros (Kernel.signature_forms):
    # the indices of the forms that must be >= 0, of its symbolic sizes (name, index) and,
    # per output, whether it always needs zeros, else the indices of each index range's
    # start and of its end less the dimension (it needs zeros unless all are <= 0 and >= 0)
    conditions: tuple[int, ...] | None = None
    symbolic: tuple[tuple[str, int], ...] = ()
    fills: tuple[tuple[str, bool, tuple[tuple[int, int], ...]], ...] = ()
    codes: dict = field(default_factory=dict, compare=False)   # outputs zeroed -> code


class _Numbers:
    """The numbers of a template's program as they are made: ``expressions`` of the
    template's sizes (the first a zero, where a value has no start), each buffer's
    dimensions' ``slots`` and its bytes' number, made once."""

    def __init__(self, slots: Mapping[str, tuple], itemsize: Mapping[str, int]) -> None:
        self.expressions: list[Expression | int] = [0]
        self.slots = slots
        self.itemsize = itemsize
        self._bytes: dict[str, int] = {}

    def put(self, *es: Expression | int) -> tuple[int, ...]:
        """Their numbers."""
        self.expressions.extend(es)
        return tuple(range(len(self.expressions) - len(es), len(self.expressions)))

    def bytes_of(self, name: str) -> int:
        """The number of buffer ``name``'s bytes."""
        if name not in self._bytes:
            itemsize: Expression | int = self.itemsize[name]
            self._bytes[name] = self.put(functools.reduce(product, self.slots[name], itemsize))[0]
        return self._bytes[name]


@dataclass(frozen=True)
class _View:
    """A view step whose shapes or offset change with the sizes: the indices of its
    offset and shape among the program's numbers."""

    step: ViewStep
    offset: int
    shape: tuple[int, ...]


class TemplateProgram:
    """A plan template's base layout and how its numbers change with the sizes (see the
    module docstring). Every number that changes (the dimensions and bytes of the
    buffers that change, each view's offset, shape and bytes into its root, each
    symbolic kernel's sizes, the shapes' values) is a polynomial of the template's sizes,
    all evaluated at once per call (:class:`~polyfuse.runtime.generalize.Polynomials`)."""

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
        self.outputs = set(plan.outputs)
        self.slot_values = [self.roots.get(name, name) for name, how, _ in layout.results if how == "slot"]
        self.recipes = [self._recipe(call) for call in layout.calls]
        n = _Numbers({name: template.types.get(name, self.shapes[name]) for name in plan.types}, self.itemsize)
        # the buffers that change: (name, the first and end index of its dimensions, its bytes' index)
        self.changing = [(name, *_span(n.put(*slots)), n.bytes_of(name)) for name, slots in template.types.items()]
        self.dims = np.array([k for _, first, end, _ in self.changing for k in range(first, end)], np.intp)
        self.bytes = np.array([count for *_, count in self.changing], np.intp)
        self.shape_at = {name: (first, end) for name, first, end, _ in self.changing}
        self._views(n)
        self.constants = [(name, n.put(*slots)) for name, slots in template.constants.items()]
        self._kernel_calls(n)
        self._arena(n)
        self._moves(n)
        self.native = template.base.program.program
        self.numbers = Polynomials(n.expressions)

    def _views(self, n: _Numbers) -> None:
        """Each view's bytes into its root; the views that change, checked per call as
        forms that must be >= 0 (offset; room left in the source) and = 0 (shapes; an
        output's slice)."""
        template = self.template
        starts: dict[str, Expression | int] = {}
        self.views: list[_View] = []
        self.starts: dict[str, int] = {}
        nonnegative: list[Expression | int] = []
        zeros: list[Expression | int] = []
        for index, st in enumerate(self.plan.steps):
            if isinstance(st, ViewStep):
                slots, offset = template.views.get(index, (st.shape, st.offset))
                starts[st.output] = total(starts.get(st.input, 0), product(offset, self.itemsize[st.input]))
                self.starts[st.output] = n.put(starts[st.output])[0]
                if index in template.views or {st.input, st.output} & template.types.keys():
                    self.views.append(_View(st, n.put(offset)[0], n.put(*slots)))
                    source, target = n.expressions[n.bytes_of(st.input)], n.expressions[n.bytes_of(st.output)]
                    nonnegative += [offset, total(source, product(-1, total(product(offset, self.itemsize[st.input]),
                                                                            target)))]
                    zeros += [total(a, product(-1, b)) for a, b in zip(slots, n.slots[st.output])]
                    zeros += [len(slots) - len(n.slots[st.output])]
                    if st.output in self.outputs:
                        zeros += [offset, total(source, product(-1, target))]
        self.nonnegative = np.concatenate([self.dims, np.array(n.put(*nonnegative), np.intp)])
        self.zeros = np.array(n.put(*zeros), np.intp)

    def _kernel_calls(self, n: _Numbers) -> None:
        """The calls of symbolic kernels (``symbolic``): the numbers of the sizes each is
        given and, where its code is picked by forms of them, those forms; the calls
        picked all at once (``picks``) and the others whose sizes change (``others``)."""
        template = self.template
        calls: list[_KernelCall] = []
        kernel_steps = [(index, st) for index, st in enumerate(self.plan.steps) if isinstance(st, KernelStep)]
        for call, (index, st) in enumerate(kernel_steps):   # (a layout's calls: the kernel steps, in order)
            g = template.base.generics[index]
            if index in template.sizes:
                assert g is not None   # (a step with sizes has a symbolic kernel)
                given = template.sizes[index]
                c = _KernelCall(call, st, g.kernel, given, template.base_sizes[index], n.put(*given.values()))
                c = replace(c, proven=self._agree(c))
                forms = c.kernel.signature_forms(c.base) if c.proven else None
                if forms is not None and all(isinstance(e, int) for name, e in given.items() if name not in forms[0]):
                    symbolic, conditions, fills = forms
                    c = replace(c, symbolic=tuple((name, c.at[list(given).index(name)]) for name in sorted(symbolic)),
                                conditions=n.put(*(_composed(f, given) for f in conditions)),
                                fills=tuple((t, always, tuple(zip(n.put(*(_composed(lo, given) for lo, _, _ in covers)),
                                                                  n.put(*(_composed(combine(hi, dim, -1), given)
                                                                          for _, hi, dim in covers)))))
                                            for t, always, covers in fills))
                calls.append(c)
        self.symbolic = calls
        changes = [c for c in calls if any(not isinstance(e, int) for e in c.given.values())]
        picked = [c for c in changes if c.conditions is not None]
        self.picks = _Picks(picked) if picked else None
        self.others = [c for c in changes if c.conditions is None]

    def _arena(self, n: _Numbers) -> None:
        """The arena's values numbered for native.first_fit: those defined at each event,
        each one's last event, and the numbers of its bytes."""
        self.placed = list(self.last)
        number = {v: k for k, v in enumerate(self.placed)}
        self.bounds = np.cumsum([0] + [len(vs) for vs in self.defined], dtype=np.int64)
        self.events = np.array([number[v] for vs in self.defined for v in vs], np.int64)
        self.ends = np.array([self.last[v] for v in self.placed], np.int64)
        self.placed_bytes = np.array([n.bytes_of(v) for v in self.placed], np.intp)
        self.allocated_bytes = np.array([n.bytes_of(v) for v in self.allocated], np.intp)

    def _moves(self, n: _Numbers) -> None:
        """The native program's changes: the arguments that move, as rows (call, argument,
        base, index, offset) of which a column changes (arena offsets: the root's offset
        plus the value's start; inputs' and outputs' starts; constants' addresses plus
        starts; kernel sizes: the address of each in one array of them), and the calls
        whose zeroed bytes change, as rows (call, argument, bytes)."""
        template, layout = self.template, self.layout
        number = {v: k for k, v in enumerate(self.placed)}
        moved = [(k, j, *r) for k, (recipe, _) in enumerate(self.recipes) for j, r in enumerate(recipe or ()) if r[0]]
        arena = [(k, j, number[a], self.starts.get(b, 0)) for k, j, how, a, b, _ in moved if how == 2]
        io = [(k, j, a, b, self.starts.get(c, 0)) for k, j, how, a, b, c in moved if how == 3 and a != CONSTANT]
        fixed = [(k, j, b, self.starts.get(c, 0)) for k, j, how, a, b, c in moved if how == 3 and a == CONSTANT]
        given = {c.call: c for c in self.symbolic}
        self.sized = [(k, j, a, given[k].at[list(given[k].given).index(a)] if k in given and a in given[k].given else -1)
                      for k, j, how, a, _, _ in moved if how == 1]
        self.table = np.array([(k, j, ARENA, 0, 0) for k, j, _, _ in arena] + [(k, j, a, b, 0) for k, j, a, b, _ in io]
                              + [(k, j, CONSTANT, 0, 0) for k, j, _, _ in fixed + self.sized], np.int64).reshape(-1, 5)
        rows = np.cumsum([0, len(arena), len(io), len(fixed), len(self.sized)])
        self.rows = [slice(a, b) for a, b in zip(rows, rows[1:])]
        self.arena_values = np.array([v for _, _, v, _ in arena], np.intp)
        self.arena_starts = np.array([st for *_, st in arena], np.intp)
        self.io_starts = np.array([st for *_, st in io], np.intp)
        self.fixed_addresses = np.array([0 if b in template.constants else _address(layout.constants[b])
                                         for _, _, b, _ in fixed], np.int64)
        self.fixed_changing = [(row, b) for row, (_, _, b, _) in enumerate(fixed) if b in template.constants]
        self.fixed_starts = np.array([st for *_, st in fixed], np.intp)
        self.size_numbers = np.array([max(i, 0) for *_, i in self.sized], np.intp)
        self.size_offsets = 8 * np.arange(len(self.sized), dtype=np.int64)
        self.unnumbered = [(row, k, name, int(layout.constants[layout.calls[k].args[j][1]][0]))
                           for row, (k, j, name, i) in enumerate(self.sized) if i < 0]
        zeroing = [(k, j, n.bytes_of(v)) for k, (_, zeroed) in enumerate(self.recipes)
                   if {v for _, v in zeroed} & template.types.keys() for j, v in zeroed]
        self.zeroing = np.array([(k, j, 0) for k, j, _ in zeroing], np.int64).reshape(-1, 3)
        self.zeroed_bytes = np.array([b for *_, b in zeroing], np.intp)

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

    def _recipe(self, call: Call) -> tuple[list[tuple[int, Any, Any, Any]] | None, list[tuple[int, str]]]:
        """How each argument of ``call`` is placed at new sizes: (0, the argument) as it
        is, (1, a kernel size's name), (2, the value's root in the arena, the value), (3, base,
        index, the value: at the value's start), None where none changes; and the
        outputs it zeroes (argument index, value: the code a call runs instead has the
        same layout)."""
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
        layout = call.executable.layout
        first = len(layout.input_names)
        zeroed = [(first + j, str(call.holds[first + j])) for j, (_, _, _, zeroes) in enumerate(layout.outputs)
                  if zeroes]
        if all(how == 0 for how, *_ in out) and not {v for _, v in zeroed} & self.template.types.keys():
            return None, zeroed
        return out, zeroed

    @staticmethod
    def of(template: Any) -> TemplateProgram | None:
        """The template's program, where its base plan runs as one native program of
        straight calls (no loops or branches) in this process, each of a kernel step,
        whose arguments that change hold what they locate; else None."""
        layout = getattr(template.base.program, "layout", None)
        steps = template.base.plan.steps
        if not isinstance(layout, ProgramLayout) or not isinstance(getattr(template.base.program, "program", None),
                                                                     native.Program) \
                or not all(isinstance(ins, Run) for ins in layout.code) \
                or sum(isinstance(st, KernelStep) for st in steps) != len(layout.calls) \
                or any(not call.holds for call in layout.calls) \
                or any(held is None and where == CONSTANT and index in template.constants
                       for call in layout.calls for (where, index, _), held in zip(call.args, call.holds)):
            return None
        return TemplateProgram(template, layout)

    def lay_out(self, values: list[int]) -> tuple[ProgramLayout, Callable[[], MemoryPlan], native.Program] | None:
        """The layout at the template's ``values`` (its sizes, in their buckets), the
        memory plan it places values by (made when called) and the base's native program patched to it
        (its calls made only when read), or None where a kernel has no code compiled for
        its sizes yet. Raises ShapeError or IRVerificationError where the
        template does not hold there (as instantiating)."""
        plan, base = self.plan, self.layout
        numbers = self.numbers.at(values)
        if not self._holds(numbers):
            self._refuse(numbers)
        blocks = -(-np.maximum(numbers[self.placed_bytes], 1) // ALIGNMENT) * ALIGNMENT
        at, arena = native.first_fit(self.bounds, self.events, self.ends, blocks)
        constants = dict(base.constants)
        for name, slots in self.constants:
            array = plan.constants[name]
            constants[name] = np.array(numbers[list(slots)], array.dtype).reshape(array.shape)
        picked = self._runs(numbers)
        if picked is None:
            return None
        known, runs = picked
        table = self.table.copy()
        arena_rows, io_rows, fixed_rows, size_rows = self.rows
        table[arena_rows, 4] = at[self.arena_values] + numbers[self.arena_starts]
        table[io_rows, 4] = numbers[self.io_starts]
        if len(self.fixed_starts):
            addresses = self.fixed_addresses.copy()
            for row, name in self.fixed_changing:
                addresses[row] = _address(constants[name])
            table[fixed_rows, 3] = addresses + numbers[self.fixed_starts]
        sizes = numbers[self.size_numbers]
        for row, k, name, value in self.unnumbered:
            sizes[row] = runs[k].sizes[name] if k in runs else value
        constants["<sizes>"] = held = np.array(sizes if len(sizes) else [0], np.int64)
        table[size_rows, 3] = _address(held) + self.size_offsets
        fns = np.array([(k, run.address if isinstance(run, _Hit) else run.executable.jit.address)
                        for k, run in runs.items()], np.int64).reshape(-1, 2)
        if known is not None:
            fns = np.concatenate([known.fns, fns])
        zero = self.zeroing.copy()
        zero[:, 2] = numbers[self.zeroed_bytes]
        program = self.native.patched(fns, table, zero)
        x = numbers.tolist()

        def shape(name: str) -> tuple[int, ...]:
            first, end = self.shape_at.get(name, (0, 0))
            return tuple(x[first:end]) if end else self.shapes[name]

        def memory() -> MemoryPlan:
            naive = int((-(-np.maximum(numbers[self.allocated_bytes], 1) // ALIGNMENT) * ALIGNMENT).sum())
            return MemoryPlan(dict(zip(self.placed, at.tolist())), int(arena), naive, self.roots,
                              {name: x[k] for name, k in self.starts.items() if x[k]})
        layout = ProgramLayout([Tensor(t.name, shape(t.name), t.dtype) for t in base.inputs],
                               [Tensor(t.name, shape(t.name), t.dtype) for t in base.outputs],
                               [(shape(v), dtype) for v, (_, dtype) in zip(self.slot_values, base.slots)],
                               base.results, _Calls(lambda: self._calls(x, memory(), known, runs)),
                               constants, max(int(arena), 64), base.code)
        return layout, memory, program

    def _shapes(self, x: list[int]) -> dict[str, tuple[int, ...]]:
        """Every buffer's shape at the numbers ``x``."""
        shapes = dict(self.shapes)
        shapes.update((name, tuple(x[first:end])) for name, (first, end) in self.shape_at.items())
        return shapes

    def _holds(self, numbers: np.ndarray) -> bool:
        """Whether every buffer is within the tensor limit with no negative dimension and
        every view reads inside its source at the ``numbers`` (as forms of them)."""
        return not (len(self.bytes) and numbers[self.bytes].max() > max_tensor_bytes()
                    or len(self.nonnegative) and numbers[self.nonnegative].min() < 0
                    or len(self.zeros) and numbers[self.zeros].any())

    def _refuse(self, numbers: np.ndarray) -> None:
        """Raises the error instantiating raises where the ``numbers`` fail a check: a
        buffer over the tensor limit or with a negative dimension (ShapeError), a view
        outside its source (IRVerificationError)."""
        for name, first, end, _ in self.changing:
            check_tensor_size(f"value '{name}'", self.plan.types[name].dtype, tuple(numbers[first:end].tolist()))
        types, x = self.plan.types, numbers.tolist()
        shapes = self._shapes(x)
        for v in self.views:
            st = v.step
            check_view(f"step {st.label}", TensorType(types[st.input].dtype, shapes[st.input]),
                       TensorType(types[st.output].dtype, shapes[st.output]),
                       tuple([x[k] for k in v.shape]), x[v.offset], st.output if st.output in self.outputs else None)
        raise AssertionError("the template's forms fail where its checks hold")   # pragma: no cover

    @property
    def _picked(self) -> list[_KernelCall]:
        return self.picks.calls if self.picks is not None else []

    def _calls(self, x: list[int], memory: MemoryPlan, known: _Known | None, runs: Mapping[int, Any]) -> list[Call]:
        """The layout's calls (for what reads them: the native program is patched
        without them), each argument where the program has it."""
        if known is not None:
            runs = {**runs, **{c.call: _Hit(code, c, address) for c, code, address
                               in zip(self._picked, known.codes, known.fns[:, 1].tolist())}}
        shapes, offsets, starts = self._shapes(x), memory.offsets, memory.starts
        at = iter(range(0, 8 * len(self.sized), 8))
        nbytes = {**self.nbytes, **{name: x[count] for name, _, _, count in self.changing}}
        calls = []
        for k, (call, (recipe, zeroed)) in enumerate(zip(self.layout.calls, self.recipes)):
            if recipe is None and k not in runs:   # (nothing in it changes)
                calls.append(call)
                continue
            run = runs.get(k, call.executable)
            if isinstance(run, _Hit):
                run = SizesBound(run.code, {n: x[i] for n, i in run.call.symbolic},
                                 tuple(shapes[n] for n in run.call.step.defines))
            args = [arg if how == 0 else (CONSTANT, "<sizes>", next(at)) if how == 1
                    else (ARENA, 0, offsets[a] + starts.get(b, 0)) if how == 2
                    else (a, b, starts.get(c, 0)) for arg, (how, a, b, c) in zip(call.args, recipe or ())]
            zero = tuple((j, nbytes[v]) for j, v in zeroed if nbytes[v])
            calls.append(Call(call.label, run, call.stages, tuple(args), zero, call.holds))
        return calls

    def _runs(self, numbers: np.ndarray) -> tuple[_Known | None, dict[int, Any]] | None:
        """The code each symbolic kernel runs at these sizes (``numbers``: the
        program's), checked against its buffers: the codes of the calls picked all at
        once where known (else None), and the others by call; None where some kernel has
        none compiled for them."""
        runs: dict[int, Any] = {}
        picks = self.picks
        ok, need = picks.state(numbers) if picks is not None else (None, None)
        key = need.tobytes() if ok is not None and need is not None and ok.all() else None
        known = picks.known.get(key) if picks is not None and key is not None else None
        # each picked call's outputs needing zeros, where its conditions hold
        zeroed_of = {} if known is not None or picks is None or ok is None or need is None else \
            {c.call: picks.zeroed(i, need) for i, c in enumerate(picks.calls) if ok[i]}
        x: list[int] = []
        shapes: dict[str, tuple[int, ...]] = {}
        for c in self.others if known is not None else self._picked + self.others:
            if not x:
                x = numbers.tolist()
            sizes = dict(zip(c.given, [x[k] for k in c.at]))
            if sizes == c.base:
                continue
            if not shapes:
                shapes = self._shapes(x)
            outputs = tuple(shapes[n] for n in c.step.defines)
            zeroed = zeroed_of.get(c.call)
            code = None if zeroed is None else c.codes.get(zeroed)
            if code is not None:
                runs[c.call] = _Hit(code, c, code.jit.address)
                continue
            if not c.proven:   # the kernel's sizes bound to its buffers
                d = c.kernel.definition
                bound = sizes_of_shapes(d, [shapes[n] for n in c.step.inputs])
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
            if zeroed is not None:
                c.codes[zeroed] = run.executable
            runs[c.call] = run
        if known is None and key is not None and picks is not None:
            picks.remember(key, zeroed_of)
        return known, runs


class _Picks:
    """The kernel calls whose code is picked by their forms (``_KernelCall.conditions``),
    picked for all at once: where a call's conditions hold, its code is a function of
    which of its outputs need zeros; where every call's hold, all of them are one
    boolean per output (``key``), and the codes are remembered per key once each call's
    was found."""

    def __init__(self, calls: list[_KernelCall]) -> None:
        self.calls = calls
        self.conditions = np.array([k for c in calls for k in c.conditions or ()], np.intp)
        self.sizes = np.array([k for c in calls for _, k in c.symbolic], np.intp)
        self.condition_ends = np.cumsum([len(c.conditions or ()) for c in calls], dtype=np.intp)
        self.size_ends = np.cumsum([len(c.symbolic) for c in calls], dtype=np.intp)
        fills = [f for c in calls for f in c.fills]
        self.fill_ends = np.cumsum([len(c.fills) for c in calls], dtype=np.intp)
        self.always = np.array([always for _, always, _ in fills], bool)
        self.lo = np.array([lo for _, _, covers in fills for lo, _ in covers], np.intp)
        self.gap = np.array([gap for _, _, covers in fills for _, gap in covers], np.intp)
        self.cover_ends = np.cumsum([len(covers) for _, _, covers in fills], dtype=np.intp)
        self.known: dict[bytes, _Known] = {}   # key -> each call's code

    def state(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """At the numbers ``x``: whether each call's conditions hold (its symbolic sizes
        in range), and whether each output needs zeros (one per call's fill, in order)."""
        sizes = x[self.sizes]
        ok = ~(_any_in(x[self.conditions] < 0, self.condition_ends)
               | _any_in((sizes < 1) | (sizes > SYMBOLIC_MAX), self.size_ends))
        need = self.always | _any_in((x[self.lo] > 0) | (x[self.gap] < 0), self.cover_ends)
        return ok, need

    def zeroed(self, i: int, need: np.ndarray) -> tuple[str, ...]:
        """The outputs of call ``i`` that need zeros (``need``: :meth:`state`'s)."""
        first = int(self.fill_ends[i - 1]) if i else 0
        return tuple(t for (t, _, _), n in zip(self.calls[i].fills, need[first:self.fill_ends[i]].tolist()) if n)

    def remember(self, key: bytes, zeroed: Mapping[int, tuple[str, ...]]) -> None:
        """Keep the codes at ``key`` (each call's outputs needing zeros ``zeroed``, by
        call) where every call's has been found."""
        codes = [c.codes.get(zeroed[c.call]) for c in self.calls]
        if all(code is not None for code in codes):
            self.known[key] = _Known(codes, np.array([(c.call, code.jit.address) for c, code in zip(self.calls, codes)
                                                      if code is not None], np.int64).reshape(-1, 2))


def _any_in(flags: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether any of ``flags`` is set in each consecutive run ending at ``ends``."""
    counts = np.concatenate(([0], np.cumsum(flags)))
    return counts[ends] > counts[np.concatenate(([0], ends[:-1])).astype(np.intp)]  # type: ignore[no-any-return]


class _Known(NamedTuple):
    """The codes of the calls picked all at once, and their (call, address) rows."""

    codes: list
    fns: np.ndarray


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]  # type: ignore[no-any-return]


class _Hit(NamedTuple):
    """A symbolic kernel's code picked by its forms (its SizesBound made when read)."""

    code: Any
    call: _KernelCall
    address: int


class _Calls(Sequence[Call]):
    """A layout's calls, made when first read."""

    def __init__(self, make: Callable[[], list[Call]]) -> None:
        self._make: Callable[[], list[Call]] | None = make
        self._calls: list[Call] = []

    def _list(self) -> list[Call]:
        if self._make is not None:
            self._calls, self._make = self._make(), None
        return self._calls

    def __getitem__(self, k: Any) -> Any:
        return self._list()[k]

    def __len__(self) -> int:
        return len(self._list())


class TemplatedPlan:
    """A plan template's instance run by a program laid out from the template
    (``layout``; ``native``, the base's native program patched to it; ``program`` what
    runs it, made by the model like the ``base`` program); its plan and kernels, which
    dumps, profiles and bundles read, are instantiated by ``instantiate`` when first read."""

    tail = None   # (templates are of plans without control flow after their steps)

    def __init__(self, layout: ProgramLayout, memory: Callable[[], MemoryPlan], native: Any, generic: tuple,
                 base: Any, instantiate: Callable[[], CompiledPlan]) -> None:
        self.layout = layout
        self._memory = memory
        self.native = native
        self.base = base
        self.program: Any = None
        self.generic = generic
        self._instantiate = instantiate

    @cached_property
    def memory(self) -> MemoryPlan:
        """The memory plan its program runs."""
        return self._memory()

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


def _span(indices: tuple[int, ...]) -> tuple[int, int]:
    """Consecutive indices as (first, end)."""
    return (indices[0], indices[-1] + 1) if indices else (0, 0)


def _composed(f: Affine, given: Mapping[str, Any]) -> Expression | int:
    """An affine form of a kernel's sizes as an expression of the template's sizes."""
    out: Expression | int = f.get("", 0)
    for name, coefficient in f.items():
        if name:
            out = total(out, product(coefficient, given[name]))
    return out


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
