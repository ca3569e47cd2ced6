"""A plan's kernels as a program: where every argument of every call lives.

Three things run a compiled model's kernels as one unit: the in-process native program
(:class:`polyfuse.runtime.native.Program`), ahead-of-time bundles
(:mod:`polyfuse.runtime.bundle`) and programs run under an emulator
(:mod:`polyfuse.runtime.cross`). They share what is decided here, once per plan:

* the **memory plan** (the plan's, :func:`polyfuse.ir.plan.plan_memory`):
  intermediates placed in one arena by liveness, as Glow does;
* the **calls** (:class:`ProgramLayout`): each kernel's arguments as ``(base, index,
  offset)``: the arena at ``offset`` (a GPU kernel's scratch buffers in a region after
  the plan's, which every call reuses), input ``index``, output slot ``index``, the
  constant named ``index`` (weights), or the int64 error slot a kernel sets when an
  index read from a tensor is out of bounds; and the bytes to zero before the call;
* the **code** (:mod:`polyfuse.runtime.instructions`): the instructions running the
  calls, in order, or in the plan's loops and branches (copies, counters, jumps);
* the **results**: each graph output is an output slot, a copy of another slot or of an
  input, or a constant.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np

from polyfuse.ir.comprehension import Definition, Read
from polyfuse.ir.loops import ERROR_BUFFER, BufferRole, LoopKernel, Packing, stmt_nodes, walk_stmts
from polyfuse.ir.plan import KernelStep, Plan, aligned
from polyfuse.ir.steps import events, leaves
from polyfuse.ir.types import aligned_array
from polyfuse.runtime.generalize import Generic
from polyfuse.runtime.instructions import Instruction, Run, program_code



class CompiledKernel(Protocol):
    """A kernel compiled for a target (a :class:`~polyfuse.runtime.kernel.CompiledKernel`):
    its definition with sizes bound, its stages' texts, and what runs it (with the
    ``layout`` of its arguments on CPU and GPU targets)."""

    definition: Definition
    stages: dict[str, str]
    run: Any

# bases of an argument's location (the numbering of native.Program)
ARENA, INPUT, OUTPUT, CONSTANT, ERROR = range(5)
UNREAD = "<unread>"   # the constant passed for inputs a kernel never reads


@dataclass(frozen=True)
class CompiledPlan:
    """A :class:`~polyfuse.ir.plan.Plan` with each kernel step compiled for a target
    (``kernels[k]`` for the ``k``-th of the plan's kernel and view steps, those in loops and
    branches included: :func:`~polyfuse.ir.steps.leaves`; None for a view) and what runs
    them all as one unit (``program``: native, emulated or on the GPU), or None where each
    step runs by itself. ``generic[k]``: where the ``k``-th kernel is a kernel compiled
    for symbolic sizes bound to the plan's, that kernel and its template (the plan
    templates bind it again at other sizes: :mod:`polyfuse.runtime.plan_template`);
    empty where none is."""

    plan: Plan
    kernels: tuple[CompiledKernel | None, ...]
    program: Any = None
    generic: tuple[Generic | None, ...] = ()

    @property
    def generics(self) -> tuple[Generic | None, ...]:
        """``generic``, or None for each step where no kernel is symbolic."""
        return self.generic or (None,) * len(self.kernels)

    @property
    def tail(self) -> Any:
        """The plan's control flow after its steps (None: there is none)."""
        return self.plan.tail

    def steps(self) -> Iterator[tuple[KernelStep, CompiledKernel]]:
        """The kernel steps and their compiled kernels, in order."""
        for st, kernel in zip(leaves(self.plan.steps), self.kernels):
            if kernel is not None:
                assert isinstance(st, KernelStep)
                yield st, kernel


# packed copies of constants, shared by every plan (of every model) that packs the same
# array alike: a model planned at a new shape packs its weights once, not again per
# plan. An entry lives as long as its source array (weights: the model's life; a value
# folded at plan time: its plan's).
_SHARED_PACKINGS: dict[tuple[int, tuple[int, ...], str], np.ndarray] = {}
_SHARED_LOCK = threading.Lock()


