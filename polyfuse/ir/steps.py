"""The steps of a plan (:mod:`polyfuse.ir.plan`): kernel calls, views, and control flow
the program runs (loops and branches whose trip count or condition the data decides).

Control steps hold steps of their own (a :class:`Block` per body or branch), planned once
for the shapes they get, inside the enclosing plan: a loop's carried values keep one
shape in every iteration, a branch's outputs one shape in either branch. Their
buffers live in the plan's arena like any other; :func:`live_ranges` gives each one's
lifetime over the steps laid out in order (:func:`events`), where a value read inside a
loop stays live until the loop ends (the next iteration reads it again).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from polyfuse.ir.comprehension import Definition

# a kernel step's definition after each comprehension pass it went through, in order:
# (pass name, definition), the first ("input", as the op library or the composition made it)
History = tuple[tuple[str, Definition], ...]


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
    history: History = field(default=(), compare=False, repr=False)   # ends at ``definition``

    @property
    def defines(self) -> tuple[str, ...]:
        return self.outputs + self.temporaries

    @property
    def allocates(self) -> tuple[str, ...]:
        return self.defines


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

    @property
    def allocates(self) -> tuple[str, ...]:
        return ()


@dataclass(frozen=True)
class Block:
    """Steps run together (a loop's body, a branch) and the values they give."""

    steps: tuple[Step, ...]
    results: tuple[str, ...]


@dataclass(frozen=True)
class LoopStep:
    """An ONNX Loop: while ``counter < trip`` (when there is a trip count) and ``going``
    (set from ``cond``, else true), run ``body``, whose results are the next condition,
    the carried values and the scan values; the carried values are copied into
    ``carried`` (which the body reads, and which hold the final values), each scan value
    into row ``counter`` of its ``stacked`` buffer; then ``counter`` counts the
    iteration. ``counter`` ends as the number of iterations run."""

    label: str
    trip: str                   # int64 buffer of one element; "" for none
    cond: str                   # bool buffer of one element; "" for none
    initial: tuple[str, ...]    # the carried values' initial buffers
    counter: str                # int64 scalar: the iteration number the body reads
    going: str                  # bool scalar: the condition the body reads
    carried: tuple[str, ...]
    body: Block                 # results: next condition, carried values, scan values
    stacked: tuple[str, ...]    # per scan value: a buffer of one row per possible iteration

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(n for n in (self.trip, self.cond) if n) + self.initial

    @property
    def defines(self) -> tuple[str, ...]:
        return (self.counter, self.going, *self.carried, *self.stacked)

    @property
    def allocates(self) -> tuple[str, ...]:
        return self.defines

    @property
    def next_cond(self) -> str:
        return self.body.results[0]

    @property
    def results(self) -> tuple[str, ...]:
        return self.body.results[1:1 + len(self.carried)]

    @property
    def scans(self) -> tuple[str, ...]:
        return self.body.results[1 + len(self.carried):]

    @property
    def blocks(self) -> tuple[Block, ...]:
        return (self.body,)


@dataclass(frozen=True)
class BranchStep:
    """An ONNX If: ``then`` when ``cond`` (a bool buffer of one element) is true, else
    ``other``; the branch's results are copied into ``outputs``."""

    label: str
    cond: str
    outputs: tuple[str, ...]
    then: Block
    other: Block

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.cond,)

    @property
    def defines(self) -> tuple[str, ...]:
        return self.outputs

    @property
    def allocates(self) -> tuple[str, ...]:
        return self.outputs

    @property
    def blocks(self) -> tuple[Block, ...]:
        return (self.then, self.other)


Step = KernelStep | ViewStep | LoopStep | BranchStep
ControlFlow = LoopStep | BranchStep


def leaves(steps: tuple[Step, ...]) -> Iterator[KernelStep | ViewStep]:
    """The kernel and view steps, those inside control steps included, in program order
    (a loop's body once, a branch's then before its else)."""
    for st in steps:
        if isinstance(st, (LoopStep, BranchStep)):
            for block in st.blocks:
                yield from leaves(block.steps)
        else:
            yield st


@dataclass(frozen=True)
class Event:
    """One position of the steps laid out in order: what it reads, defines, and
    defines with storage of its own (views share their source's)."""

    reads: tuple[str, ...]
    defines: tuple[str, ...] = ()
    allocates: tuple[str, ...] = ()


def events(steps: tuple[Step, ...]) -> tuple[list[Event], list[tuple[int, int]]]:
    """The steps as positions in order, and each loop's (first, last) positions: a
    control step defines its buffers where it starts, each block ends by reading its
    results (and a loop's state, which the next iteration reads)."""
    out: list[Event] = []
    loops: list[tuple[int, int]] = []

    def walk(steps: tuple[Step, ...]) -> None:
        for st in steps:
            out.append(Event(st.inputs, st.defines, st.allocates))
            if isinstance(st, LoopStep):
                start = len(out) - 1
                walk(st.body.steps)   # each iteration tests the trip count again
                out.append(Event(st.body.results + st.defines + ((st.trip,) if st.trip else ())))
                loops.append((start, len(out) - 1))
            elif isinstance(st, BranchStep):
                for block in st.blocks:
                    walk(block.steps)
                    out.append(Event(block.results + st.outputs))
    walk(steps)
    return out, loops


def view_roots(steps: tuple[Step, ...], itemsize: Mapping[str, int]) -> tuple[dict[str, str], dict[str, int]]:
    """Each view's root (the value whose storage it shares) and its start in bytes into it
    (when not 0); ``itemsize`` gives each value's bytes per element."""
    roots: dict[str, str] = {}
    starts: dict[str, int] = {}
    for st in leaves(steps):
        if isinstance(st, ViewStep):
            roots[st.output] = roots.get(st.input, st.input)
            start = starts.get(st.input, 0) + st.offset * itemsize[st.input]
            if start:
                starts[st.output] = start
    return roots, starts


def live_ranges(steps: tuple[Step, ...], roots: Mapping[str, str]) -> tuple[list[Event], dict[str, tuple[int, int]]]:
    """The steps' events and, for each root value used, the first and last events that
    use it (or a view of it); a value defined before a loop and used inside it is live
    until the loop's last event."""
    laid, loops = events(steps)
    span: dict[str, tuple[int, int]] = {}
    for k, ev in enumerate(laid):
        for v in ev.reads + ev.defines:
            root = roots.get(v, v)
            span[root] = (span.get(root, (k, k))[0], k)
    for start, end in loops:
        used = {roots.get(v, v) for ev in laid[start + 1:end + 1] for v in ev.reads + ev.defines}
        for root in used:
            first, last = span[root]
            if first <= start:
                span[root] = (first, max(last, end))
    return laid, span
