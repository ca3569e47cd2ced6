"""Compiled graphs: what ``polyfuse.compile`` returns.

A :class:`CompiledModel` holds the graph; for each set of input shapes its planner lowers
it into a :class:`~polyfuse.ir.plan.Plan` (the re-planning protocol,
:class:`~polyfuse.ir.plan.Planner`: the runtime's one way into the lowering), whose kernel
steps are compiled here for the target (cached per shapes). ``run`` checks the feed, then
runs the plan's steps, its loops and branches included: as one native program where the
target allows, else step by step (:mod:`polyfuse.runtime.stepwise`). A plan that ends at
control flow the program cannot run, at an op whose output sizes the data decides
(NonZero, ...) or before a node needing a value it computes (its ``tail``) is continued
by :mod:`polyfuse.runtime.interpreted_control`, from Python: the branch or loop body, or
the outputs cut to their counts, then the rest of the graph, each a CompiledModel of its
own (planned by the planner's ``subgraph``).
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from polyfuse.errors import (ArgumentError, BoundsError, IRVerificationError, NeedsValue, OptionError, ShapeError,
                             TargetError, UnsupportedOpError)
from polyfuse.ir.graph import Graph, TensorType, Value, value_sources
from polyfuse.ir.profile import Profile
from polyfuse.ir.plan import ControlStep, MemoryPlan, Plan, Planner, ViewStep
from polyfuse.ir.steps import leaves
from polyfuse.runtime import compile_threads, native
from polyfuse.runtime.arguments import placeholder
from polyfuse.runtime.generalize import Generalizer, Generic
from polyfuse.runtime.interpreted_control import retyped, run_tail
from polyfuse.runtime.plan_template import PlanTemplates, probe, probe_shapes
from polyfuse.runtime.template_program import TemplatedPlan
from polyfuse.runtime.feeds import (all_shapes, check_feed, check_shapes, declared_outputs, positional_feed,
                                    shape_arg, signature)
from polyfuse.runtime.kernel import Kernel, SpecializedKernel, Tuning, compiles_symbolic
from polyfuse.runtime.profiling import ModelSource, observed, record
from polyfuse.runtime.saved_programs import CALLS, ModelStore
from polyfuse.runtime.instructions import Run, straight
from polyfuse.runtime.program import CONSTANT, CompiledPlan, ProgramLayout
from polyfuse.runtime.stepwise import run_steps
from polyfuse.scheduler.options import MappingOptions
from polyfuse.scheduler.pipeline import Usage
from polyfuse.targets import Device, Target


# the stages of each kernel that dump() shows ("kernels" is "specialized"); CPU targets
# have llvm and asm, cuda has gpu (the mapped loops), cuda (CUDA C), ptx, cubin, ptxas
# (registers, shared memory, spills) and sass (nvdisasm's machine code)
KERNEL_STAGES = ("specialized", "loops", "llvm", "asm", "gpu", "cuda", "ptx", "cubin", "ptxas", "sass")

# A plan is specialized to the values of the inputs a lowering needs at plan time (a
# Reshape's shape, axes, pads, Resize scales, a TopK's k fed at run time: the inputs a
# NeedsValue names, or those the needed value is computed from), of at most this many
# elements, and to boolean scalars (flags, an If's condition: the plan then holds the
# branch taken). Every other input is data, whatever its dtype and size: token ids,
# positions, masks and the indices of a Gather never make a plan per value.
VALUE_INPUT_MAX = 64

# the size of each named input dimension at which compile(input_shapes=...) with names
# compiles ahead of the first call (kernels for symbolic sizes: the heuristics choose
# for any value of them, so this only needs to be in the bucket of sizes >= 2)
AHEAD_SIZE = 16

# the plans a model keeps by default (see CompiledModel.max_plans): the least recently
# used goes first, with its program, arena layout, packed copies of the weights and the
# kernels no other plan uses
MAX_PLANS = 16


def _compile_plan(plan: Plan, target: Target, options: MappingOptions | None,
                  tuning: Tuning | None, precision: str = "ieee",
                  generalizer: Generalizer | None = None,
                  packed_before: Mapping[str, np.ndarray] | None = None) -> CompiledPlan:
    """Every kernel step of ``plan`` compiled for ``target``, and what runs them. Steps of
    one TC text on buffers of one type (a recurrence's time steps) share one kernel, when
    each step has constant values for the parameters the kernel reads packed. A step's
    private temporaries are outputs no one reads after it: the kernel need not store them.
    With a ``generalizer`` (the model's), a text that differs from one of an earlier plan
    only in sizes runs its template's kernel, compiled once for symbolic sizes
    (:mod:`polyfuse.runtime.generalize`).

    Kernels of different texts compile on
    :data:`~polyfuse.runtime.compile_threads.THREADS` threads, so that one is
    scheduled while another's machine code is made (the runtime's cache lets each stage
    run one kernel at a time). ``packed_before``: the plan's packed constants made before
    (a program of it loaded from the disk), not packed again."""
    steps = list(leaves(plan.steps))
    kernels: list[SpecializedKernel | None] = [None] * len(steps)
    generic: list[Generic | None] = [None] * len(steps)
    groups: dict[tuple, list[int]] = {}
    for i, st in enumerate(steps):
        if not isinstance(st, ViewStep):
            discarded = frozenset(t.name for t in st.definition.outputs[len(st.outputs):])
            groups.setdefault((st.source, tuple(plan.types[n] for n in st.inputs), discarded), []).append(i)

    # the texts generalized: the definitions as the lowering left them, printed
    texts: dict[int, str] = {}
    if generalizer is not None:
        texts = {indices[0]: str(steps[indices[0]].definition) for indices in groups.values()}
        generalizer.alike(texts.values())

    def compile_group(group: tuple[tuple, list[int]]) -> None:
        (_, _, discarded), indices = group
        general = generalizer.find(texts[indices[0]], steps[indices[0]].label) if generalizer is not None else None
        alike: list[SpecializedKernel] = []
        for i in indices:
            st = steps[i]
            constants = frozenset(p.name for p, n in zip(st.definition.params, st.inputs) if n in plan.constants)
            spec = next((k for k in alike if _packed_sources(k) <= constants), None)
            if spec is None:
                if general is None:
                    kernel = Kernel(st.definition, target, st.source, options, tuning,
                                    Usage(constants, discarded, precision))
                else:
                    assert generalizer is not None
                    kernel = generalizer.kernel(general.template, constants, discarded, lambda d, fixed: Kernel(
                        d, target, general.template.source, options, tuning, Usage(fixed, discarded, precision),
                        symbolic=True))
                    generic[i] = Generic(general.template, kernel)
                spec = kernel.specialize_at(general.sizes if general is not None else {},
                                            *(_placeholder(plan.types[n]) for n in st.inputs))
                alike.append(spec)
            else:
                generic[i] = next((generic[j] for j in indices if kernels[j] is spec), None)
            if spec.output_shapes != tuple(tuple(plan.types[n].shape) for n in st.defines):
                raise IRVerificationError(f"step {st.label}: the kernel's outputs have shapes "
                                          f"{spec.output_shapes}, the plan's buffers "
                                          f"{[plan.types[n] for n in st.defines]}")
            kernels[i] = spec

    compile_threads.each(compile_group, list(groups.items()))
    if generalizer is not None:
        generalizer.remember(texts.values(), (steps[i].label for i in texts))
    compiled = CompiledPlan(plan, tuple(kernels), generic=tuple(generic) if any(generic) else ())
    return dataclasses.replace(compiled, program=_program(compiled, target, packed_before))


def _packed_sources(kernel: SpecializedKernel) -> frozenset[str]:
    """The parameters ``kernel`` reads from copies packed before it runs."""
    layout = getattr(kernel.run, "layout", None)
    return frozenset(p.source for _, _, p in getattr(layout, "packed", ()))


def _placeholder(t: TensorType) -> np.ndarray:
    return placeholder(t.shape, t.dtype.numpy)


class _NativeProgram:
    """Every step of a plan as one native call (:class:`polyfuse.runtime.native.Program`):
    intermediates in one arena, weights bound once by address, graph outputs written
    straight into the arrays returned, loops and branches run by the program's jumps."""

    def __init__(self, layout: ProgramLayout, made: tuple[native.Program, _NativeProgram] | None = None) -> None:
        """``made``: the layout's native program made already, with the calls of another
        program's (a plan template's base program patched: runtime/template_program)."""
        self.layout = layout
        self.labels: list[str]
        self.refusal: str | None
        if made is not None:
            self.program, like = made
            self.labels, self.refusal = like.labels, like.refusal
            return
        self.program = native.Program()
        self.labels = [call.label for call in layout.calls]
        # code for a CPU this one is not: refused when run (see CpuExecutable.refusal)
        self.refusal = next((c.executable.refusal for c in layout.calls if c.executable.refusal), None)
        address = {name: array.ctypes.data for name, array in layout.constants.items()}

        def place(base: int, index: Any, offset: int) -> tuple[int, int, int]:
            return (base, address[index] + offset, 0) if base == CONSTANT else (base, index, offset)
        for ins in layout.code:
            if isinstance(ins, Run):
                call = layout.calls[ins.call]
                self.program.add(call.executable.jit.address, [place(*a) for a in call.args], list(call.zero))
            else:
                ins.native(self.program, place)

    @staticmethod
    def build(compiled: CompiledPlan, packed_before: Mapping[str, np.ndarray] | None = None) -> _NativeProgram | None:
        """The program, or None when a step is not native code of the CPU runtime."""
        from polyfuse.runtime.cpu import CpuExecutable
        from polyfuse.runtime.kernel import SizesBound
        for _, kernel in compiled.steps():
            run = kernel.run.executable if isinstance(kernel.run, SizesBound) else kernel.run
            if not isinstance(run, CpuExecutable) or set(run.layout.scalars) - set(getattr(kernel.run, "sizes", ())):
                return None
        return _NativeProgram(ProgramLayout.of(compiled, packed_before))

    def run(self, env: dict[str, np.ndarray], times: np.ndarray | None = None) -> dict[str, np.ndarray]:
        if self.refusal:
            raise TargetError(self.refusal)
        inputs = [env[t.name] for t in self.layout.inputs]
        arena = native.empty_aligned(self.layout.arena_bytes, np.uint8)
        slots = [native.empty_aligned(shape, dtype) for shape, dtype in self.layout.slots]
        failed = self.program.run(arena, inputs, slots, times)
        if failed >= 0:
            raise BoundsError.in_kernel(self.labels[failed])
        return self.layout.collect(inputs, slots)


@dataclasses.dataclass(frozen=True)
class LoadedPlan:
    """A plan's program loaded from the disk (:mod:`polyfuse.runtime.saved_programs`),
    without the plan: what runs it. A model asked for the plan itself plans it again."""

    program: _NativeProgram
    tail: None = None


def _program(compiled: CompiledPlan, target: Target, packed_before: Mapping[str, np.ndarray] | None = None) -> Any:
    """What runs a plan's kernels as one unit: a native program in this process, a
    program run under an emulator, a program on the GPU, or None (each step runs by
    itself)."""
    if target.backend.device is Device.GPU:   # loops and branches: each step by itself
        from polyfuse.runtime.cuda import CudaProgram
        layout = ProgramLayout.of(compiled)
        return CudaProgram(layout) if straight(layout.code) else None
    if not target.backend.cpus:
        return None
    from polyfuse.runtime import cross
    from polyfuse.targets.cpu import runs_natively
    if runs_natively(target):
        return _NativeProgram.build(compiled, packed_before)
    return cross.CrossProgram(ProgramLayout.of(compiled), target)


class CompiledModel:
    """A graph compiled for a target; ``run({name: array}) -> {name: array}``.

    ``planner`` (the re-planning protocol, :class:`~polyfuse.ir.plan.Planner`) lowers
    its graph for each new set of input shapes; ``stages`` are the texts :meth:`dump` shows before
    kernels (the graph after each pass, the fusion groups); ``tuning`` gives kernels their
    tuned options and names them as tuning tasks. The model keeps the ``max_plans``
    plans used last (:data:`MAX_PLANS` by default; settable): a call at shapes of a plan
    it dropped plans them again, its kernels from the disk cache."""

    def __init__(self, planner: Planner, target: Target, *,
                 options: MappingOptions | None = None,
                 input_shapes: Mapping[str, tuple[int, ...]] | None = None,
                 stages: Mapping[str, object] | None = None, tuning: Tuning | None = None,
                 source: ModelSource | Callable[[], ModelSource] | None = None, max_plans: int = MAX_PLANS,
                 precision: str = "ieee", sizes: str = "symbolic", store: ModelStore | None = None,
                 io: tuple[tuple[Value, ...], tuple[Value, ...]] | None = None,
                 value_inputs: Iterable[str] = ()) -> None:
        """A model whose planner makes its graph when first asked (a model found on the
        disk) is given what is known before: its inputs and outputs (``io``), the
        inputs whose values plans take, ``stages`` and ``source`` as made when first read.
        ``store``: where the model's programs are saved and found
        (:mod:`polyfuse.runtime.saved_programs`)."""
        if not all(inspect.getattr_static(planner, name, None) is not None
                   for name in ("graph", "plan", "subgraph", "definition")):   # (read: no graph made)
            # a bare function would be a call into lowering
            raise ArgumentError(f"a compiled model is made from a polyfuse.ir.plan.Planner (with "
                                f"graph, plan and subgraph), not a {type(planner).__name__}")
        self._planner = planner
        self._io = io or (planner.graph.inputs, planner.graph.outputs)
        self._stages = stages if stages is not None else {}
        self._source = source   # what profile_ranges observes
        self.target = target
        self.options = options
        self.tuning = tuning
        self.precision = precision   # "tf32": float32 contractions may run on TF32 tensor cores
        self._store = store
        # plans from the disk: shapes, values, the program's constants
        self._loaded: dict[tuple, tuple[dict[str, tuple], dict[str, np.ndarray], dict[str, np.ndarray]]] = {}
        self._saved: set[tuple] = set()   # plans saved (or loaded) by this process
        self._plans: OrderedDict[tuple, CompiledPlan | LoadedPlan] = OrderedDict()   # the last used last
        self._plans_lock = threading.Lock()   # guards _plans' order
        self._planning = threading.Lock()  # threads calling at a new shape plan it once
        self._submodels: dict[tuple, tuple[object, CompiledModel]] = {}   # bodies, branches, rests
        self.max_plans = max_plans
        self._value_inputs: set[str] = set(value_inputs)  # inputs whose values the lowerings need
        # kernels for the sizes that change between plans (CPU code this process runs)
        self.sizes = sizes
        self._generalizer = Generalizer(planner.definition) if sizes == "symbolic" and compiles_symbolic(target) else None
        # plans at new shapes made from earlier ones that differ only in sizes
        self._templates = PlanTemplates(_placeholder) if self._generalizer is not None else None
        # plans made by the planner, and from plan templates (polyfuse.runtime.plan_template)
        # and from the disk (programs saved by an earlier process)
        self.plan_counts = {"planned": 0, "templated": 0, "loaded": 0}
        if input_shapes is not None and not isinstance(input_shapes, Mapping):
            raise ShapeError(f"input_shapes must be a dict {{name: shape}}, got "
                             f"{type(input_shapes).__name__}; the inputs are {signature(self.inputs)}")
        self.input_shapes = {n: shape_arg(n, s, symbolic=True) for n, s in (input_shapes or {}).items()}
        if self.input_shapes:
            check_shapes(self.inputs, self.input_shapes)
            shapes = {v.name: tuple(self.input_shapes.get(v.name, v.type.shape)) for v in self.inputs}
            if self._templates is not None and any(isinstance(d, str) for s in shapes.values() for d in s):
                self._compile_ahead(shapes)
            else:
                self._plan(shapes, loaded=True)

    def _compile_ahead(self, named: dict[str, tuple]) -> None:
        """Compile now for every size of the named dimensions in ``named`` (input shapes
        with names where a size is left open; one name, one size): the model is planned
        with each name at :data:`AHEAD_SIZE` and at made-up sizes above it (plans only,
        moved as a plan template's probes are), so the first plan's kernels
        whose texts the sizes change compile for symbolic sizes, and the plans make the
        plan template that serves every later shape whose named dimensions are 2 or more.
        A size of 1 is a kind of its own (a batch of one): each name is then planned at
        1 the same way, the others moving, where the model takes it (a size of 0 is
        planned when a call brings it)."""
        names = list(dict.fromkeys(d for s in named.values() for d in s if isinstance(d, str)))
        try:
            self._ahead(named, None)
        except (ShapeError, UnsupportedOpError) as err:
            raise ShapeError(f"compiling ahead plans each named input dimension ({', '.join(names)}) at "
                             f"{AHEAD_SIZE}, where the model refuses: {err}; give those dimensions sizes "
                             "in input_shapes instead, or leave them to the first call") from None
        for one in names:
            try:
                self._ahead(named, one)
            except (ShapeError, UnsupportedOpError):   # (a model that takes no size of 1 there)
                continue

    def _ahead(self, named: dict[str, tuple], one: str | None) -> None:
        """Plan and compile ahead the kind of ``named``'s shapes with the name ``one`` at
        1 (None: none) and the others at :data:`AHEAD_SIZE`, with probes moving those."""
        assert self._generalizer is not None and self._templates is not None
        shapes = {n: tuple((1 if d == one else AHEAD_SIZE) if isinstance(d, str) else d for d in s)
                  for n, s in named.items()}

        def name(n: str, axis: int) -> str | None:
            d = named[n][axis]
            return d if isinstance(d, str) and d != one else None
        probes = [plan for plan in (probe(self._planner, moved, {}) for moved in probe_shapes(shapes, name, 1))
                  if plan is not None]
        self._generalizer.remember([str(st.definition) for plan in probes for st in plan.kernels],
                                   [st.label for plan in probes for st in plan.kernels])
        compiled = self._plan(shapes)
        self._templates.learn(compiled, (), probes=probes)

    @property
    def inputs(self) -> tuple[Value, ...]:
        return self._io[0]

    @property
    def outputs(self) -> tuple[Value, ...]:
        return self._io[1]

    @property
    def graph(self) -> Graph:
        """The graph the model plans (after the graph passes)."""
        return self._planner.graph

    @property
    def source(self) -> ModelSource | None:
        """What the model was compiled from (what profile_ranges observes), or None."""
        return self._source() if callable(self._source) else self._source

    def _plan(self, shapes: dict[str, tuple], values: dict[str, np.ndarray] | None = None, *,
              loaded: bool = False) -> Any:
        """The plan for these input shapes and values: one kept, else made (and kept).
        ``loaded``: a program loaded from the disk, without its plan, will do (a
        :class:`LoadedPlan`); else the plan is planned again where it was one."""
        unbound = {f"{n}[{k}]={d}" for n, s in shapes.items() for k, d in enumerate(s)
                   if not isinstance(d, int)}
        if unbound:
            raise ShapeError(f"input dimensions {sorted(unbound)} are symbolic; call the model "
                             "with arrays, or pass input_shapes={name: shape} to compile() (names "
                             "there compile ahead for every size with sizes='symbolic' on a CPU "
                             "this process runs)")
        values = values or {}
        key = (tuple(sorted(shapes.items())),
               tuple((n, v.tobytes()) for n, v in sorted(values.items())))
        with self._plans_lock:
            compiled = self._plans.get(key)
            if compiled is not None and (loaded or not isinstance(compiled, LoadedPlan)):
                self._plans.move_to_end(key)
                return compiled
        with self._planning:
            compiled = self._plans.get(key)
            if isinstance(compiled, LoadedPlan) and not loaded:
                self._replay()
                compiled = self._plans.get(key)
            if compiled is None:
                check_shapes(self.inputs, shapes)
                compiled = self._new_plan(shapes, values, key, loaded)
                with self._plans_lock:
                    self._plans[key] = compiled
                    self._drop_plans()
        return compiled

    def _new_plan(self, shapes: dict[str, tuple], values: dict[str, np.ndarray], key: tuple,
                  load: bool, packed_before: Mapping[str, np.ndarray] | None = None) -> Any:
        """A plan not kept (the caller holds ``_planning``): from a plan template, else
        (with ``load``) the program saved on the disk, else planned and compiled; saved
        for later processes where it runs as one native program."""
        compiled = self._templates.find(shapes, key[1]) if self._templates is not None else None
        if compiled is None:
            layout = self._store.load(key, self.target) if load and self._store is not None else None
            if layout is not None:
                self._loaded[key] = (shapes, values, layout.constants)
                self._saved.add(key)
                self.plan_counts["loaded"] += 1
                return LoadedPlan(_NativeProgram(layout))
            if self._loaded:   # the plans loaded, planned again: their templates may serve this shape
                self._replay()
                compiled = self._templates.find(shapes, key[1]) if self._templates is not None else None
        if isinstance(compiled, TemplatedPlan):   # its layout made from the template's
            compiled.program = _NativeProgram(compiled.layout, (compiled.native, compiled.base))
            self.plan_counts["templated"] += 1
        elif compiled is not None:
            compiled = dataclasses.replace(compiled, program=_program(compiled, self.target))
            self.plan_counts["templated"] += 1
        else:
            self.plan_counts["planned"] += 1
            plan = self._planner.plan(dict(shapes), dict(values))
            compiled = _compile_plan(plan, self.target, self.options, self.tuning, self.precision,
                                     self._generalizer, packed_before)
            if self._templates is not None:
                self._templates.learn(compiled, key[1], self._planner, values)
            # (a plan from a template is not saved: a few milliseconds to make again once
            # the plans it was learned from are, and a model meeting a new shape on every
            # call would fill the disk)
            if self._store is not None and key not in self._saved and isinstance(compiled.program, _NativeProgram) \
                    and compiled.tail is None:
                self._saved.add(key)
                self._store.save(key, compiled.program.layout, self.inputs, self.outputs, self._value_inputs)
        return compiled

    def _replay(self) -> None:
        """Plan again the plans loaded from the disk, in the order they were first used
        (the caller holds ``_planning``), as the process that saved them made them: the
        kernels and plan templates of later shapes are then the same."""
        loaded, self._loaded = self._loaded, {}
        for key, (shapes, values, constants) in loaded.items():
            compiled = self._new_plan(shapes, values, key, False, constants)   # (its packed weights loaded)
            with self._plans_lock:
                if key in self._plans:
                    self._plans[key] = compiled

    @property
    def max_plans(self) -> int:
        """How many plans (one per set of input shapes, and of the values a plan is
        specialized to) the model keeps; setting it drops the least recently used."""
        return self._max_plans

    @max_plans.setter
    def max_plans(self, limit: int) -> None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise OptionError(f"max_plans is the number of plans a model keeps, an int >= 1; "
                              f"got {limit!r}")
        self._max_plans = limit
        with self._plans_lock:
            self._drop_plans()

    @property
    def planned_shapes(self) -> list[dict[str, tuple[int, ...]]]:
        """The input shapes of the plans the model keeps, the least recently used first."""
        with self._plans_lock:
            return [dict(key[0]) for key in self._plans]

    def _drop_plans(self) -> None:
        """Drop the least recently used plans past :attr:`max_plans`, and the rest of the
        graph compiled after each one's control flow (the caller holds the lock). Their
        memory goes with the last reference: a kernel that a kept plan shares stays."""
        while len(self._plans) > self._max_plans:
            _, dropped = self._plans.popitem(last=False)
            tail = dropped.tail
            if tail is not None:
                for key, (owner, _) in list(self._submodels.items()):
                    if owner is tail:
                        del self._submodels[key]

    def dump(self, stage: str) -> str:
        """The text of one stage of compilation: the graph after a pass (``input``,
        ``fold_batch_norms``, ..., see :data:`STAGES`), ``groups`` (the fusion
        decisions), ``plan`` (the latest :class:`~polyfuse.ir.plan.Plan`), or, for its
        kernels, ``comprehension`` (their definitions as the op library or the fusion
        group's composition gave them), ``comprehension:<pass>`` (after each comprehension
        pass), ``kernels`` (their TC as compiled), ``loops``, ``loops:<pass>`` (after each
        loop pass), ``llvm``, ``asm`` (kernel stages, each kernel headed by its label)."""
        if stage in self._stages:
            return str(self._stages[stage])
        if stage == "plan":
            return str(self._latest_plan("stage 'plan'").plan)
        if stage.partition(":")[0] == "comprehension":
            return self._definitions(stage)
        kernel_stage = {"kernels": "specialized"}.get(stage, stage)
        # "loops:<pass>" and "gpu:<pass>": the loop IR after each named loop pass
        if kernel_stage in KERNEL_STAGES or kernel_stage.partition(":")[0] in ("loops", "gpu"):
            compiled = self._latest_plan(f"stage '{stage}' and other kernel stages")
            kernels = [(st.label, k.stages) for st, k in compiled.steps()]
            if kernels and not any(kernel_stage in stages for _, stages in kernels):
                have = kernels[0][1]
                present = [s for s in KERNEL_STAGES[1:] if s in have] + [s for s in have if ":" in s]
                raise ArgumentError(f"kernels for {self.target} have no stage '{stage}'; they have "
                                    f"kernels, {', '.join(present)}")
            return "\n\n".join(f"// {label}\n{stages.get(kernel_stage, '')}" for label, stages in kernels)
        known = [*self._stages, "plan", "comprehension", "kernels", *KERNEL_STAGES[1:]]
        raise ArgumentError(f"no stage '{stage}'; stages: {', '.join(known)}")

    def _definitions(self, stage: str) -> str:
        """Each kernel step's definition after comprehension pass ``stage``
        (``comprehension:<pass>``; ``comprehension`` alone: before the first), for the
        steps that ran it."""
        name = stage.partition(":")[2] or "input"
        steps = self._latest_plan(f"stage '{stage}'").plan.kernels
        shown = [f"// {st.label}\n{d}" for st in steps for ran, d in st.history if ran == name]
        if not shown:
            ran = dict.fromkeys(f"comprehension:{n}" for st in steps for n, _ in st.history[1:])
            raise ArgumentError(f"no kernel of the plan ran comprehension pass '{name}'; stages: "
                                f"{', '.join(['comprehension', *ran]) if steps else '(no kernels)'}")
        return "\n\n".join(shown)

    def tasks(self, **shapes: tuple[int, ...]) -> list[Any]:
        """Every kernel of the model as a tuning task, for these input shapes (those given
        to ``compile`` or of the latest call when none are given here); steps sharing one
        kernel (a recurrence's time steps) are one task, named by the first."""
        if self.tuning is None:
            raise ArgumentError("this model was compiled without the autotuner; compile it with "
                                "polyfuse.compile() to list its tuning tasks")
        compiled = self._plan(all_shapes(self.inputs, shapes, "tasks")) if shapes \
            else self._latest_plan("tasks")
        types = compiled.plan.types
        first = {id(kernel): st for st, kernel in reversed(list(compiled.steps()))}
        return [self.tuning.task(st.definition, [_placeholder(types[n]) for n in st.inputs],
                                 self.target, st.label)
                for st, kernel in compiled.steps()
                if first[id(kernel)] is st and not st.definition.scalars]

    def _latest_plan(self, what: str) -> CompiledPlan:
        """The plan of the latest run (or of ``input_shapes``); for a model whose inputs
        all have fixed shapes, the plan of those shapes."""
        declared = {v.name: v.type.shape for v in self.inputs}
        if not self._plans and all(isinstance(d, int) for s in declared.values() for d in s):
            return self._plan(declared)
        if not self._plans:
            raise ArgumentError(f"{what} need input shapes: run the model once, pass "
                                "input_shapes to compile(), or give the shapes here")
        with self._plans_lock:
            key, found = next(reversed(self._plans.items()))
        if isinstance(found, LoadedPlan):
            with self._planning:
                self._replay()
            found = self._plans[key]
        assert not isinstance(found, LoadedPlan)   # (planned again)
        return found

    def save_bundle(self, out_dir: Any, name: str = "model", *, threads: bool = False,
                    shapes: Mapping[str, tuple[int, ...]] | None = None) -> list[Any]:
        """Write the model as an ahead-of-time bundle for its target (x86 or aarch64):
        ``NAME.o``, ``NAME.h``, ``NAME.weights.bin`` and an example ``main.c`` (see
        :mod:`polyfuse.runtime.bundle`); the paths written."""
        from polyfuse.runtime.bundle import write_bundle
        return write_bundle(self, out_dir, name, threads=threads, shapes=shapes)

    def plan_for(self, shapes: Mapping[str, tuple[int, ...]] | None = None) -> CompiledPlan:
        """The plan for these input shapes (all inputs), else that of the shapes given to
        ``compile`` or of the latest run; one a template's program runs, instantiated
        (each kernel with its own stages: a bundle links their code)."""
        found = self._latest_plan("a bundle") if not shapes else \
            self._plan(all_shapes(self.inputs, shapes, "plan_for"))
        return found.instance if isinstance(found, TemplatedPlan) else found

    def memory_plan(self, **shapes: tuple[int, ...]) -> MemoryPlan:
        """The activation arena for these input shapes (all inputs must be given)."""
        missing = [v.name for v in self.inputs if v.name not in shapes]
        if missing:
            raise ArgumentError(f"memory_plan needs the shape of every input; missing {missing}, "
                                f"e.g. memory_plan({missing[0]}=(1, 3, 224, 224))")
        return self._plan(all_shapes(self.inputs, shapes, "memory_plan")).plan.memory

    def run(self, feed: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return self._run(*self._prepare(feed))

    def run_trusted(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``run`` on a feed the runtime made (a body's or the rest's: contiguous numpy
        arrays, every input, of the element types and ranks the model was made for; the
        dimensions are bound by the call), without checking it again."""
        shapes = {n: a.shape for n, a in feed.items()}
        return self._run(self._planned(shapes, feed), dict(feed))

    def _run(self, compiled: CompiledPlan, env: dict[str, Any]) -> dict[str, np.ndarray]:
        with CALLS:   # (what saving programs waits out)
            if compiled.program is not None:
                results = compiled.program.run(env)
            else:
                run_steps(compiled, env)
                results = {name: env[name] for name in compiled.plan.outputs}
        if compiled.tail is not None:
            # data-dependent control flow: run from Python (see polyfuse.runtime.interpreted_control)
            results = run_tail(compiled.tail, env | results, self.graph, self._submodel)
        return declared_outputs(self.outputs, results)

    def _submodel(self, owner: object, make: Callable[[], Graph],
                  feed: Mapping[str, np.ndarray]) -> CompiledModel:
        """A subgraph or the rest of this graph (``make`` builds it) compiled as a model
        of its own, for inputs of the element types and ranks of ``feed``; cached per
        ``owner`` (the subgraph, or the plan's ControlStep)."""
        key = (id(owner), tuple((n, a.dtype.str, a.ndim) for n, a in feed.items()))
        found = self._submodels.get(key)
        if found is not None and found[0] is owner:
            return found[1]
        rest = isinstance(owner, ControlStep)
        planner = self._planner.subgraph(retyped(make(), dict(feed)), not rest)
        model = CompiledModel(planner, self.target, options=self.options, tuning=self.tuning,
                              max_plans=self.max_plans, precision=self.precision, sizes=self.sizes)
        self._submodels[key] = (owner, model)   # the owner held: its id stays its own
        return model

    def profile(self, feed: Mapping[str, Any], repeat: int = 10) -> list[tuple[str, float]]:
        """Each kernel's median seconds over ``repeat`` runs of ``feed`` (after one
        warm-up run), in the order they run: ``(label, seconds)``; a label names the node,
        or the fusion group and its nodes; a kernel in a loop, its seconds over all
        iterations. Kernels after data-dependent control flow the program cannot run (a
        plan's tail) are not listed."""
        if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
            raise ArgumentError(f"profile's repeat must be a positive int, got {repeat!r}")
        compiled, env = self._prepare(feed)
        program = compiled.program
        labels = program.labels if program is not None else [st.label for st in leaves(compiled.plan.steps)]
        samples: list[list[float]] = []
        for _ in range(repeat + 1):
            times = np.zeros(len(labels))
            if program is not None:
                program.run(env, times)
            else:
                run_steps(compiled, dict(env), times)
            samples.append(list(times))
        medians = np.median(np.array(samples[1:]), axis=0)
        return list(zip(labels, (float(t) for t in medians)))

    def profile_ranges(self, feeds: Iterable[Mapping[str, Any]]) -> Profile:
        """The ranges (minimum, maximum, histogram) of every float tensor of the model over
        ``feeds`` (each a feed of :meth:`run`), by the names the ONNX model gives them: the
        profile int8 quantization is calibrated from (see :mod:`polyfuse.ir.profile`)."""
        if self.source is None:
            raise ArgumentError("profile_ranges needs a model compiled from ONNX by "
                                "polyfuse.compile()")
        model = CompiledModel(self._planner.subgraph(observed(self.source.graph), True), self.target,
                              options=self.options)
        return record(model.run, self.inputs, feeds, self.source.digest)

    def _prepare(self, feed: Mapping[str, Any]) -> tuple[CompiledPlan, dict[str, Any]]:
        """The plan for ``feed`` and the checked inputs (numpy arrays; on the cuda target
        also arrays in GPU memory, used in place)."""
        env, shapes = check_feed(self.inputs, feed, on_gpu=self.target.backend.device is Device.GPU)
        return self._planned(shapes, env), env

    def _planned(self, shapes: dict[str, tuple[int, ...]], env: Mapping[str, Any]) -> CompiledPlan:
        """The plan for inputs of these shapes, specialized to the values it asks for."""
        while True:
            values = {n: a for n, a in env.items() if self._is_value(n, a)}
            try:
                return self._plan(shapes, values, loaded=True)
            except NeedsValue as need:  # e.g. a Reshape's shape fed at run time
                wanted = value_sources(self.graph, need.value_name) - set(values)
                fit = {n for n in wanted if isinstance(env.get(n), np.ndarray)
                       and env[n].size <= VALUE_INPUT_MAX}
                if not fit:
                    raise
                self._value_inputs |= fit

    def _is_value(self, name: str, a: Any) -> bool:
        """Whether the plan is specialized to the value of input ``name``: one a lowering
        needs, or a boolean scalar (see :data:`VALUE_INPUT_MAX`)."""
        if not isinstance(a, np.ndarray) or a.size > VALUE_INPUT_MAX:
            return False
        return name in self._value_inputs or (a.dtype == bool and a.size == 1)

    def __call__(self, *arrays: Any, **named: Any) -> tuple[np.ndarray, ...] | np.ndarray:
        """The outputs for the inputs in order (or all by name); one output alone, several
        as a tuple in the model's order."""
        out = self.run(positional_feed(self.inputs, arrays, named))
        values = tuple(out.values())
        return values[0] if len(values) == 1 else values
