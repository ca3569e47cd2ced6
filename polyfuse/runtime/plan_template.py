"""Plan templates: a model's plan at a new shape by evaluating sizes, not by planning.

Planning a model for a new shape runs every node through the op library, composes the
fusion groups and verifies the result: tens of milliseconds for a transformer, paid by
every decoding step (the past grows by one) and every request at a new sequence length.
Once plans of a model differ only in sizes, the next one is an evaluation:

* Plans of one **kind** (the same steps; each input dimension in the same **bucket**, 0,
  1 or at least 2: a size of 1 broadcasts, so plans at 1 are made of other texts, as
  torch.compile specializes 0 and 1) are the samples. The planner has kernels compute
  the values of the shapes that kernels read (``lowering.plan``), so that samples
  differ only in sizes.
* :meth:`PlanTemplate.make` anti-unifies the samples: the same steps on the same
  buffers, each kernel step either the same text in all or, in all, an instance of the
  template the latest one's kernel was compiled from for symbolic sizes
  (:mod:`polyfuse.runtime.generalize`). Each input dimension that differs is a size
  (dimensions whose values agree in every sample are one size); every integer of the
  plan that differs (a buffer's dimension, a view's shape and offset, an element of a
  small value of the shapes, a symbolic kernel's size) is :func:`~polyfuse.runtime.generalize.fit`
  to them (``seq``, ``past + seq``, ``batch * seq``). A template takes at least one
  sample more than an affine function of its sizes has coefficients, so every fit is
  checked by a sample it was not determined by; one that fits nothing leaves no
  template. The second plan of a kind (its kernels then symbolic) makes up the number
  with plans at made-up shapes of the kind (:func:`probe_shapes`: plans only).
* :meth:`PlanTemplate.instantiate` at new input shapes of the kind (its fixed
  dimensions equal, every size and expression in its bucket): the buffers' types, views
  and values of the shapes are the expressions' values, the memory plan is laid out for
  them (:func:`~polyfuse.ir.plan.plan_memory`), and each symbolic kernel is bound to its
  sizes: they must agree with its input buffers, its outputs must have the template's
  types and views must read inside their sources, or the template is dropped and the
  model plans that shape.

What a template assumes: that the lowering's decisions its samples share hold at every
shape of the kind, so the plan there differs only in its sizes. The buckets keep the
size-1 special cases apart, and the consistency checks make a wrong fit a refusal, never
a read outside a buffer. ``tests/runtime/test_plan_template.py`` compares instantiated
plans with plans the planner makes, buffer by buffer and kernel by kernel, at shapes the
templates were not made from.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from polyfuse.errors import AccessRangeError, IRVerificationError, PolyfuseError, ShapeError
from polyfuse.ir.graph import TensorType
from polyfuse.ir.limits import check_tensor_size
from polyfuse.ir.plan import Plan, Planner, plan_memory
from polyfuse.ir.steps import KernelStep, Step, ViewStep
from polyfuse.runtime.feeds import check_shapes
from polyfuse.runtime.generalize import Expression, Text, evaluate, fit
from polyfuse.runtime.program import CompiledPlan
from polyfuse.runtime.template_program import TemplatedPlan, TemplateProgram

# an integer of a plan template: a constant, or an expression of its sizes
Slot = int | Expression

TEMPLATES = 8   # templates a model keeps (the latest)
SAMPLES = 6     # the most plans a template is fitted to (the latest)
SHAPED_VALUES = 64   # the most elements of a constant the shapes decide that a template computes


def _bucket(n: int) -> int:
    return min(n, 2)


@dataclass(frozen=True)
class PlanTemplate:
    """A compiled plan (``base``) generalized over its model's input dimensions: each
    (input, axis) is a size of the template (``dims``: the index of its size, in the
    bucket ``buckets[index]``) or ``fixed``. ``types`` holds the buffers whose dimensions
    change (slots), ``views`` the view steps that change (step index: shape slots,
    offset slot), ``constants`` the values of the shapes (each element a slot),
    ``sizes`` each symbolic kernel's sizes (step index: size name: slot)."""

    base: CompiledPlan
    dims: Mapping[tuple[str, int], int]
    buckets: tuple[int, ...]
    fixed: Mapping[tuple[str, int], int]
    ranks: Mapping[str, int]
    types: Mapping[str, tuple[Slot, ...]]
    views: Mapping[int, tuple[tuple[Slot, ...], Slot]]
    constants: Mapping[str, tuple[Slot, ...]]
    sizes: Mapping[int, Mapping[str, Slot]]   # a symbolic kernel's sizes, per step index
    base_sizes: Mapping[int, Mapping[str, int]]   # ... in the base plan
    expressions: tuple[tuple[Expression, int], ...]   # each with its bucket

    @staticmethod
    def make(samples: list[CompiledPlan]) -> PlanTemplate | None:
        """The template of plans of one model (``samples[0]`` the latest, whose kernels
        the template runs), or None where they differ in more than sizes that fit, or
        are too few to check a fit (one more than the sizes' affine coefficients)."""
        base = samples[0].plan
        plans = [c.plan for c in samples]
        if any(p.tail is not None or p.inputs != base.inputs or p.outputs != base.outputs
               or p.specialized != base.specialized or len(p.steps) != len(base.steps)
               or p.types.keys() != base.types.keys() or p.constants.keys() != base.constants.keys()
               for p in plans):
            return None
        vectors: dict[tuple[int, ...], int] = {}
        dims: dict[tuple[str, int], int] = {}
        fixed: dict[tuple[str, int], int] = {}
        ranks: dict[str, int] = {}
        for name in base.inputs:
            ranks[name] = base.types[name].rank
            if any(p.types[name].rank != ranks[name] for p in plans):
                return None
            for axis in range(ranks[name]):
                vector = tuple(int(p.types[name].shape[axis]) for p in plans)
                if len(set(vector)) == 1:
                    fixed[name, axis] = vector[0]
                elif len({_bucket(v) for v in vector}) > 1:
                    return None
                else:
                    dims[name, axis] = vectors.setdefault(vector, len(vectors))
        if not vectors or len(samples) < len(vectors) + 2:
            return None
        sizes = [[v[s] for v in vectors] for s in range(len(samples))]
        expressions: dict[Expression, int] = {}

        def slot(values: list[int]) -> Slot | None:
            e = fit(values, sizes)
            if e is None or isinstance(e, int):
                return e
            if len({_bucket(v) for v in values}) > 1:
                return None
            expressions[e] = _bucket(values[0])
            return e

        types: dict[str, tuple[Slot, ...]] = {}
        for name, t in base.types.items():
            typed = [p.types[name] for p in plans]
            if all(o == t for o in typed):
                continue
            if any(o.dtype is not t.dtype or o.rank != t.rank for o in typed):
                return None
            slots = tuple(slot([int(o.shape[k]) for o in typed]) for k in range(t.rank))
            if any(s is None for s in slots):
                return None
            types[name] = slots   # type: ignore[assignment]
        constants: dict[str, tuple[Slot, ...]] = {}
        for name, array in base.constants.items():
            arrays = [p.constants[name] for p in plans]
            if all(o is array or (o.shape == array.shape and o.dtype == array.dtype and np.array_equal(o, array))
                   for o in arrays):
                continue
            # a value of the shapes computed at plan time (a Shape's output, a length):
            # a few integers, each an expression of the sizes
            if any(o.shape != array.shape for o in arrays) or array.dtype.kind not in "iu" \
                    or array.size > SHAPED_VALUES:
                return None
            values = tuple(slot([int(o.reshape(-1)[k]) for o in arrays]) for k in range(array.size))
            if any(v is None for v in values):
                return None
            constants[name] = values   # type: ignore[assignment]
        views: dict[int, tuple[tuple[Slot, ...], Slot]] = {}
        kernels: dict[int, dict[str, Slot]] = {}
        matched_base: dict[int, dict[str, int]] = {}
        generics = [c.generics for c in samples]
        for index, st in enumerate(base.steps):
            steps = [p.steps[index] for p in plans]
            if any(type(o) is not type(st) or o.label != st.label or o.inputs != st.inputs
                   or o.defines != st.defines for o in steps):
                return None
            if isinstance(st, ViewStep):
                seen = [o for o in steps if isinstance(o, ViewStep)]
                if any(len(o.shape) != len(st.shape) for o in seen):
                    return None
                shape = tuple(slot([o.shape[k] for o in seen]) for k in range(len(st.shape)))
                offset = slot([o.offset for o in seen])
                if any(s is None for s in (*shape, offset)):
                    return None
                if any(o != st for o in seen):
                    views[index] = (shape, offset)   # type: ignore[assignment]
                continue
            if not isinstance(st, KernelStep):
                return None   # loops and branches: planned per shape
            kernel_steps = [o for o in steps if isinstance(o, KernelStep)]
            g = generics[0][index]
            if g is None:
                if any(o.source != st.source for o in kernel_steps):
                    return None   # a text that changed but has no symbolic kernel
                continue
            # the symbolic kernel's text is each sample's at its sizes, each an expression
            matched = [g.template.match(Text.of(str(o.definition))) for o in kernel_steps]
            if any(m is None for m in matched):
                return None
            matched_base[index] = matched[0]   # type: ignore[assignment]
            given = {n: slot([m[n] for m in matched]) for n in g.template.names}   # type: ignore[index]
            if any(v is None for v in given.values()):
                return None
            kernels[index] = given   # type: ignore[assignment]
        return PlanTemplate(samples[0], dims, tuple(_bucket(v[0]) for v in vectors), fixed, ranks, types,
                            views, constants, kernels, {k: matched_base[k] for k in kernels},
                            tuple(expressions.items()))

    def accepts(self, shapes: Mapping[str, tuple[int, ...]]) -> bool:
        """Whether input ``shapes`` are in this template's buckets (its fixed dimensions
        equal, the others in the buckets of its samples, dimensions of one size equal)."""
        if any(len(shapes[n]) != r for n, r in self.ranks.items()):
            return False
        if any(shapes[n][axis] != v for (n, axis), v in self.fixed.items()):
            return False
        sizes: dict[int, int] = {}
        for (n, axis), k in self.dims.items():
            if sizes.setdefault(k, shapes[n][axis]) != shapes[n][axis] or _bucket(shapes[n][axis]) != self.buckets[k]:
                return False
        return True

    def values_at(self, shapes: Mapping[str, tuple[int, ...]]) -> list[int]:
        """The template's sizes at input ``shapes`` (which :meth:`accepts`); a ShapeError
        where an expression of them leaves its bucket."""
        values = [0] * len(self.buckets)
        for (n, axis), k in self.dims.items():
            values[k] = shapes[n][axis]
        for e, bucket in self.expressions:
            if _bucket(evaluate(e, values)) != bucket:
                raise ShapeError(f"a size of the plan template ({evaluate(e, values)}) leaves its bucket")
        return values

    def instantiate(self, shapes: Mapping[str, tuple[int, ...]],
                    placeholder: Callable[[TensorType], np.ndarray]) -> CompiledPlan:
        """The plan at input ``shapes`` (which :meth:`accepts`) with its kernels bound:
        raises ShapeError where an expression leaves its bucket and
        IRVerificationError where the plan is not consistent (see the module docstring)."""
        values = self.values_at(shapes)
        base = self.base.plan
        types = dict(base.types)
        for name, slots in self.types.items():
            shape = tuple(evaluate(s, values) for s in slots)
            check_tensor_size(f"value '{name}'", types[name].dtype, shape)
            types[name] = TensorType(types[name].dtype, shape)
        steps: list[Step] = list(base.steps)
        for index, (slots, offset) in self.views.items():
            view = steps[index]
            assert isinstance(view, ViewStep)
            steps[index] = replace(view, shape=tuple(evaluate(s, values) for s in slots),
                                   offset=evaluate(offset, values))
        kernels = list(self.base.kernels)
        for index, (st, g) in enumerate(zip(steps, self.base.generics)):
            if g is not None:
                assert isinstance(st, KernelStep)
                given = {n: evaluate(e, values) for n, e in self.sizes[index].items()}
                if given == self.base_sizes[index]:
                    continue   # the base plan's kernel at its sizes
                spec = g.kernel.specialize_at(given, *(placeholder(types[n]) for n in st.inputs))
                if spec.output_shapes != tuple(tuple(types[n].shape) for n in st.defines):
                    raise IRVerificationError(f"step {st.label}: the kernel's outputs have shapes "
                                              f"{spec.output_shapes}, the template's buffers "
                                              f"{[types[n] for n in st.defines]}")
                steps[index] = replace(st, definition=spec.definition, source=g.template.source)
                kernels[index] = spec
        constants = dict(base.constants)
        for name, slots in self.constants.items():
            array = constants[name]
            constants[name] = np.array([evaluate(s, values) for s in slots], array.dtype).reshape(array.shape)
        memory = plan_memory(tuple(steps), types, set(base.outputs))
        plan = Plan(base.name, base.inputs, base.outputs, types, constants, tuple(steps), memory, None,
                    base.specialized)
        for index in self.views:
            view = plan.steps[index]
            assert isinstance(view, ViewStep)
            plan.verify_view(view, f"step {view.label}")
        return CompiledPlan(plan, tuple(kernels), generic=self.base.generic)


