"""Compiled graphs: what ``polyfuse.compile`` returns.

A :class:`CompiledModel` holds the graph; for each set of input shapes it builds a
plan (cached): every node lowered through the op library, nodes with constant inputs
folded at compile time, reshapes turned into views, and every other node a TC kernel
compiled for the target. ``run`` checks the feed, then runs the plan.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from polyfuse.autotune.records import Records
from polyfuse.autotune.task import Task
from polyfuse.errors import ArgumentError, BoundsError, DTypeError, ModelError, ShapeError
from polyfuse.frontends.tc import parse
from polyfuse.ir.comprehension import Definition
from polyfuse.ir.comprehension_interpreter import interpret
from polyfuse.ir.graph import Graph, Node, TensorType, Value
from polyfuse.ir.limits import check_bytes, check_tensor_size
from polyfuse.ir.symbolic import evaluate_int
from polyfuse.ir.types import DType
from polyfuse.lowering.bind_sizes import bind_sizes
from polyfuse.lowering.compose import Member, compose
from polyfuse.lowering.fusion import describe_groups
from polyfuse.lowering.graph_passes import PassManager
from polyfuse.lowering.ops import Folded, NeedsValue, OpContext, TCKernel, View, lower
from polyfuse.runtime import native
from polyfuse.runtime.arguments import bind_arguments, placeholder
from polyfuse.runtime.feeds import all_shapes, check_feed, check_shapes, positional_feed, shape_arg, signature
from polyfuse.runtime.kernel import Kernel, SpecializedKernel
from polyfuse.runtime.program import CONSTANT, MemoryPlan, ProgramLayout, plan_memory
from polyfuse.scheduler.options import MappingOptions
from polyfuse.targets import Device, Target


@dataclass
class _Step:
    """One kernel (or view) of a plan: the graph values it reads and defines."""

    label: str                 # the node, or the fusion group and its nodes
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    run: Any                   # callable(env) -> None
    spec: SpecializedKernel | None = None   # the kernel; None for a view
    temporaries: tuple[str, ...] = ()       # its private tensors, as values of the plan
    task: Task | None = None                # the kernel as a tuning task


# the stages of each kernel that dump() shows ("kernels" is "specialized"); CPU targets
# have llvm and asm, cuda has gpu (the mapped loops), cuda (CUDA C), ptx and cubin
KERNEL_STAGES = ("specialized", "loops", "llvm", "asm", "gpu", "cuda", "ptx", "cubin")

# Small integer inputs (shapes, axes, indices fed at run time) are treated as constants
# when planning, and the plan is specialized to their values.
VALUE_INPUT_MAX = 64


class _Plan:
    """The graph lowered for one set of input shapes: steps, folded constants, types,
    the memory plan and, on native targets, the program running every step."""

    def __init__(self, model: CompiledModel, shapes: dict[str, tuple[int, ...]],
                 values: dict[str, np.ndarray]) -> None:
        self.steps: list[_Step] = []
        self.model = model
        g = model.graph
        self.types: dict[str, TensorType] = {v.name: TensorType(v.type.dtype, shapes[v.name])
                                             for v in g.inputs}
        self.consts: dict[str, np.ndarray] = {c.name: c.array for c in g.constants} | values
        self.types.update({c.name: c.type for c in g.constants})
        readers: dict[str, int] = {}   # value -> position of its last reader
        for k, node in enumerate(g.nodes):
            readers.update({i: k for i in node.inputs if i})
        position = {node.name: k for k, node in enumerate(g.nodes)}
        outputs = {v.name for v in g.outputs}
        for unit in _units(g.nodes):
            last = position[unit[-1].name]
            exported = {o for n in unit for o in n.outputs
                        if o and (o in outputs or readers.get(o, -1) > last)}
            if len(unit) == 1 or not self.fused(unit, exported):
                for node in unit:
                    self.node(node)
        for v in g.outputs:   # onnxruntime refuses such a model too
            if v.name in self.types and self.types[v.name].dtype is not v.type.dtype:
                raise ModelError(f"graph output '{v.name}' is declared {v.type.dtype}, but the model "
                                 f"computes it as {self.types[v.name].dtype}; correct the output's "
                                 "element type in the model")
        self.memory = plan_memory(self.steps, self.types, outputs)
        check_bytes(f"the activation arena of graph '{g.name}' for input shapes {shapes} would take",
                    self.memory.arena_bytes)
        self.program = _program(self)

    def context(self, node: Node) -> OpContext:
        return OpContext(node, [self.types.get(i) if i else None for i in node.inputs],
                         [self.consts.get(i) if i else None for i in node.inputs],
                         self.model.graph.opset)

    def define(self, what: str, name: str, t: TensorType) -> None:
        """Record the type of value ``name`` (defined by ``what``, a node or group) once its
        size is known to fit in memory."""
        check_tensor_size(f"value '{name}' of {what}", t.dtype, tuple(int(d) for d in t.shape))
        self.types[name] = t

    def check_declared(self, what: str, d: Definition, names: list[str], outs: list[str]) -> None:
        """The sizes a TC definition declares for its outputs (values ``outs``, then
        temporaries) fit in memory: checked before anything is allocated."""
        try:
            sizes = bind_arguments(d, [self._placeholder(n) for n in names]).sizes
        except ShapeError as err:   # the node's inputs disagree (e.g. an einsum's sizes)
            raise ShapeError(f"{what}: {err}") from None
        for k, t in enumerate(bind_sizes(d, sizes).outputs):
            try:
                shape = tuple(evaluate_int(e, {}) for e in t.shape)
            except ValueError:
                continue    # sized by range inference: checked once specialized
            name = f"value '{outs[k]}'" if k < len(outs) else f"temporary '{t.name}'"
            check_tensor_size(f"{name} of {what}", t.dtype, shape)

    def node(self, node: Node) -> None:
        lowered = lower(self.context(node))
        what = f"node '{node.name}' ({node.op})"
        if isinstance(lowered, Folded):
            for name, array in zip(node.outputs, lowered.arrays):
                self.consts[name] = array
                self.define(what, name, _type(array))
        elif isinstance(lowered, View):
            src = node.inputs[lowered.input]
            self.define(what, node.outputs[0], TensorType(self.types[src].dtype, lowered.shape))
            if src in self.consts:
                self.consts[node.outputs[0]] = self.consts[src].reshape(lowered.shape)
            else:
                self.steps.append(_Step(node.name, (src,), node.outputs[:1],
                                        _view(src, node.outputs[0], lowered.shape)))
        else:
            d = parse(lowered.source).definitions[0]
            names = [node.inputs[i] for i in lowered.inputs] + self.bind_constants(node, lowered)
            outs = [node.outputs[i] for i in lowered.outputs]
            self.check_declared(what, d, names, outs)
            if all(n in self.consts for n in names):  # fold at compile time with the interpreter
                bound = bind_arguments(d, [self.consts[n] for n in names])
                results = interpret(d, bound.values, bound.sizes)
                for name, t in zip(outs, d.outputs):
                    self.consts[name] = results[t.name]
                    self.define(what, name, _type(results[t.name]))
                return
            self.kernel(what, node.name, d, lowered.source, names, outs)

    def _placeholder(self, value: str) -> np.ndarray:
        t = self.types[value]
        return placeholder(t.shape, t.dtype.numpy)

    def bind_constants(self, node: Node, k: TCKernel) -> list[str]:
        """Names for the arrays a lowering computed at compile time (repacked weights)."""
        names = [f"{node.name}:const{j}" for j in range(len(k.constants))]
        for name, array in zip(names, k.constants):
            self.consts[name] = array
            self.types[name] = _type(array)
        return names

    def kernel(self, what: str, label: str, d: Definition, source: str, names: list[str],
               outs: list[str]) -> None:
        kernel = Kernel(d, self.model.target, source, self.model.options, self.model.records)
        arrays = [self._placeholder(n) for n in names]
        spec = kernel.specialize(*arrays)
        temps = tuple(f"{label}#{t.name}" for t in d.outputs[len(outs):])
        for name, t, shape in zip(outs + list(temps), d.outputs, spec.output_shapes):
            self.define(what, name, TensorType(t.dtype, shape))
        params = [p.name for p in d.params]
        results = [t.name for t in d.outputs[:len(outs)]]
        task = None if d.scalars else Task.of(d, arrays, self.model.target, label)

        def run(env: dict[str, np.ndarray]) -> None:
            produced = spec.run({p: env[n] for p, n in zip(params, names)})
            for name, r in zip(outs, results):
                env[name] = produced[r]
        self.steps.append(_Step(label, tuple(names), tuple(outs), run, spec, temps, task))

    def fused(self, unit: list[Node], exported: set[str]) -> bool:
        """Lower a fusion group as one kernel; False (nothing done) when a member does
        not lower to a kernel or the first one reads only constants (it folds)."""
        members: list[Member] = []
        for node in unit:
            lowered = lower(self.context(node))
            if not isinstance(lowered, TCKernel):
                return False
            d = parse(lowered.source).definitions[0]
            names = [node.inputs[i] for i in lowered.inputs] + self.bind_constants(node, lowered)
            if not members and all(n in self.consts for n in names):
                return False
            sizes = bind_arguments(d, [self._placeholder(n) for n in names]).sizes
            bound = bind_sizes(d, sizes)
            outs = tuple(node.outputs[i] for i in lowered.outputs)
            for name, t in zip(outs, bound.outputs):
                self.define(f"node '{node.name}' ({node.op})", name,
                            TensorType(t.dtype, tuple(evaluate_int(e, {}) for e in t.shape)))
            members.append(Member(bound, tuple(names), outs))
        label = f"{unit[0].group}[{' '.join(n.name for n in unit)}]"
        composed = compose("fused", members, exported)
        self.kernel(f"fusion group {label}", label, composed.definition, str(composed.definition),
                    list(composed.params), list(composed.outputs))
        return True


def _units(nodes: tuple[Node, ...]) -> list[list[Node]]:
    """The nodes in runs: each fusion group's members together, other nodes alone."""
    units: list[list[Node]] = []
    for n in nodes:
        if n.group and units and units[-1][0].group == n.group:
            units[-1].append(n)
        else:
            units.append([n])
    return units


