"""Lowering a graph for one set of input shapes into a :class:`~polyfuse.ir.plan.Plan`.

Every node goes through the op library (:mod:`polyfuse.lowering.ops`): nodes whose inputs
are all constants fold at compile time (the comprehension interpreter runs their TC),
reshapes become views, expansions (recurrences) plan the nodes they expand into,
fusion groups compose into one definition
(:mod:`polyfuse.lowering.compose`), and every other node becomes a kernel step. Each
value's size is checked against the memory limit before anything is allocated.

Control flow (If, Loop, Scan) that the planner can resolve for these shapes and values is
inlined in the node list as it goes (:mod:`polyfuse.lowering.inline_control`); an If or Loop
that depends on data becomes a step the program runs, its branches or body planned here
as blocks of steps (:mod:`polyfuse.lowering.program_control`); the first the program
cannot run ends the plan, as its :class:`~polyfuse.ir.plan.ControlStep` tail. So
does a node whose output sizes the data decides (NonZero, Compress, Unique), after the
kernel writing its outputs at their bound sizes and their count: the runtime cuts them.
A node needing at compile time a value the data computes (TopK's k, a Reshape's shape)
ends the plan before it, and is planned with the rest once the value is known.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from polyfuse.errors import CodegenError, DTypeError, FrontendError, ModelError, NeedsValue, ShapeError
from polyfuse.frontends.tc import parse, parse_definition
from polyfuse.ir.comprehension import Definition, TensorDecl
from polyfuse.ir.comprehension_interpreter import interpret
from polyfuse.ir.graph import Graph, Node, TensorType
from polyfuse.ir.limits import check_bytes, check_tensor_size
from polyfuse.ir.plan import ControlStep, KernelStep, Plan, Step, Trim, ViewStep, plan_memory
from polyfuse.ir.passes import Pass
from polyfuse.ir.steps import Block, History, events
from polyfuse.ir.sizes import bind_sizes, sizes_of_shapes
from polyfuse.ir.symbolic import evaluate_int
from polyfuse.ir.types import DType, aligned_array
from polyfuse.lowering.compose import Member, compose, inline_pointwise
from polyfuse.lowering.kernel_passes import inline_scalars, run_definition_passes, started
from polyfuse.lowering.inline_control import live_nodes, resolve_control_flow
from polyfuse.lowering.program_control import program_control
from polyfuse.lowering.fusion import partition_fusion_groups
from polyfuse.lowering.graph_passes import PassManager, graph_passes
from polyfuse.lowering.layout import CHANNELS_LAST, channels_first, to_channels_last
from polyfuse.lowering.ops import (EXPANDS, Counted, Expanded, Folded, Lowered, OpContext, TCKernel, View,
                                   lower)


def plan_graph(graph: Graph, shapes: Mapping[str, tuple[int, ...]],
               values: Mapping[str, np.ndarray] | None = None, memo: Memos | None = None) -> Plan:
    """``graph`` lowered for inputs of these ``shapes``; ``values`` are inputs whose
    values the plan is specialized to (those a lowering needs: shapes, axes). Raises the
    op library's errors (naming the node), a ShapeError where sizes disagree and a
    SizeLimitError where a tensor would not fit in memory. ``memo``: what earlier plans
    of ``graph`` lowered (:class:`Memos`)."""
    memo = memo or Memos()
    while True:
        planner = _Planner(graph, dict(shapes), dict(values or {}), memo)
        try:
            plan = planner.plan()
        except _Needed as need:   # a lowering needs the value after all: it folds again
            memo.unfolded -= need.names
            memo.needed |= need.names
            continue
        shaped = {n for n in plan.constants if n in planner.shaped} - memo.unfolded - memo.needed
        if not shaped:
            return plan
        memo.unfolded |= shaped   # computed by kernels from now on: plan again


class _Needed(Exception):
    """A lowering needs a value computed from ``names``, which the planner had kernels
    compute."""

    def __init__(self, names: set[str]) -> None:
        super().__init__(sorted(names))
        self.names = names


@dataclass(frozen=True)
class GraphPlanner:
    """The lowering's side of the re-planning protocol (:class:`~polyfuse.ir.plan.Planner`):
    plans of ``graph``, and planners of its subgraphs; its plans share what they lower
    alike (``memo``)."""

    graph: Graph
    memo: Memos = field(default_factory=lambda: Memos(), compare=False, repr=False)

    def plan(self, shapes: Mapping[str, tuple[int, ...]], values: Mapping[str, np.ndarray]) -> Plan:
        return plan_graph(self.graph, shapes, values, self.memo)

    def subgraph(self, graph: Graph, passes: bool) -> GraphPlanner:
        if passes:
            graph = PassManager(graph_passes(), verify=True).run(graph)
        return GraphPlanner(graph)

    def definition(self, source: str, sizes: tuple[str, ...] = ()) -> Definition:
        return parse_definition(source, sizes)


class _Memo:
    """Results of pure steps of the lowering, kept across plans (the last ``size``
    used): a model planned at a new shape lowers again only what the shape changes (a
    decoder's step at a longer past re-makes its attention's kernels, not its
    projections'). Keys hold the objects their ids stand for, so an id is never reused
    while its entry lives."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[object, tuple[object, object]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: object, make: Callable[[], Any], keep: object = None) -> Any:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found[1]
        value = make()
        with self._lock:
            self._entries[key] = (keep, value)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return value


# TC text -> its definition (the op library's texts, shared by every model)
_PARSED = _Memo(4096)


class Memos:
    """What one graph's plans share (each a pure function of its key): a node's lowering
    for its input types and constant inputs, a definition with sizes bound, a fusion
    group's composition of its bound members, and what the interpreter folds at plan
    time. A model's planner holds them (the constant inputs a key holds, weights among
    them, live with the model)."""

    def __init__(self) -> None:
        self.lowered = _Memo(2048)
        self.bound = _Memo(4096)
        self.composed = _Memo(1024)
        self.folded = _Memo(2048)
        # values computed from the input shapes that kernels read: computed by kernels
        # (see _Planner.shaped), so that a plan's constants are the same at every shape
        self.unfolded: set[str] = set()
        self.needed: set[str] = set()   # ... except where a lowering needs the value


# a constant input of at most this many bytes is keyed by its value (a shape computed at
# plan time: the same at every past length); a larger one by its identity (weights)
VALUE_KEY_BYTES = 512


def _value_key(v: np.ndarray | None) -> object:
    if v is None:
        return None
    if v.nbytes <= VALUE_KEY_BYTES and not v.dtype.hasobject:
        return (v.dtype.str, v.shape, v.tobytes())
    return id(v)


class _Planner:
    def __init__(self, graph: Graph, shapes: dict[str, tuple[int, ...]],
                 values: dict[str, np.ndarray], memo: Memos) -> None:
        self.graph = graph
        self.memo = memo
        self.shapes = shapes
        self.steps: list[Step] = []
        self.types: dict[str, TensorType] = {v.name: TensorType(v.type.dtype.storage, tuple(shapes[v.name]))
                                             for v in graph.inputs}
        # values holding a narrow type (float8, int4, ...) in their storage type (self.types)
        self.narrow: dict[str, DType] = {v.name: v.type.dtype for v in graph.inputs
                                         if v.type.dtype.is_narrow}
        self.consts: dict[str, np.ndarray] = dict(values)
        self.specialized = tuple(sorted(values))   # the inputs whose values it is planned for
        for c in graph.constants:
            self.constant(c.name, c.array)
        self._lowered: dict[str, tuple[Lowered, Definition | None]] = {}
        self._history: dict[str, History] = {}   # node -> its definition's comprehension passes
        # Constants whose values the input shapes decide (a Shape's output, and what
        # folds from one: positions, masks, a position embedding's rows). Where a kernel
        # reads one, plan_graph plans again with its node in memo.unfolded: a kernel
        # computes it at run time, so a plan's constants are its weights and values
        # alone, and plans at other shapes differ only in sizes (plan templates).
        self.shaped: set[str] = set()
        self.unfolded = memo.unfolded
        # (a graph of fixed input shapes has one plan: its values of the shapes fold)
        self.dynamic = not all(isinstance(d, int) for v in graph.inputs for d in v.type.shape)

    def plan(self) -> Plan:
        g = self.graph
        outputs = {v.name for v in g.outputs}
        tail = self.nodes(list(g.nodes), outputs)
        if tail is None:
            self.check_outputs()
        returned = tuple(n for n in tail.reads if n in self.types and n not in self.consts
                         and n not in self.shapes) if tail else tuple(v.name for v in g.outputs)
        steps = tuple(self.steps)
        memory = plan_memory(steps, self.types, set(returned) if tail else outputs)
        check_bytes(f"the activation arena of graph '{g.name}' for input shapes {self.shapes} would take",
                    memory.arena_bytes)
        read = {n for ev in events(steps)[0] for n in ev.reads} | set(returned)
        plan = Plan(g.name, tuple(v.name for v in g.inputs), returned,
                    self.types, {n: a for n, a in self.consts.items() if n in read}, steps, memory, tail,
                    self.specialized)
        plan.verify()
        return plan

    def nodes(self, nodes: list[Node], outputs: set[str]) -> ControlStep | None:
        """Plan ``nodes`` (whose values ``outputs`` are read after them) into the steps;
        the step ending the plan at the first node whose behaviour the data decides
        and the program cannot run, or None."""
        readers = _last_readers(nodes)
        k = 0
        while k < len(nodes):
            node = nodes[k]
            if node.op in EXPANDS and not node.group:   # computed by other nodes: plan those
                nodes[k:k + 1] = self.expanded(node)
                readers = _last_readers(nodes)
                continue
            if node.subgraphs:
                wanted = {v for v, last in readers.items() if last > k} | outputs
                inlined = self.control(node, wanted)
                if inlined is not None:
                    nodes[k:k + 1] = inlined
                    readers = _last_readers(nodes)
                    continue
                trims = program_control(self, node)   # depends on data: the program runs it
                if trims is None:   # or the runtime, from Python
                    return self.tail(node, nodes[k + 1:])
                if trims:
                    return self.tail(node, nodes[k + 1:], trims)
                k += 1
                continue
            unit = _unit_at(nodes, k)
            k += len(unit)
            exported = {o for n in unit for o in n.outputs
                        if o and (o in outputs or readers.get(o, -1) >= k)}
            if len(unit) == 1 or not self.fused(unit, exported):
                for j, node in enumerate(unit):
                    try:
                        trims = self.node(node)
                    except NeedsValue as need:
                        refold = self.unfolded_sources(need.value_name)
                        if refold:
                            raise _Needed(refold) from None
                        if need.value_name in self.shapes or need.value_name not in self.types:
                            raise   # a graph input: the model specializes its plans to it
                        # a value computed from data (e.g. TopK's k): the rest is planned
                        # once it is known, from this node on
                        return self.tail(node, unit[j + 1:] + nodes[k:], waits=True)
                    if trims is not None:   # sizes the data decides: the plan ends after its kernel
                        return self.tail(node, unit[j + 1:] + nodes[k:], trims)
        return None

    def block(self, nodes: list[Node], results: list[str]) -> Block | None:
        """``nodes`` (grouped for fusion) planned as a block of steps of their own giving
        ``results``; None when they end in a step the program cannot run."""
        outer, self.steps = self.steps, []
        try:
            ended = self.nodes(nodes, set(results))
            steps = tuple(self.steps)
        finally:
            self.steps = outer
        return None if ended is not None else Block(steps, tuple(results))

    def of_shapes(self, names: list[str] | tuple[str, ...]) -> None:
        """Record values whose values the input shapes decide (of a graph whose input
        shapes can change)."""
        if self.dynamic:
            self.shaped.update(names)

    def unfolded_sources(self, name: str) -> set[str]:
        """The values in :attr:`unfolded` that value ``name`` is computed from (itself
        included): what must fold again for ``name`` to be known at plan time."""
        if not self.unfolded:
            return set()
        producer = {out: node for node in self.graph.nodes for out in node.outputs}
        found, seen, pending = set(), set(), [name]
        while pending:
            value = pending.pop()
            if value in seen or not value:
                continue
            seen.add(value)
            if value in self.unfolded:
                found.add(value)
            node = producer.get(value)
            if node is not None:
                pending.extend(node.inputs)
        return found

    def snapshot(self) -> tuple[dict, dict, dict]:
        """What planning records besides steps (to undo a block the program cannot run)."""
        return dict(self.types), dict(self.consts), dict(self.narrow)

    def restore(self, saved: tuple[dict, dict, dict]) -> None:
        self.types, self.consts, self.narrow = saved

    def grouped(self, name: str, nodes: list[Node], wanted: set[str]) -> list[Node]:
        """Those of ``nodes`` (inlined from control-flow node ``name``) computing
        ``wanted`` values, grouped for fusion."""
        live = Graph(name, (), (), tuple(live_nodes(nodes, wanted)))
        return [replace(n, group=f"{name}/{n.group}") if n.group else n
                for n in partition_fusion_groups(live).nodes]

    def check_outputs(self) -> None:
        for v in self.graph.outputs:   # onnxruntime refuses such a model too
            computed = self.narrow.get(v.name) or self.types[v.name].dtype if v.name in self.types else None
            if computed is not None and computed is not v.type.dtype:
                raise ModelError(f"graph output '{v.name}' is declared {v.type.dtype}, but the model "
                                 f"computes it as {computed}; correct the output's element type in "
                                 "the model")

    def control(self, node: Node, wanted: set[str]) -> list[Node] | None:
        """The nodes replacing control-flow ``node`` (its constants recorded), those
        computing ``wanted`` values, grouped for fusion; None when it depends on data."""
        inlined = resolve_control_flow(node, self.types, self.consts, self.graph.opset)
        if inlined is None:
            return None
        self.record(inlined.constants)
        return self.grouped(node.name, inlined.nodes, wanted)

    def record(self, constants: Mapping[str, np.ndarray]) -> None:
        """Record the constants of inlined subgraphs."""
        for name, array in constants.items():
            self.consts[name] = aligned_array(array)
            self.types[name] = _type(array)

    def expanded(self, node: Node) -> list[Node]:
        """The nodes computing ``node`` (an op registered with ``expands``), its constants
        recorded."""
        lowered = lower(self.context(node))
        if not isinstance(lowered, Expanded):
            raise CodegenError(f"node '{node.name}' ({node.op}): its lowering did not expand it")
        for name, array in lowered.constants.items():
            self.constant(name, array)
        return list(lowered.nodes)

    def tail(self, node: Node, rest: list[Node], trims: tuple[Trim, ...] = (),
             waits: bool = False) -> ControlStep:
        """The step ending the plan at data-dependent ``node``: what it (or, when its
        kernel ran, its ``trims``) and ``rest`` read; ``waits``: the node is planned with
        the rest, once a value it needs is computed."""
        outputs = [v.name for v in self.graph.outputs]
        first = [n for t in trims for n in (t.bound, t.count)] if trims else list(node.inputs)
        wanted = first + [i for n in rest for i in n.inputs] + outputs
        reads = tuple(dict.fromkeys(n for n in wanted if n and n in self.types))
        return ControlStep(node, tuple(rest), {n: self.consts[n] for n in reads if n in self.consts},
                           reads, trims, waits)

    def context(self, node: Node) -> OpContext:
        """What ``node``'s lowering sees; a channels-last node's input 0 in ONNX's layout."""
        types = [self.types.get(i) if i else None for i in node.inputs]
        if node.attr(CHANNELS_LAST) and types and types[0] is not None:
            t = types[0]
            types[0] = TensorType(t.dtype, tuple(t.shape[p] for p in channels_first(t.rank)))
        return OpContext(node, types, [self.consts.get(i) if i else None for i in node.inputs],
                         self.graph.opset, [self.narrow.get(i) if i else None for i in node.inputs])

    def constant(self, name: str, array: np.ndarray) -> TensorType:
        """Record a constant value; one of a narrow type is kept in its storage type."""
        t = _type(array)
        if t.dtype.is_narrow:
            self.narrow[name] = t.dtype
            t = TensorType(t.dtype.storage, t.shape)
            array = array.astype(t.dtype.numpy)
        self.consts[name] = aligned_array(array)   # a weights' repacked copy is read as vectors
        self.types[name] = t
        return t

    def hold(self, names: list[str] | tuple[str, ...], lowered: TCKernel | View) -> None:
        """Record which of ``names`` (the outputs of ``lowered``) hold a narrow type."""
        for name, narrow in zip(names, lowered.narrow or ()):
            if narrow is not None:
                self.narrow[name] = narrow

    def define(self, what: str, name: str, t: TensorType) -> None:
        """Record the type of value ``name`` (defined by ``what``, a node or group) once its
        size is known to fit in memory."""
        check_tensor_size(f"value '{name}' of {what}", t.dtype, tuple(int(d) for d in t.shape))
        self.types[name] = t

    def sizes(self, what: str, d: Definition, names: list[str]) -> dict[str, int]:
        """The sizes of ``d`` called on the values ``names``, whose dtypes and ranks must
        be its parameters' (a lowering's mistake otherwise, named here)."""
        for p, n in zip(d.params, names):
            t, rank = self.types[n], p.rank if isinstance(p, TensorDecl) else 0
            if t.dtype is not p.dtype or t.rank != rank:
                raise DTypeError(f"{what}: its kernel's parameter '{p.name}' is {p.dtype} of rank "
                                 f"{rank}, but value '{n}' is {t}")
        try:
            return sizes_of_shapes(d, [tuple(int(x) for x in self.types[n].shape)
                                       if isinstance(p, TensorDecl) else None
                                       for p, n in zip(d.params, names)])
        except ShapeError as err:   # the node's inputs disagree (e.g. an einsum's sizes)
            raise ShapeError(f"{what}: {err}") from None

    def output_types(self, what: str, d: Definition, sizes: dict[str, int],
                     names: list[str]) -> list[TensorType]:
        """The types of what ``d`` defines at these sizes (values ``names``, then its
        temporaries), each checked to fit in memory before anything is allocated."""
        types = []
        for k, t in enumerate(d.outputs):
            shape = tuple(evaluate_int(e, sizes) for e in t.shape)
            name = f"value '{names[k]}'" if k < len(names) else f"temporary '{t.name}'"
            if any(e < 0 for e in shape):
                raise ShapeError(f"{what}: {name} would have shape {shape} for sizes {sizes}: the "
                                 "inputs are too small for the statement that writes it")
            check_tensor_size(f"{name} of {what}", t.dtype, shape)
            types.append(TensorType(t.dtype, shape))
        return types

    def node(self, node: Node) -> tuple[Trim, ...] | None:
        """Lower ``node`` into the plan; for a node whose output sizes the data decides,
        the trims of its outputs (the plan ends there)."""
        lowered, d = self.lowered(node)
        what = f"node '{node.name}' ({node.op})"
        if isinstance(lowered, Counted):
            assert d is not None
            return self.counted(node, lowered, d)
        # (a Shape's output or a fold of one; a value or kernel input the lowering read
        # decides outputs that are not constants, which only constants' marks matter to)
        if any(i and (i in self.shaped or i not in self.consts) for i in node.inputs):
            self.of_shapes(node.outputs)
        if isinstance(lowered, Folded):
            for name, array in zip(node.outputs, lowered.arrays):
                self.define(what, name, self.constant(name, array))
        elif isinstance(lowered, View):
            src, shape, start = node.inputs[lowered.input], tuple(lowered.shape), lowered.offset
            self.define(what, node.outputs[0], TensorType(self.types[src].dtype, shape))
            self.hold(node.outputs[:1], lowered)
            if src in self.consts and node.outputs[0] not in self.unfolded:
                flat = self.consts[src].reshape(-1)
                self.consts[node.outputs[0]] = flat[start:start + int(np.prod(shape))].reshape(shape)
            else:
                self.steps.append(ViewStep(node.name, src, node.outputs[0], shape, start))
        else:
            assert d is not None
            names = [node.inputs[i] for i in lowered.inputs] + self.bind_constants(node, lowered)
            outs = [node.outputs[i] for i in lowered.outputs]
            sizes = self.sizes(what, d, names)
            types = self.output_types(what, d, sizes, outs)
            self.hold(outs, lowered)
            if all(n in self.consts for n in names) and not self.unfolded.intersection(outs):
                # fold at compile time with the interpreter
                arrays = {p.name: self.consts[n] for p, n in zip(d.params, names)}
                results = self.memo.folded.get(
                    (id(d), tuple(_value_key(a) for a in arrays.values()), tuple(sorted(sizes.items()))),
                    lambda: interpret(d, arrays, sizes), keep=(d, list(arrays.values())))
                for name, t in zip(outs, d.outputs):
                    self.consts[name] = aligned_array(results[t.name])
                    self.define(what, name, _type(results[t.name]))
                return None
            self.kernel(node.name, self._history[node.name], lowered.source, names, outs, types)
        return None

    def counted(self, node: Node, lowered: Counted, d: Definition) -> tuple[Trim, ...] | None:
        """A node whose output sizes the data decides: its kernel, writing the outputs at
        their bound sizes and the count, and how the runtime cuts them; None when its
        inputs are constants (it folds, cut to the count here)."""
        what = f"node '{node.name}' ({node.op})"
        k = lowered.kernel
        names = [node.inputs[i] for i in k.inputs]
        bounds = [f"{node.name}:bound{i}" for i in k.outputs]
        count = f"{node.name}:count"
        sizes = self.sizes(what, d, names)
        types = self.output_types(what, d, sizes, bounds + [count])
        axes = dict(lowered.trims)
        if all(n in self.consts for n in names):
            results = interpret(d, {p.name: self.consts[n] for p, n in zip(d.params, names)}, sizes)
            n = int(results[d.outputs[len(bounds)].name].reshape(-1)[0])
            for i, t in zip(k.outputs, d.outputs):
                array = results[t.name]
                if i in axes:
                    array = np.take(array, np.arange(n), axis=axes[i])
                if node.outputs[i]:
                    self.define(what, node.outputs[i], self.constant(node.outputs[i], array))
            return None
        self.kernel(node.name, self._history[node.name], k.source, names, bounds + [count], types)
        return tuple(Trim(node.outputs[i], b, count if i in axes else "", axes.get(i, 0))
                     for i, b in zip(k.outputs, bounds) if node.outputs[i])

    def lowered(self, node: Node) -> tuple[Lowered, Definition | None]:
        """``node`` through the op library, and a kernel's definition: each node lowered and
        each TC text parsed once (a fusion group that does not fuse lowers its nodes again;
        the steps of a recurrence share one text)."""
        if node.name not in self._lowered:
            context = self.context(node)
            values = [v for v in context.values if v is not None]
            key = (id(node), tuple(context.types), tuple(_value_key(v) for v in context.values),
                   context.opset, tuple(context.narrow))
            lowered = self.memo.lowered.get(key, lambda: lower(context), keep=(node, values))
            d = None
            kernel = lowered.kernel if isinstance(lowered, Counted) else lowered
            if isinstance(kernel, TCKernel):
                try:
                    d = _PARSED.get(kernel.source, lambda: parse(kernel.source).definitions[0])
                except FrontendError as err:   # a defect of the op library, named here
                    raise CodegenError(f"node '{node.name}' ({node.op}): its lowering made TC "
                                       f"that does not compile: {err}") from None
            if d is not None:
                self._history[node.name] = started(d)
            if node.attr(CHANNELS_LAST):
                lowered, d = self.channels_last(node, lowered, d)
            self._lowered[node.name] = (lowered, d)
        return self._lowered[node.name]

    def channels_last(self, node: Node, lowered: Lowered,
                      d: Definition | None) -> tuple[Lowered, Definition | None]:
        """A channels-last node's lowering on permuted storage of input 0 and output 0
        (the ops the layout pass converts lower to kernels; their constant inputs fold
        later, through the permuted kernel)."""
        if d is None or lowered.inputs[:1] != (0,) or 0 not in lowered.outputs or \
                not isinstance(d.params[0], TensorDecl):
            raise CodegenError(f"node '{node.name}' ({node.op}): its lowering cannot run channels-last")
        tensors = {d.params[0].name, d.outputs[lowered.outputs.index(0)].name}
        history = run_definition_passes(self._history[node.name],
                                        (Pass("to_channels_last", lambda d: to_channels_last(d, tensors)),))
        self._history[node.name] = history
        d = history[-1][1]
        return replace(lowered, source=str(d)), d

    def bind_constants(self, node: Node, k: TCKernel) -> list[str]:
        """Names for the arrays a lowering computed at compile time (repacked weights)."""
        names = [f"{node.name}:const{j}" for j in range(len(k.constants))]
        for name, array in zip(names, k.constants):
            self.constant(name, array)
        return names

    def kernel(self, label: str, history: History, source: str, names: list[str], outs: list[str],
               types: list[TensorType]) -> None:
        """A kernel step of the definition ``history`` ends at (its comprehension passes so
        far), on values ``names``, after the passes every kernel gets."""
        d = history[-1][1]
        # (a value of the shapes stays an argument: written into the text, the kernels
        # of plans at other shapes would differ in more than their sizes)
        values = {p.name: self.consts[n] for p, n in zip(d.params, names) if n in self.consts and n not in self.shaped}
        history = run_definition_passes(history, (Pass("inline_scalars", lambda d: inline_scalars(d, values)),))
        inlined = history[-1][1]
        if inlined is not d:
            kept = {p.name for p in inlined.params}
            names = [n for p, n in zip(d.params, names) if p.name in kept]
            d, source = inlined, str(inlined)
        temps = tuple(f"{label}#{t.name}" for t in d.outputs[len(outs):])
        for name, t in zip(outs + list(temps), types):
            self.types[name] = t
        self.steps.append(KernelStep(label, d, source, tuple(names), tuple(outs), temps, history))

    def fused(self, unit: list[Node], exported: set[str]) -> bool:
        """Lower a fusion group as one kernel; False (nothing done) when a member does
        not lower to a kernel or the first one reads only constants (it folds)."""
        members: list[Member] = []
        for node in unit:
            lowered, d = self.lowered(node)
            if d is None or isinstance(lowered, Counted):
                return False
            names = [node.inputs[i] for i in lowered.inputs] + self.bind_constants(node, lowered)
            if not members and all(n in self.consts for n in names) and not self.unfolded.intersection(node.outputs):
                return False
            what = f"node '{node.name}' ({node.op})"
            bound = self.bound(d, self.sizes(what, d, names))
            outs = tuple(node.outputs[i] for i in lowered.outputs)
            self.hold(outs, lowered)
            for name, t in zip(outs, bound.outputs):
                self.define(what, name, TensorType(t.dtype, tuple(evaluate_int(e, {}) for e in t.shape)))
            members.append(Member(bound, tuple(names), outs))
        label = f"{unit[0].group}[{' '.join(n.name for n in unit)}]"
        seen = exported & {o for m in members for o in m.outputs}

        def make() -> tuple[History, tuple[str, ...], tuple[str, ...]]:
            composed = compose("fused", members, seen)
            keep = composed.exports
            passes = (Pass("inline_pointwise", lambda d: inline_pointwise(d, keep)),)
            return run_definition_passes(started(composed.definition), passes), composed.outputs, composed.params
        key = (tuple((id(m.definition), m.params, m.outputs) for m in members), frozenset(seen))
        history, outputs, params = self.memo.composed.get(key, make, keep=[m.definition for m in members])
        d, outs = history[-1][1], list(outputs)
        what = f"fusion group {label}"
        sizes = self.sizes(what, d, list(params))
        self.kernel(label, history, str(d), list(params), outs, self.output_types(what, d, sizes, outs))
        return True

    def bound(self, d: Definition, sizes: dict[str, int]) -> Definition:
        """``d`` with ``sizes`` bound (:func:`~polyfuse.ir.sizes.bind_sizes`), made once."""
        return self.memo.bound.get((id(d), tuple(sorted(sizes.items()))), lambda: bind_sizes(d, sizes), keep=d)


def _last_readers(nodes: list[Node]) -> dict[str, int]:
    """Each value read and the position of its last reader."""
    return {i: k for k, node in enumerate(nodes) for i in node.inputs if i}


def _unit_at(nodes: list[Node], k: int) -> list[Node]:
    """The node at ``k`` with the members of its fusion group after it (a group's
    members stand together), or alone."""
    unit = [nodes[k]]
    while unit[0].group and k + len(unit) < len(nodes) and nodes[k + len(unit)].group == unit[0].group:
        unit.append(nodes[k + len(unit)])
    return unit


def _type(array: np.ndarray) -> TensorType:
    dt = DType.from_numpy(array.dtype)
    if dt is None:
        raise DTypeError(f"a folded value has dtype {array.dtype}, which polyfuse does not support")
    return TensorType(dt, tuple(int(d) for d in array.shape))