def _sample(plan: Plan, like: CompiledPlan) -> CompiledPlan:
    """A probe's plan as a sample beside compiled plans like ``like`` (no kernels)."""
    return CompiledPlan(plan, (None,) * len(like.kernels))


class PlanTemplates:
    """A model's plan templates (the latest :data:`TEMPLATES`), per specialized values,
    and the plans it planned (the samples they are fitted to); ``placeholder`` makes an
    array of a type, for binding a kernel's sizes."""

    def __init__(self, placeholder: Callable[[TensorType], np.ndarray]) -> None:
        self._placeholder = placeholder
        # each with the values it is specialized to and its program (None: instantiated)
        self._templates: list[tuple[object, PlanTemplate, TemplateProgram | None]] = []
        self._samples: list[tuple[object, tuple, CompiledPlan]] = []   # the latest first
        self._lock = threading.Lock()

    def find(self, shapes: Mapping[str, tuple[int, ...]], values: object) -> CompiledPlan | TemplatedPlan | None:
        """The plan at ``shapes`` from a template that accepts them, or None (plan it). A
        template that turns out not to hold there (a kernel's sizes that its buffers do
        not give) is dropped."""
        with self._lock:
            found = [(t, p) for v, t, p in self._templates if v == values and t.accepts(shapes)]
        for template, program in found:
            try:
                laid = None if program is None else program.lay_out(template.values_at(shapes))
                if laid is None:
                    return template.instantiate(shapes, self._placeholder)
                return TemplatedPlan(*laid, template.base.generic, template.base.program,
                                     lambda: template.instantiate(shapes, self._placeholder))
            except (ShapeError, IRVerificationError, AccessRangeError):
                with self._lock:
                    self._templates = [entry for entry in self._templates if entry[1] is not template]
        return None

    def learn(self, compiled: CompiledPlan, values: object, planner: Planner | None = None,
              arrays: Mapping[str, np.ndarray] | None = None, probes: list[Plan] | None = None) -> None:
        """Keep ``compiled`` (just planned, for the specialized ``values``: ``arrays``) as
        a sample, and make a template from it and the latest earlier plans of its kind
        (the same steps, each input dimension in the same bucket). Where two plans of the
        kind are too few and ``compiled`` runs symbolic kernels, the model's ``planner``
        plans it at made-up shapes of the kind (no kernels compiled: plans only, each a
        sample whose texts the template's kernels must match; input dimensions of one
        name in the model change together). ``probes``: plans at made-up shapes already
        made (a compile ahead of the first call's)."""
        plan = compiled.plan
        kind = (tuple(st.label for st in plan.steps),
                tuple(tuple(_bucket(int(d)) for d in plan.types[n].shape) for n in plan.inputs))
        with self._lock:
            self._samples.insert(0, (values, kind, compiled))
            del self._samples[SAMPLES * TEMPLATES:]
            samples = [c for v, k, c in self._samples if v == values and k == kind][:SAMPLES]
        if probes:
            samples = [compiled, *(_sample(p, compiled) for p in probes)]
        template = PlanTemplate.make(samples) if len(samples) >= 3 else None
        if template is None and planner is not None and len(samples) == 2 and compiled.generic:
            names = {(v.name, axis): d for v in planner.graph.inputs for axis, d in enumerate(v.type.shape)
                     if isinstance(d, str)}
            shapes = {n: tuple(int(d) for d in plan.types[n].shape) for n in plan.inputs}

            def moving(n: str, axis: int) -> object:
                """The dimensions that differ between the samples (one name: one size)."""
                differ = len({int(c.plan.types[n].shape[axis]) for c in samples}) > 1
                return names.get((n, axis), (n, axis)) if differ else None
            made = (probe(planner, moved, arrays or {}) for moved in probe_shapes(shapes, moving, len(samples)))
            template = PlanTemplate.make(samples + [_sample(p, compiled) for p in made if p is not None])
        if template is not None:
            program = TemplateProgram.of(template)
            with self._lock:
                self._templates.insert(0, (values, template, program))
                del self._templates[TEMPLATES:]
                # (the kind's samples are no longer needed: plans the model dropped go)
                self._samples = [(v, k, c) for v, k, c in self._samples if (v, k) != (values, kind)]