class _NativeProgram:
    """Every step of a plan as one native call (:class:`polyfuse.runtime.native.Program`):
    intermediates in one arena, weights bound once by address, graph outputs written
    straight into the arrays returned."""

    def __init__(self, layout: ProgramLayout) -> None:
        self.layout = layout
        self.program = native.Program()
        self.labels = [call.label for call in layout.calls]
        address = {name: array.ctypes.data for name, array in layout.constants.items()}
        for call in layout.calls:
            args = [(base, address[index], 0) if base == CONSTANT else (base, index, offset)
                    for base, index, offset in call.args]
            self.program.add(call.executable.jit.address, args, list(call.zero))

    @staticmethod
    def build(plan: _Plan) -> _NativeProgram | None:
        """The program, or None when a step is not native code of the CPU runtime."""
        from polyfuse.runtime.cpu import CpuExecutable
        for st in plan.steps:
            if st.spec is not None and (not isinstance(st.spec.run, CpuExecutable)
                                        or st.spec.run.layout.scalars):
                return None
        return _NativeProgram(ProgramLayout.of(plan))

    def run(self, env: dict[str, np.ndarray], times: np.ndarray | None = None) -> dict[str, np.ndarray]:
        inputs = [env[t.name] for t in self.layout.inputs]
        arena = native.empty_aligned(self.layout.arena_bytes, np.uint8)
        slots = [native.empty_aligned(shape, dtype) for shape, dtype in self.layout.slots]
        failed = self.program.run(arena, inputs, slots, times)
        if failed >= 0:
            raise BoundsError.in_kernel(self.labels[failed])
        return self.layout.collect(inputs, slots)


