"""Plan IR: a graph lowered for one set of input shapes, before any code is generated.

The boundary between the graph and the code that runs it (Glow draws the same line
between its graph and its instructions). A :class:`Plan` is a straight-line program over
named buffers:

* every **buffer** has a type with concrete dimensions and a role (:class:`Role`): a
  graph input, a graph output, both (``inout``: an output that is an input or a view of
  one), a constant (weights, folded values, repacked weights), or a temporary (an
  intermediate value or a kernel's private tensor);
* every **step** is a :class:`KernelStep` (one TC :class:`Definition` called on buffers:
  one node's lowering or a fusion group composed into one definition) or a
  :class:`ViewStep` (a reshape sharing its source's storage);
* the **memory plan** (:func:`plan_memory`) places every temporary in one arena by
  liveness; graph outputs get arrays of their own.

``lowering.plan.plan_graph`` makes plans; the runtime compiles each kernel step for a
target and runs the steps. ``str(plan)`` prints it; :meth:`Plan.verify` checks it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from polyfuse.errors import IRVerificationError, ShapeError
from polyfuse.ir.comprehension import Definition
from polyfuse.ir.graph import Node, TensorType, format_name
from polyfuse.ir.sizes import bind_sizes, sizes_of_shapes
from polyfuse.ir.symbolic import evaluate_int


class Role(enum.Enum):
    INPUT = "in"
    OUTPUT = "out"
    INOUT = "inout"       # a graph output that is a graph input or a view of one
    CONSTANT = "const"
    TEMP = "temp"         # an intermediate value, or a kernel's private tensor


@dataclass(frozen=True)
class KernelStep:
    """One TC definition called on buffers: a value per parameter (``inputs``), per
    result the graph uses (``outputs``, the definition's first outputs) and per private
    tensor (``temporaries``, the rest)."""

    label: str                 # the node, or the fusion group and its nodes
    definition: Definition     # with symbolic sizes, as lowered
    source: str                # its TC text
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    temporaries: tuple[str, ...] = ()

    @property
    def defines(self) -> tuple[str, ...]:
        return self.outputs + self.temporaries


@dataclass(frozen=True)
class ViewStep:
    """``output`` is ``input``'s storage as ``shape``, from ``offset`` elements in: a
    reshape (at 0), or a slice along the first dimension (one time step of a sequence).
    Kernels only read views at an offset (their outputs are aligned allocations)."""

    label: str
    input: str
    output: str
    shape: tuple[int, ...]
    offset: int = 0

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,)

    @property
    def defines(self) -> tuple[str, ...]:
        return (self.output,)


Step = KernelStep | ViewStep


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
    return t.dtype.bits // 8 * int(np.prod([int(d) for d in t.shape], dtype=np.int64))


def block_bytes(t: TensorType, alignment: int = 64) -> int:
    """The bytes a buffer of type ``t`` takes in the arena (at least one byte, aligned)."""
    return aligned(max(1, nbytes(t)), alignment)


def plan_memory(steps: tuple[Step, ...], types: Mapping[str, TensorType], outputs: set[str],
                alignment: int = 64) -> MemoryPlan:
    """First-fit placement of the storage each kernel defines (its temporaries too),
    freed after the last step reading it or any view of it."""
    roots: dict[str, str] = {}
    starts: dict[str, int] = {}
    for st in steps:
        if isinstance(st, ViewStep):
            roots[st.output] = roots.get(st.input, st.input)
            start = starts.get(st.input, 0) + st.offset * types[st.input].dtype.bits // 8
            if start:
                starts[st.output] = start
    size = {v: block_bytes(types[v], alignment)
            for st in steps if isinstance(st, KernelStep) for v in st.defines}
    kept = {roots.get(v, v) for v in outputs}
    last: dict[str, int] = {}
    for k, st in enumerate(steps):
        for v in st.inputs + st.defines:
            root = roots.get(v, v)
            if root in size:
                last[root] = k
    live: list[tuple[int, int, str]] = []   # (offset, size, value)
    offsets: dict[str, int] = {}
    arena = 0
    for k, st in enumerate(steps):
        live = [blk for blk in live if last[blk[2]] >= k]
        for v in st.defines if isinstance(st, KernelStep) else ():
            if v in kept:
                continue
            offset = 0
            for start, length, _ in sorted(live):
                if offset + size[v] <= start:
                    break
                offset = max(offset, start + length)
            offsets[v] = offset
            live.append((offset, size[v], v))
            arena = max(arena, offset + size[v])
    return MemoryPlan(offsets, arena, sum(size.values()), roots, starts)


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

    @property
    def kernels(self) -> tuple[KernelStep, ...]:
        return tuple(st for st in self.steps if isinstance(st, KernelStep))

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
        broken one. Every value is defined once, before it is read; every kernel step's
        buffers have its definition's dtypes, ranks and (its sizes bound by its inputs)
        shapes; views read within their source, and no graph output is a slice; every
        graph output is defined; buffers live at the same time do not overlap in the arena."""
        defined = set(self.inputs) | set(self.constants)
        for name in defined:
            self._need_type(name, "input or constant")
        for k, st in enumerate(self.steps):
            where = f"plan '{self.name}', step {k} ({st.label})"
            for name in st.inputs:
                if name not in defined:
                    raise IRVerificationError(f"{where} reads '{name}' before any step defines it")
            for name in st.defines:
                if name in defined:
                    raise IRVerificationError(f"{where} defines '{name}' a second time")
                self._need_type(name, where)
                defined.add(name)
            if isinstance(st, KernelStep):
                self._verify_kernel(st, where)
            else:
                src, dst = self.types[st.input], self.types[st.output]
                if src.dtype is not dst.dtype or tuple(dst.shape) != tuple(st.shape):
                    raise IRVerificationError(f"{where}: a view of {src} as {dst} (shape "
                                              f"{list(st.shape)}) changes the storage")
                if st.offset < 0 or st.offset * src.dtype.bits // 8 + nbytes(dst) > nbytes(src):
                    raise IRVerificationError(f"{where}: a view of {src} as {dst} at offset "
                                              f"{st.offset} reads outside its storage")
                if st.output in self.outputs and (st.offset or nbytes(src) != nbytes(dst)):
                    raise IRVerificationError(f"{where}: graph output '{st.output}' is a slice "
                                              "of another value; outputs are whole buffers")
        for name in self.outputs:
            if name not in defined:
                raise IRVerificationError(f"plan '{self.name}': output '{name}' is never defined")
        self._verify_memory()

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
        for t, name in zip(bind_sizes(d, sizes).outputs, st.defines):
            shape = tuple(evaluate_int(e, {}) for e in t.shape)
            if t.dtype is not self.types[name].dtype or shape != tuple(self.types[name].shape):
                raise IRVerificationError(f"{where}: {d.name} defines '{t.name}' as "
                                          f"{t.dtype}{list(shape)}; buffer '{name}' is {self.types[name]}")

    def _verify_memory(self) -> None:
        m = self.memory
        live_range: dict[str, tuple[int, int]] = {}
        for k, st in enumerate(self.steps):
            for name in st.inputs + st.defines:
                root = m.roots.get(name, name)
                if root in m.offsets:
                    first, _ = live_range.get(root, (k, k))
                    live_range[root] = (first, k)
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
        lines += [f"  const {buffer(n)}" for n in self.constants]
        for st in self.steps:
            args = ", ".join(format_name(n, "%") for n in st.inputs)
            if isinstance(st, ViewStep):
                at = f" +{st.offset}" if st.offset else ""
                lines.append(f"  {buffer(st.output)} = view {args}{at}  // {st.label}")
                continue
            results = ", ".join(buffer(n) for n in st.outputs)
            temps = f" temp ({', '.join(buffer(n) for n in st.temporaries)})" if st.temporaries else ""
            lines.append(f"  ({results}){temps} = {st.definition.name}({args})  // {st.label}")
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