def probe(planner: Planner, shapes: dict[str, tuple[int, ...]], values: Mapping[str, np.ndarray]) -> Plan | None:
    """The plan at made-up ``shapes``, or None where the model refuses them."""
    try:
        check_shapes(planner.graph.inputs, shapes)
        return planner.plan(shapes, values)
    except PolyfuseError:
        return None


def probe_shapes(shapes: Mapping[str, tuple[int, ...]], moving: Callable[[str, int], object],
                 samples: int) -> list[dict[str, tuple[int, ...]]]:
    """Input shapes at which to plan probes for a template beside ``samples`` plans:
    ``shapes`` with each dimension ``moving`` names (None: it stays; one name, one size)
    moved up, the k-th probe's j-th size by ``k ** (j + 1)`` (points in general position:
    the affine fits are determined, and the last one checks them), as many as make the
    samples one more than an affine function of the sizes has coefficients."""
    sizes = list(dict.fromkeys(m for n, s in shapes.items() for axis in range(len(s))
                               if (m := moving(n, axis)) is not None))

    def moved(k: int) -> dict[str, tuple[int, ...]]:
        return {n: tuple(d if (m := moving(n, axis)) is None else d + k ** (sizes.index(m) + 1)
                         for axis, d in enumerate(s)) for n, s in shapes.items()}
    return [moved(k) for k in range(1, len(sizes) + 3 - samples)]
