"""Plan IR: a graph lowered for one set of input shapes, before any code is generated.

The boundary between the graph and the code that runs it (Glow draws the same line
between its graph and its instructions). A :class:`Plan` is a program over named
buffers (the steps are in :mod:`polyfuse.ir.steps`):

* every **buffer** has a type with concrete dimensions and a role (:class:`Role`): a
  graph input, a graph output, both (``inout``: an output that is an input or a view of
  one), a constant (weights, folded values, repacked weights), or a temporary (an
  intermediate value, a kernel's private tensor, a loop's state);
* every **step** is a :class:`KernelStep` (one TC :class:`Definition` called on buffers:
  one node's lowering or a fusion group composed into one definition), a
  :class:`ViewStep` (a reshape sharing its source's storage), or control flow the data
  decides, run by the program itself: a :class:`LoopStep` (an ONNX Loop: a body of
  steps planned once, its carried values copied back after each iteration, scan values
  written row by row) or a :class:`BranchStep` (an ONNX If: two blocks of steps, each
  writing the node's outputs);
* the **memory plan** (:func:`plan_memory`) places every temporary in one arena by
  liveness (a value read in a loop lives as long as the loop); graph outputs get arrays
  of their own.

What the program cannot run (a loop whose carried shapes change, sizes the data
decides, a value needed to plan what follows) ends the plan: its ``tail``
(:class:`ControlStep`), continued from Python.

``lowering.plan.plan_graph`` makes plans; the runtime compiles each kernel step for a
target and runs the steps. ``str(plan)`` prints it; :meth:`Plan.verify` checks it.

**The re-planning protocol.** A plan holds everything the program runs, control flow the
data decides included; the runtime never calls into the lowering but through one
object, a :class:`Planner`, given to a compiled model when it is made. The runtime asks
it for a plan in three cases only, each because a plan is made for concrete shapes:

* the model is called at input shapes it has no plan for (or with new values of the few
  inputs a lowering needs at plan time: a Reshape's shape fed at run time), ``plan``;
* a plan's tail (:class:`ControlStep`) runs a branch or loop body whose shapes the data
  decides, or the rest of the graph after it, ``subgraph`` then ``plan`` for the shapes
  that the data gave;
* ``profile_ranges`` observes every value of the model, ``subgraph`` of the observed graph.
"""

from __future__ import annotations

import bisect
import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol, runtime_checkable

import numpy as np

from polyfuse.errors import IRVerificationError, ShapeError
from polyfuse.ir.comprehension import Definition
from polyfuse.ir.graph import Graph, Node, TensorType, format_name
from polyfuse.ir.sizes import sizes_of_shapes
from polyfuse.ir.steps import (BranchStep, ControlFlow, KernelStep, LoopStep, Step, ViewStep, leaves,
                               live_ranges, view_roots)
from polyfuse.ir.symbolic import evaluate_int
from polyfuse.ir.types import DType


class Role(enum.Enum):
    INPUT = "in"
    OUTPUT = "out"
    INOUT = "inout"       # a graph output that is a graph input or a view of one
    CONSTANT = "const"
    TEMP = "temp"         # an intermediate value, or a kernel's private tensor


@dataclass(frozen=True)
class Trim:
    """Output ``output`` of a node whose output sizes the data decides: buffer ``bound``
    (its upper-bound size) sliced to the first ``count`` entries along ``axis``, where
    ``count`` names a one-element buffer the node's kernel wrote; the whole buffer when
    ``count`` is empty."""

    output: str
    bound: str
    count: str
    axis: int


@dataclass(frozen=True)
class ControlStep:
    """A node whose behaviour depends on data: it ends its plan. A control-flow node's
    branch or trip count: the runtime runs it (its subgraphs compiled as models of their
    own, planned for the shapes they are given). A node whose output sizes the data
    decides (``trims``): the plan ran its kernel, and the runtime slices its outputs to
    the counts computed. A node that needs the value of something computed before it
    (``waits``, e.g. TopK's k) is planned with ``rest``. Then come ``rest``, the nodes
    after it, planned for the shapes (and small values) computed. ``reads`` are the
    values the node (or its trims) and ``rest`` read (and graph outputs defined before
    it): the plan's inputs, its outputs and ``constants`` (those the planner folded)."""

    node: Node
    rest: tuple[Node, ...]
    constants: Mapping[str, np.ndarray] = field(repr=False)
    reads: tuple[str, ...]
    trims: tuple[Trim, ...] = ()
    waits: bool = False   # the node needs a value computed before it: it is planned with rest