def _program(plan: _Plan) -> Any:
    """What runs a plan's kernels as one unit: a native program in this process, a
    program run under an emulator, a program on the GPU, or None (each step runs by
    itself)."""
    target = plan.model.target
    if target.backend.device is Device.GPU:
        from polyfuse.runtime.cuda import CudaProgram
        return CudaProgram(ProgramLayout.of(plan))
    if not target.backend.cpus:
        return None
    from polyfuse.runtime import cross
    from polyfuse.targets.cpu import runs_natively
    if runs_natively(target):
        return _NativeProgram.build(plan)
    return cross.CrossProgram(ProgramLayout.of(plan), target)


def _view(src: str, dst: str, shape: tuple[int, ...]) -> Any:
    def run(env: dict[str, np.ndarray]) -> None:
        env[dst] = env[src].reshape(shape)
    return run


def _type(array: np.ndarray) -> TensorType:
    dt = DType.from_numpy(array.dtype)
    if dt is None:
        raise DTypeError(f"a folded value has dtype {array.dtype}, which polyfuse does not support")
    return TensorType(dt, tuple(int(d) for d in array.shape))


class CompiledModel:
    """A graph compiled for a target; ``run({name: array}) -> {name: array}``."""

    def __init__(self, graph: Graph, target: Target, options: MappingOptions | None = None,
                 input_shapes: Mapping[str, tuple[int, ...]] | None = None,
                 passes: PassManager | None = None, records: Records | None = None) -> None:
        self.graph = graph
        self.passes = passes
        self.records = records
        self.target = target
        self.options = options
        self._plans: dict[tuple, _Plan] = {}
        self._planning = threading.Lock()  # threads calling at a new shape plan it once
        self._value_inputs: set[str] = set()  # small inputs whose values plans depend on
        if input_shapes is not None and not isinstance(input_shapes, Mapping):
            raise ShapeError(f"input_shapes must be a dict {{name: shape}}, got "
                             f"{type(input_shapes).__name__}; the inputs are {signature(self.graph.inputs)}")
        self.input_shapes = {n: shape_arg(n, s, symbolic=True) for n, s in (input_shapes or {}).items()}
        if self.input_shapes:
            check_shapes(self.graph.inputs, self.input_shapes)
            self._plan({v.name: tuple(self.input_shapes.get(v.name, v.type.shape)) for v in graph.inputs})

    @property
    def inputs(self) -> tuple[Value, ...]:
        return self.graph.inputs

    @property
    def outputs(self) -> tuple[Value, ...]:
        return self.graph.outputs

    def _plan(self, shapes: dict[str, tuple], values: dict[str, np.ndarray] | None = None) -> _Plan:
        unbound = {f"{n}[{k}]={d}" for n, s in shapes.items() for k, d in enumerate(s)
                   if not isinstance(d, int)}
        if unbound:
            raise ShapeError(f"input dimensions {sorted(unbound)} are symbolic; call the model "
                             "with arrays, or pass input_shapes={name: shape} to compile()")
        values = values or {}
        key = (tuple(sorted(shapes.items())),
               tuple((n, v.tobytes()) for n, v in sorted(values.items())))
        plan = self._plans.get(key)
        if plan is None:
            with self._planning:
                plan = self._plans.get(key)
                if plan is None:
                    check_shapes(self.graph.inputs, shapes)
                    plan = self._plans[key] = _Plan(self, shapes, values)
        return plan

    def dump(self, stage: str) -> str:
        """The text of one stage of compilation: the graph after a pass (``input``,
        ``fold_batch_norms``, ..., see :data:`STAGES`), ``groups`` (the fusion
        decisions), or, for the kernels of the latest plan, ``kernels`` (their TC),
        ``loops``, ``loops:<pass>`` (after each loop pass), ``llvm``, ``asm`` (kernel stages,
        each kernel headed by its label)."""
        graphs = dict(self.passes.graphs) if self.passes is not None else {}
        if stage in graphs:
            return str(graphs[stage])
        if stage == "groups":
            return describe_groups(self.graph) or "(no fusion groups)"
        kernel_stage = {"kernels": "specialized"}.get(stage, stage)
        # "loops:<pass>" and "gpu:<pass>": the loop IR after each named loop pass
        if kernel_stage in KERNEL_STAGES or kernel_stage.partition(":")[0] in ("loops", "gpu"):
            plan = self._latest_plan(f"stage '{stage}' and other kernel stages")
            kernels = [st for st in plan.steps if st.spec is not None]
            if kernels and not any(kernel_stage in st.spec.stages for st in kernels):
                have = kernels[0].spec.stages
                present = [s for s in KERNEL_STAGES[1:] if s in have] + [s for s in have if ":" in s]
                raise ArgumentError(f"kernels for {self.target} have no stage '{stage}'; they have "
                                    f"kernels, {', '.join(present)}")
            return "\n\n".join(f"// {st.label}\n{st.spec.stages.get(kernel_stage, '')}"
                                for st in plan.steps if st.spec is not None)
        known = [*graphs, "groups", "kernels", *KERNEL_STAGES[1:]]
        raise ArgumentError(f"no stage '{stage}'; stages: {', '.join(known)}")

    def tasks(self, **shapes: tuple[int, ...]) -> list[Task]:
        """Every kernel of the model as a tuning task, for these input shapes (those given
        to ``compile`` or of the latest call when none are given here)."""
        plan = self._plan(all_shapes(self.graph.inputs, shapes, "tasks")) if shapes \
            else self._latest_plan("tasks")
        return [st.task for st in plan.steps if st.task is not None]

    def _latest_plan(self, what: str) -> _Plan:
        """The plan of the latest run (or of ``input_shapes``); for a model whose inputs
        all have fixed shapes, the plan of those shapes."""
        declared = {v.name: v.type.shape for v in self.graph.inputs}
        if not self._plans and all(isinstance(d, int) for s in declared.values() for d in s):
            return self._plan(declared)
        if not self._plans:
            raise ArgumentError(f"{what} need input shapes: run the model once, pass "
                                "input_shapes to compile(), or give the shapes here")
        return list(self._plans.values())[-1]

    def save_bundle(self, out_dir: Any, name: str = "model", *, threads: bool = False,
                    shapes: Mapping[str, tuple[int, ...]] | None = None) -> list[Any]:
        """Write the model as an ahead-of-time bundle for its target (x86 or aarch64):
        ``NAME.o``, ``NAME.h``, ``NAME.weights.bin`` and an example ``main.c`` (see
        :mod:`polyfuse.runtime.bundle`); the paths written."""
        from polyfuse.runtime.bundle import write_bundle
        return write_bundle(self, out_dir, name, threads=threads, shapes=shapes)

    def plan_for(self, shapes: Mapping[str, tuple[int, ...]] | None = None) -> _Plan:
        """The plan for these input shapes (all inputs), else that of the shapes given to
        ``compile`` or of the latest run."""
        if not shapes:
            return self._latest_plan("a bundle")
        return self._plan(all_shapes(self.graph.inputs, shapes, "plan_for"))

    def memory_plan(self, **shapes: tuple[int, ...]) -> MemoryPlan:
        """The activation arena for these input shapes (all inputs must be given)."""
        missing = [v.name for v in self.graph.inputs if v.name not in shapes]
        if missing:
            raise ArgumentError(f"memory_plan needs the shape of every input; missing {missing}, "
                                f"e.g. memory_plan({missing[0]}=(1, 3, 224, 224))")
        return self._plan(all_shapes(self.graph.inputs, shapes, "memory_plan")).memory

    def run(self, feed: Mapping[str, Any]) -> dict[str, np.ndarray]:
        plan, env = self._prepare(feed)
        if plan.program is not None:
            return plan.program.run(env)
        env.update(plan.consts)
        for step in plan.steps:
            step.run(env)
        return {v.name: env[v.name] for v in self.graph.outputs}

    def profile(self, feed: Mapping[str, Any], repeat: int = 10) -> list[tuple[str, float]]:
        """Each kernel's median seconds over ``repeat`` runs of ``feed`` (after one
        warm-up run), in the order they run: ``(label, seconds)``; a label names the node,
        or the fusion group and its nodes."""
        if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
            raise ArgumentError(f"profile's repeat must be a positive int, got {repeat!r}")
        plan, env = self._prepare(feed)
        samples: list[list[float]] = []
        for _ in range(repeat + 1):
            if plan.program is not None:
                times = np.zeros(len(plan.program.labels))
                plan.program.run(env, times)
                labels = plan.program.labels
            else:
                local = env | plan.consts
                labels, times = [st.label for st in plan.steps], np.zeros(len(plan.steps))
                for k, step in enumerate(plan.steps):
                    start = time.perf_counter()
                    step.run(local)
                    times[k] = time.perf_counter() - start
            samples.append(list(times))
        medians = np.median(np.array(samples[1:]), axis=0)
        return list(zip(labels, (float(t) for t in medians)))

    def _prepare(self, feed: Mapping[str, Any]) -> tuple[_Plan, dict[str, Any]]:
        """The plan for ``feed`` and the checked inputs (numpy arrays; on the cuda target
        also arrays in GPU memory, used in place)."""
        env, shapes = check_feed(self.graph.inputs, feed, on_gpu=self.target.backend.device is Device.GPU)
        while True:
            values = {n: a for n, a in env.items() if isinstance(a, np.ndarray)
                      and a.size <= VALUE_INPUT_MAX and (a.dtype.kind in "iu" or n in self._value_inputs)}
            try:
                plan = self._plan(shapes, values)
                break
            except NeedsValue as need:  # e.g. Resize scales fed at run time
                name = need.value_name
                if name not in env or name in values or not isinstance(env[name], np.ndarray) \
                        or env[name].size > VALUE_INPUT_MAX:
                    raise
                self._value_inputs.add(name)
        return plan, env

    def __call__(self, *arrays: Any, **named: Any) -> tuple[np.ndarray, ...] | np.ndarray:
        """The outputs for the inputs in order (or all by name); one output alone, several
        as a tuple in the model's order."""
        out = self.run(positional_feed(self.graph.inputs, arrays, named))
        values = tuple(out.values())
        return values[0] if len(values) == 1 else values