def shared_packed_copy(source: np.ndarray, shape: tuple[int, ...], packing: Packing) -> np.ndarray:
    """:func:`packed_copy` of ``source``, made once while ``source`` lives."""
    key = (id(source), shape, str(packing))
    with _SHARED_LOCK:
        found = _SHARED_PACKINGS.get(key)
    if found is not None:
        return found
    out = packed_copy(source, shape, packing)
    with _SHARED_LOCK:
        if key not in _SHARED_PACKINGS:
            _SHARED_PACKINGS[key] = out
            weakref.finalize(source, _SHARED_PACKINGS.pop, key, None)
        return _SHARED_PACKINGS[key]


def packed_copy(source: np.ndarray, shape: tuple[int, ...], packing: Packing) -> np.ndarray:
    """``source`` packed by ``packing`` into a new 64-byte aligned array of ``shape`` (its
    panels start on cache lines, as the kernel's own packed copies do)."""
    from polyfuse.runtime import native
    out = native.empty_aligned(shape, source.dtype)
    np.copyto(out, packing.apply(source, shape))
    return out


@dataclass(frozen=True)
class Layout:
    """How to call a compiled kernel: its arguments in order and the outputs to allocate.
    Inputs named in ``packed`` are made from another input (their packing's source) before
    the call: once per plan for constants, else on each call."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[tuple[str, tuple[int, ...], str, bool], ...]  # name, shape, dtype, zeroed
    checks_indices: bool
    scalars: tuple[str, ...]
    packed: tuple[tuple[str, tuple[int, ...], Packing], ...] = ()  # name, shape, packing
    unread: tuple[str, ...] = ()     # inputs the code never reads (a packed input's source)

    @property
    def symbolic(self) -> bool:
        """Whether the kernel was compiled for symbolic sizes: an output's extent the
        call decides is -1 here (its caller gives the shapes of each call)."""
        return any(n < 0 for _, s, _, _ in self.outputs for n in s)

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.inputs

    @staticmethod
    def of(kernel: LoopKernel, zeroed: set[str]) -> Layout:
        read = {e.tensor for st in walk_stmts(kernel.body) for e in stmt_nodes(st) if isinstance(e, Read)}
        outputs = [b for b in kernel.buffers if b.role is BufferRole.OUT]
        return Layout(kernel.name,
                      tuple(b.name for b in kernel.buffers if b.role is BufferRole.IN),
                      tuple((b.name, tuple(n if isinstance(n, int) else -1 for n in b.shape), b.dtype.value,
                             b.name in zeroed) for b in outputs),
                      any(b.name == ERROR_BUFFER for b in kernel.buffers),
                      tuple(s.name for s in kernel.scalars),
                      tuple((b.name, b.shape, b.packing) for b in kernel.buffers if b.packing is not None),
                      tuple(b.name for b in kernel.buffers if b.role is BufferRole.IN and b.name not in read))

    def arguments(self, values: Mapping[str, Any]) -> list[np.ndarray]:
        """The input arrays in order; packed inputs not in ``values`` made from their sources
        (a kernel called alone, on every call: a compiled model gives them made once)."""
        if not self.packed:   # every call of most kernels: no packed inputs to look for
            return [np.ascontiguousarray(values[n]) for n in self.inputs]
        packed = {name: (shape, p) for name, shape, p in self.packed}
        return [np.ascontiguousarray(values[n]) if n in values or n not in packed
                else packed_copy(np.asarray(values[packed[n][1].source]), *packed[n]) for n in self.inputs]

    def given_outputs(self, values: Mapping[str, object]) -> dict[str, np.ndarray]:
        """The outputs named in ``values`` (``out=``), in output order. Callers checked
        them (C-contiguous, writable arrays of the output's shape and type), so they are
        typed as arrays here."""
        return {n: cast(np.ndarray, values[n]) for n, _, _, _ in self.outputs if n in values}


@dataclass(frozen=True)
class Call:
    """One kernel call: its compiled executable (with ``layout``), its stages, its
    arguments as ``(base, index, offset)`` and the ``(argument, bytes)`` to zero first."""

    label: str
    executable: Any = field(repr=False)
    stages: dict[str, str] = field(repr=False)
    args: tuple[tuple[int, Any, int], ...]
    zero: tuple[tuple[int, int], ...]
    # per argument, what it holds where that changes with the plan's sizes: the value it
    # locates, or the kernel's size (``"<size>name"``); None for the rest
    holds: tuple[str | None, ...] = field(default=(), repr=False, compare=False)


@dataclass(frozen=True)
class Tensor:
    """An input or output of a program: its name, shape and numpy dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass
class ProgramLayout:
    """A plan's kernel calls with every argument placed (see the module docstring)."""

    inputs: list[Tensor]
    outputs: list[Tensor]                          # the graph's outputs, in order
    slots: list[tuple[tuple[int, ...], np.dtype]]  # output arrays the kernels write
    results: list[tuple[str, str, Any]]            # (output, how, slot / input / constant name)
    calls: Sequence[Call]                          # (a template's: made when read)
    constants: dict[str, np.ndarray]               # the constants the calls and results read
    arena_bytes: int
    code: list[Instruction]                        # what runs the calls (in loops, branches)

    @staticmethod
    def of(compiled: CompiledPlan, packed_before: Mapping[str, np.ndarray] | None = None) -> ProgramLayout:
        """``packed_before``: packed constants by name, made before for this plan (a
        program of it loaded from the disk), used instead of packing them again."""
        plan = compiled.plan
        memory = plan.memory
        root = memory.roots.get
        position = {name: k for k, name in enumerate(plan.inputs)}
        slots: list[tuple[tuple[int, ...], np.dtype]] = []
        slot_of: dict[str, int] = {}
        results: list[tuple[str, str, Any]] = []
        constants: dict[str, np.ndarray] = {}
        produced = {v for ev in events(plan.steps)[0] for v in ev.allocates}
        for name in plan.outputs:
            r = root(name, name)
            if r in produced and r not in slot_of:
                slot_of[r] = len(slots)
                slots.append((tuple(int(d) for d in plan.types[r].shape), plan.types[r].dtype.numpy))
                results.append((name, "slot", slot_of[r]))
            elif r in slot_of:
                results.append((name, "copy-slot", slot_of[r]))
            elif r in position:
                results.append((name, "copy-input", position[r]))
            else:
                constants[name] = np.ascontiguousarray(plan.constants[name])
                results.append((name, "constant", name))

        def location(value: str) -> tuple[int, Any, int]:
            r, start = root(value, value), memory.starts.get(value, 0)
            if r in position:
                return (INPUT, position[r], start)
            if r in slot_of:
                return (OUTPUT, slot_of[r], start)
            if r in memory.offsets:
                return (ARENA, 0, memory.offsets[r] + start)
            constants.setdefault(r, aligned_array(plan.constants[r]))   # (a view of one may not be)
            return (CONSTANT, r, start)

        def packed(value: str, shape: tuple[int, ...], packing: Packing) -> tuple[int, Any, int]:
            """A constant's packed copy, made once (kernels packing it alike share it)."""
            name = f"{value}={packing}{list(shape)}"   # (what names its packed copy in every plan)
            before = (packed_before or {}).get(name)
            if name not in constants and before is not None and before.shape == shape \
                    and before.dtype == np.asarray(plan.constants[value]).dtype:
                constants[name] = before
            if name not in constants:
                constants[name] = shared_packed_copy(np.asarray(plan.constants[value]), shape, packing)
            return (CONSTANT, name, 0)

        def nothing() -> tuple[int, Any, int]:
            """What a kernel gets for a constant it does not read (weights read only packed):
            not the weights, which would then be kept, and bundled, twice."""
            constants.setdefault(UNREAD, np.zeros(1, np.uint8))
            return (CONSTANT, UNREAD, 0)

        def size(value: int) -> tuple[int, Any, int]:
            """A size a kernel compiled for symbolic sizes takes: an int64 the call points at."""
            key = f"<size {value}>"
            constants.setdefault(key, np.array([value], np.int64))
            return (CONSTANT, key, 0)

        calls: list[Call] = []
        call_of = {}
        scratch_base = scratch_end = aligned(memory.arena_bytes, 256)
        for st, kernel in compiled.steps():
            call_of[id(st)] = len(calls)
            layout = kernel.run.layout
            by_param = dict(zip((p.name for p in kernel.definition.params), st.inputs))
            by_output = dict(zip((t.name for t in kernel.definition.outputs), st.defines))
            packings = {n: (shape, p) for n, shape, p in getattr(layout, "packed", ())}
            unread = set(getattr(layout, "unread", ()))
            args = [packed(by_param[packings[n][1].source], *packings[n]) if n in packings
                    else nothing() if n in unread and by_param[n] in plan.constants
                    else location(by_param[n]) for n in layout.input_names]
            holds: list[str | None] = [None if n in packings or n in unread and by_param[n] in plan.constants
                                       else by_param[n] for n in layout.input_names]
            zero = []
            for name, _, dtype, zeroed in layout.outputs:
                nbytes = math.prod(int(d) for d in plan.types[by_output[name]].shape) * np.dtype(dtype).itemsize
                if zeroed and nbytes:
                    zero.append((len(args), nbytes))
                args.append(location(by_output[name]))
                holds.append(by_output[name])
            start = scratch_base   # a kernel's scratch (GPU split-k sums): after the arena, reused by each call
            for nbytes in getattr(layout, "scratch_bytes", ()):
                args.append((ARENA, 0, start))
                start = aligned(start + nbytes, 256)
            scratch_end = max(scratch_end, start)
            if layout.checks_indices:
                args.append((ERROR, 0, 0))
            args += [size(kernel.run.sizes[n]) for n in layout.scalars]   # a symbolic kernel's sizes
            holds += [None] * (len(args) - len(holds) - len(layout.scalars)) + [f"<size>{n}" for n in layout.scalars]
            calls.append(Call(st.label, kernel.run, kernel.stages, tuple(args), tuple(zero), tuple(holds)))

        def tensor(name: str) -> Tensor:
            t = plan.types[name]
            return Tensor(name, tuple(int(d) for d in t.shape), t.dtype.numpy)
        code = program_code(plan, location, call_of)
        return ProgramLayout([tensor(n) for n in plan.inputs], [tensor(n) for n in plan.outputs],
                             slots, results, calls, constants,
                             max(memory.arena_bytes if scratch_end == scratch_base else scratch_end, 64), code)

    @staticmethod
    def of_kernel(executable: Any, stages: dict[str, str], inputs: list[Tensor],
                  scalars: list[str]) -> ProgramLayout:
        """One kernel alone as a program, its arguments in the kernel ABI's order: its
        inputs, its outputs, the error slot when it checks indices, then the scalars
        (inputs after the arrays, each an 8-byte int64 or double)."""
        layout = executable.layout
        args: list[tuple[int, Any, int]] = [(INPUT, k, 0) for k in range(len(inputs))]
        zero = []
        outputs = []
        for k, (name, shape, dtype, zeroed) in enumerate(layout.outputs):
            t = Tensor(name, tuple(shape), np.dtype(dtype))
            if zeroed and t.nbytes:
                zero.append((len(args), t.nbytes))
            args.append((OUTPUT, k, 0))
            outputs.append(t)
        if layout.checks_indices:
            args.append((ERROR, 0, 0))
        args += [(INPUT, len(inputs) + j, 0) for j in range(len(scalars))]
        scalar_slots = [Tensor(name, (), np.dtype(np.int64)) for name in scalars]
        return ProgramLayout(inputs + scalar_slots, outputs,
                             [(t.shape, t.dtype) for t in outputs],
                             [(t.name, "slot", k) for k, t in enumerate(outputs)],
                             [Call(layout.name, executable, stages, tuple(args), tuple(zero))],
                             {}, 64, [Run(0)])

    def weights(self, alignment: int = 64) -> tuple[bytes, dict[str, int]]:
        """The constants packed into one blob, each at an aligned offset: the blob and
        each constant's offset."""
        offsets: dict[str, int] = {}
        size = 0
        for name, array in self.constants.items():
            offsets[name] = size
            size = aligned(size + max(array.nbytes, 1), alignment)
        blob = bytearray(size)
        for name, array in self.constants.items():
            blob[offsets[name]:offsets[name] + array.nbytes] = array.tobytes()
        return bytes(blob), offsets

    def collect(self, inputs: list[np.ndarray], slots: list[np.ndarray]) -> dict[str, np.ndarray]:
        """The graph outputs from the output slots after a run (copies where an output
        is another output, an input or a constant)."""
        out: dict[str, np.ndarray] = {}
        for t, (name, how, what) in zip(self.outputs, self.results):
            if how == "slot":
                out[name] = slots[what].reshape(t.shape)
            elif how == "copy-slot":
                out[name] = slots[what].reshape(t.shape).copy()
            elif how == "copy-input":
                out[name] = inputs[what].reshape(t.shape).copy()
            else:
                out[name] = np.array(self.constants[what], copy=True).reshape(t.shape)
        return out