@dataclass(frozen=True)
class MemoryPlan:
    """Activations placed in one arena by liveness (as Glow does): ``offsets`` of each
    intermediate value (views share their source's storage; graph outputs get their own
    arrays and are not in the arena), the arena's size, and the naive sum of every
    activation, outputs and kernel temporaries included."""

    offsets: dict[str, int]
    arena_bytes: int
    naive_bytes: int
    roots: dict[str, str]     # value -> the value whose storage it views
    starts: dict[str, int] = field(default_factory=dict)   # a view -> its bytes into the root


def aligned(nbytes: int, alignment: int = 64) -> int:
    return -(-nbytes // alignment) * alignment


def nbytes(t: TensorType) -> int:
    return t.dtype.bits // 8 * math.prod(int(d) for d in t.shape)


def block_bytes(t: TensorType, alignment: int = 64) -> int:
    """The bytes a buffer of type ``t`` takes in the arena (at least one byte, aligned)."""
    return aligned(max(1, nbytes(t)), alignment)


def plan_memory(steps: tuple[Step, ...], types: Mapping[str, TensorType], outputs: set[str],
                alignment: int = 64) -> MemoryPlan:
    """First-fit placement of the storage each step defines (kernels' temporaries, loop
    state), freed after the last step reading it or any view of it (see
    :func:`~polyfuse.ir.steps.live_ranges`: a value a loop reads lives as long as the loop)."""
    roots, starts = view_roots(steps, {v: t.dtype.bits // 8 for v, t in types.items()})
    laid, span = live_ranges(steps, roots)
    size = {v: block_bytes(types[v], alignment) for ev in laid for v in ev.allocates}
    kept = {roots.get(v, v) for v in outputs}
    offsets, arena = first_fit([[v for v in ev.allocates if v not in kept] for ev in laid],
                               {v: end for v, (_, end) in span.items()}, size)
    return MemoryPlan(offsets, arena, sum(size.values()), roots, starts)


def first_fit(defined: list[list[str]], last: Mapping[str, int], size: Mapping[str, int]) -> tuple[dict[str, int], int]:
    """Offsets of the values ``defined`` at each event (each live to its ``last`` event,
    of ``size`` bytes) in one arena, each at the lowest offset where it fits beside
    those still live; and the arena's bytes."""
    live: list[tuple[int, int, str]] = []   # (offset, size, value), sorted
    ending: set[int] = set()                # the events some live value lives until
    offsets: dict[str, int] = {}
    arena = 0
    for k, values in enumerate(defined):
        if k - 1 in ending:
            ending.discard(k - 1)
            live = [blk for blk in live if last[blk[2]] >= k]
        for v in values:
            offset, n = 0, size[v]
            for start, length, _ in live:
                if offset + n <= start:
                    break
                offset = max(offset, start + length)
            offsets[v] = offset
            bisect.insort(live, (offset, n, v))
            ending.add(max(last[v], k))
            arena = max(arena, offset + n)
    return offsets, arena


def check_view(where: str, src: TensorType, dst: TensorType, shape: tuple[int, ...], offset: int,
               output: str | None) -> None:
    """A view of ``src`` as ``dst`` (its ``shape``, from element ``offset``) keeps the
    storage and reads inside it, and a graph ``output`` is no slice; ``where`` heads the
    IRVerificationError otherwise."""
    if src.dtype is not dst.dtype or tuple(dst.shape) != tuple(shape):
        raise IRVerificationError(f"{where}: a view of {src} as {dst} (shape "
                                  f"{list(shape)}) changes the storage")
    if offset < 0 or offset * src.dtype.bits // 8 + nbytes(dst) > nbytes(src):
        raise IRVerificationError(f"{where}: a view of {src} as {dst} at offset "
                                  f"{offset} reads outside its storage")
    if output is not None and (offset or nbytes(src) != nbytes(dst)):
        raise IRVerificationError(f"{where}: graph output '{output}' is a slice "
                                  "of another value; outputs are whole buffers")


@dataclass(frozen=True)
class Plan:
    """A graph lowered for one set of input shapes (see the module docstring)."""

    name: str
    inputs: tuple[str, ...]            # the graph's inputs, in order
    outputs: tuple[str, ...]           # the graph's outputs, in order (with a tail: what it reads)
    types: Mapping[str, TensorType]    # every buffer's type, dimensions concrete
    constants: Mapping[str, np.ndarray] = field(repr=False)   # those the steps or outputs read
    steps: tuple[Step, ...]
    memory: MemoryPlan
    tail: ControlStep | None = None    # data-dependent control flow after the steps
    specialized: tuple[str, ...] = ()  # the inputs whose values the plan holds as constants

    @property
    def kernels(self) -> tuple[KernelStep, ...]:
        """The kernel steps, those inside loops and branches included, in program order."""
        return tuple(st for st in leaves(self.steps) if isinstance(st, KernelStep))

    @cached_property
    def roles(self) -> dict[str, Role]:
        """Each buffer's role; a constant that is also a graph output stays a constant."""
        roles = {name: Role.TEMP for name in self.types}
        roles.update({name: Role.CONSTANT for name in self.constants})
        roles.update({name: Role.INPUT for name in self.inputs})
        root = self.memory.roots.get
        for name in self.outputs:
            if name not in self.constants:
                roles[name] = Role.INOUT if root(name, name) in self.inputs else Role.OUTPUT
        return roles

    def verify(self) -> None:
        """Check the plan's invariants; an :class:`IRVerificationError` names the first
        broken one. Every value is defined once, before it is read (a value a block
        defines is seen only in it); every kernel step's buffers have its definition's
        dtypes, ranks and (its sizes bound by its inputs) shapes; views read within their
        source, and no graph output is a slice; control steps' blocks give what they
        write; every graph output is defined; buffers live at the same time do not
        overlap in the arena."""
        defined = set(self.inputs) | set(self.constants)
        for name in defined:
            self._need_type(name, "input or constant")
        self._verify_steps(self.steps, defined, set(defined))
        for name in self.outputs:
            if name not in defined:
                raise IRVerificationError(f"plan '{self.name}': output '{name}' is never defined")
        self._verify_memory()

    def _verify_steps(self, steps: tuple[Step, ...], visible: set[str], seen: set[str]) -> None:
        """Check ``steps`` in order, reading ``visible`` values (added to as they are
        defined); ``seen``: every value defined anywhere so far."""
        for k, st in enumerate(steps):
            where = f"plan '{self.name}', step {k} ({st.label})"
            for name in st.inputs:
                if name not in visible:
                    raise IRVerificationError(f"{where} reads '{name}' before any step defines it")
            for name in st.defines:
                if name in seen:
                    raise IRVerificationError(f"{where} defines '{name}' a second time")
                self._need_type(name, where)
                visible.add(name)
                seen.add(name)
            if isinstance(st, KernelStep):
                self._verify_kernel(st, where)
            elif isinstance(st, ViewStep):
                self.verify_view(st, where)
            else:
                for block in st.blocks:
                    inner = set(visible)
                    self._verify_steps(block.steps, inner, seen)
                    for name in block.results:
                        if name not in inner:
                            raise IRVerificationError(f"{where}: its block gives '{name}', which "
                                                      "nothing before it defines")
                self._verify_control(st, where)

    def verify_view(self, st: ViewStep, where: str) -> None:
        """View step ``st`` keeps its source's storage and reads inside it (a graph output
        is no slice); ``where`` heads the error."""
        check_view(where, self.types[st.input], self.types[st.output], tuple(st.shape), st.offset,
                   st.output if st.output in self.outputs else None)

    def _verify_control(self, st: ControlFlow, where: str) -> None:
        """A control step's buffers: scalars where it tests or counts, each result of
        the type of the buffer it is copied into, and (a loop) no carried value copied
        from another one's buffer, which the copies before it would have overwritten."""
        t = self.types

        def scalar(name: str, dtype: DType, what: str) -> None:
            if name and (t[name].dtype is not dtype or nbytes(t[name]) != dtype.bits // 8):
                raise IRVerificationError(f"{where}: its {what} '{name}' is {t[name]}; it must "
                                          f"be one {dtype}")

        def same(result: str, into: str, shape: tuple[int | str, ...]) -> None:
            if t[result].dtype is not t[into].dtype or tuple(t[result].shape) != shape:
                raise IRVerificationError(f"{where}: result '{result}' ({t[result]}) does not fit "
                                          f"'{into}' ({t[into]})")
        scalar(st.cond, DType.BOOL, "condition")
        if isinstance(st, BranchStep):
            for block in st.blocks:
                if len(block.results) != len(st.outputs):
                    raise IRVerificationError(f"{where}: a branch gives {len(block.results)} results "
                                              f"for {len(st.outputs)} outputs")
                for result, out in zip(block.results, st.outputs):
                    same(result, out, tuple(t[out].shape))
            return
        scalar(st.trip, DType.INT64, "trip count")
        scalar(st.counter, DType.INT64, "counter")
        scalar(st.going, DType.BOOL, "condition")
        scalar(st.next_cond, DType.BOOL, "next condition")
        if len(st.body.results) != 1 + len(st.carried) + len(st.stacked) or len(st.initial) != len(st.carried):
            raise IRVerificationError(f"{where}: its body gives {len(st.body.results)} results for "
                                      f"{len(st.initial)} initial and {len(st.carried)} carried values "
                                      f"and {len(st.stacked)} scans")
        for init, result, carried in zip(st.initial, st.results, st.carried):
            same(init, carried, tuple(t[carried].shape))
            same(result, carried, tuple(t[carried].shape))
            if self.memory.roots.get(result, result) in {st.going, *st.carried} - {carried}:
                raise IRVerificationError(f"{where}: carried value '{carried}' is copied from "
                                          f"'{result}', the buffer of another")
        for scan, stacked in zip(st.scans, st.stacked):
            same(scan, stacked, tuple(t[stacked].shape[1:]))

    def _need_type(self, name: str, where: str) -> None:
        t = self.types.get(name)
        if t is None or not t.is_static:
            raise IRVerificationError(f"{where}: buffer '{name}' has no concrete type ({t})")

    def _verify_kernel(self, st: KernelStep, where: str) -> None:
        d = st.definition
        if len(st.inputs) != len(d.params) or len(st.defines) != len(d.outputs):
            raise IRVerificationError(
                f"{where}: {d.name} takes {len(d.params)} arguments and defines {len(d.outputs)} "
                f"tensors; the step passes {len(st.inputs)} and defines {len(st.defines)}")
        for p, name in zip(d.params, st.inputs):
            t = self.types[name]
            if p.dtype is not t.dtype or getattr(p, "rank", 0) != t.rank:
                raise IRVerificationError(f"{where}: parameter '{p.name}' of {d.name} is "
                                          f"{p.dtype} of rank {getattr(p, 'rank', 0)}; '{name}' is {t}")
        try:
            sizes = sizes_of_shapes(d, [tuple(int(x) for x in self.types[n].shape) for n in st.inputs])
        except ShapeError as err:   # the buffers disagree with the definition
            raise IRVerificationError(f"{where}: {err}") from None
        for decl, name in zip(d.outputs, st.defines):
            shape = tuple(evaluate_int(e, sizes) for e in decl.shape)
            if decl.dtype is not self.types[name].dtype or shape != tuple(self.types[name].shape):
                raise IRVerificationError(f"{where}: {d.name} defines '{decl.name}' as "
                                          f"{decl.dtype}{list(shape)}; buffer '{name}' is {self.types[name]}")

    def _verify_memory(self) -> None:
        m = self.memory
        _, live_range = live_ranges(self.steps, m.roots)
        placed = sorted((m.offsets[v], block_bytes(self.types[v]), v, live_range.get(v, (0, 0)))
                        for v in m.offsets)
        for offset, size, v, _ in placed:
            if offset % 64 or offset + size > m.arena_bytes:
                raise IRVerificationError(f"plan '{self.name}': '{v}' at arena offset {offset} "
                                          f"({size} bytes) is misaligned or outside the arena "
                                          f"of {m.arena_bytes} bytes")
        for j, (a_off, a_size, a, (a_first, a_last)) in enumerate(placed):
            for b_off, _, b, (b_first, b_last) in placed[j + 1:]:
                if b_off >= a_off + a_size:
                    break
                if a_first <= b_last and b_first <= a_last:
                    raise IRVerificationError(f"plan '{self.name}': '{a}' and '{b}' are live at the "
                                              f"same time and overlap in the arena")

    def __str__(self) -> str:
        roles = self.roles
        where = self.memory.offsets

        def buffer(name: str) -> str:
            text = f"{format_name(name, '%')}: {self.types[name]}"
            return f"{text} @arena+{where[name]}" if name in where else text

        lines = [f"plan {format_name(self.name, '@')}("
                 f"{', '.join(buffer(n) for n in self.inputs)}) -> ("
                 f"{', '.join(f'{buffer(n)} {roles[n].value}' for n in self.outputs)}) {{",
                 f"  arena {self.memory.arena_bytes} bytes (naive {self.memory.naive_bytes})"]
        if self.specialized:
            lines.append(f"  specialized to the values of {', '.join(format_name(n, '%') for n in self.specialized)}")
        lines += [f"  const {buffer(n)}" for n in self.constants]
        lines += self._step_lines(self.steps, buffer, "  ")
        if self.tail is not None:
            node, rest = self.tail.node, len(self.tail.rest)
            named = f"{node.op} {format_name(node.name)}"
            if self.tail.trims:
                how = f"the outputs of {named} cut to their counts, and {rest} nodes after it"
            elif self.tail.waits:
                how = f"{named} and {rest} nodes after it, planned once the values it needs are computed"
            else:
                how = f"{named} and {rest} nodes after it"
            lines.append(f"  then at run time: {how}")
        lines.append("}")
        defs = [f"// {st.label}\n{st.definition}" for st in self.kernels]
        return "\n".join(lines) + ("\n\n" + "\n\n".join(defs) if defs else "")

    def _step_lines(self, steps: tuple[Step, ...], buffer: Callable[[str], str], indent: str) -> list[str]:
        """The lines of ``steps``, blocks indented under their control steps."""
        def names(values: tuple[str, ...]) -> str:
            return ", ".join(format_name(n, "%") for n in values)

        lines = []
        for st in steps:
            args = names(st.inputs)
            if isinstance(st, ViewStep):
                at = f" +{st.offset}" if st.offset else ""
                lines.append(f"{indent}{buffer(st.output)} = view {args}{at}  // {st.label}")
            elif isinstance(st, KernelStep):
                results = ", ".join(buffer(n) for n in st.outputs)
                temps = f" temp ({', '.join(buffer(n) for n in st.temporaries)})" if st.temporaries else ""
                lines.append(f"{indent}({results}){temps} = {st.definition.name}({args})  // {st.label}")
            elif isinstance(st, LoopStep):
                carried = ", ".join(f"{buffer(c)} = {format_name(i, '%')}" for c, i in zip(st.carried, st.initial))
                bounds = "".join(f" {key} {format_name(n, '%')}" for key, n in (("trip", st.trip), ("cond", st.cond))
                                 if n)
                lines.append(f"{indent}loop ({carried}){bounds} counter {buffer(st.counter)} condition "
                             f"{buffer(st.going)} {{  // {st.label}")
                lines += self._step_lines(st.body.steps, buffer, indent + "  ")
                scans = ", ".join(f"{format_name(v, '%')} -> {buffer(b)}" for v, b in zip(st.scans, st.stacked))
                lines.append(f"{indent}  next {format_name(st.next_cond, '%')} carry ({names(st.results)})"
                             + (f" scan ({scans})" if scans else ""))
                lines.append(f"{indent}}}")
            else:
                lines.append(f"{indent}({', '.join(buffer(n) for n in st.outputs)}) = if {args} {{  // {st.label}")
                for k, block in enumerate(st.blocks):
                    lines += self._step_lines(block.steps, buffer, indent + "  ")
                    lines.append(f"{indent}  yield ({names(block.results)})")
                    lines.append(f"{indent}}} else {{" if k == 0 else f"{indent}}}")
        return lines


@runtime_checkable
class Planner(Protocol):
    """The re-planning protocol (see the module docstring): what a compiled model may ask
    of the lowering. ``graph`` is the graph it plans (after the graph passes)."""

    graph: Graph

    def plan(self, shapes: Mapping[str, tuple[int, ...]], values: Mapping[str, np.ndarray]) -> Plan:
        """``graph`` lowered for inputs of these ``shapes``, specialized to ``values``
        (those inputs a lowering needs at plan time); raises NeedsValue naming an input
        whose value it needs."""
        ...

    def subgraph(self, graph: Graph, passes: bool) -> Planner:
        """A planner of ``graph``, a branch or loop body (``passes``: through the graph
        passes first) or the rest of this graph after data-dependent control flow."""
        ...

    def definition(self, source: str, sizes: tuple[str, ...] = ()) -> Definition:
        """A kernel's TC text parsed, as the lowering parses its kernels' (a kernel of a
        plan generalized over its sizes: :mod:`polyfuse.runtime.generalize`); ``sizes``
        are sizes though no input's shape declares them (the caller gives them)."""
        ...
