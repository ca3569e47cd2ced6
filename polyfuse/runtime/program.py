"""A plan's kernels as a program: where every argument of every call lives.

Three things run a compiled model's kernels as one unit: the in-process native program
(:class:`polyfuse.runtime.native.Program`), ahead-of-time bundles
(:mod:`polyfuse.runtime.bundle`) and programs run under an emulator
(:mod:`polyfuse.runtime.cross`). They share what is decided here, once per plan:

* the **memory plan** (:func:`plan_memory`): intermediates placed in one arena by
  liveness, as Glow does;
* the **calls** (:class:`ProgramLayout`): each kernel's arguments as ``(base, index,
  offset)``: the arena at ``offset``, input ``index``, output slot ``index``, the
  constant named ``index`` (weights), or the int64 error slot a kernel sets when an
  index read from a tensor is out of bounds; and the bytes to zero before the call;
* the **results**: each graph output is an output slot, a copy of another slot or of an
  input, or a constant.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from polyfuse.ir.graph import TensorType

if TYPE_CHECKING:
    from polyfuse.runtime.model import _Plan, _Step

# bases of an argument's location (the numbering of native.Program)
ARENA, INPUT, OUTPUT, CONSTANT, ERROR = range(5)


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


def plan_memory(steps: list[_Step], types: dict[str, TensorType], outputs: set[str],
                alignment: int = 64) -> MemoryPlan:
    """First-fit placement of the storage each kernel defines (its temporaries too),
    freed after the last step reading it or any view of it."""
    roots: dict[str, str] = {}
    for st in steps:
        if st.spec is None:
            roots[st.outputs[0]] = roots.get(st.inputs[0], st.inputs[0])
    size = {v: aligned(max(1, types[v].dtype.bits // 8 * _count(types[v])), alignment)
            for st in steps if st.spec is not None for v in st.outputs + st.temporaries}
    kept = {roots.get(v, v) for v in outputs}
    last: dict[str, int] = {}
    for k, st in enumerate(steps):
        for v in st.inputs + st.outputs + st.temporaries:
            root = roots.get(v, v)
            if root in size:
                last[root] = k
    live: list[tuple[int, int, str]] = []   # (offset, size, value)
    offsets: dict[str, int] = {}
    arena = 0
    for k, st in enumerate(steps):
        live = [blk for blk in live if last[blk[2]] >= k]
        for v in st.outputs + st.temporaries if st.spec is not None else ():
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
    return MemoryPlan(offsets, arena, sum(size.values()), roots)


def aligned(nbytes: int, alignment: int = 64) -> int:
    return -(-nbytes // alignment) * alignment


def _count(t: TensorType) -> int:
    n = 1
    for d in t.shape:
        n *= int(d)
    return n


@dataclass(frozen=True)
class Call:
    """One kernel call: its compiled executable (with ``layout``), its stages, its
    arguments as ``(base, index, offset)`` and the ``(argument, bytes)`` to zero first."""

    label: str
    executable: Any = field(repr=False)
    stages: dict[str, str] = field(repr=False)
    args: tuple[tuple[int, Any, int], ...]
    zero: tuple[tuple[int, int], ...]


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
    calls: list[Call]
    constants: dict[str, np.ndarray]               # the constants the calls and results read
    arena_bytes: int

    @staticmethod
    def of(plan: _Plan) -> ProgramLayout:
        graph = plan.model.graph
        memory = plan.memory
        root = memory.roots.get
        position = {v.name: k for k, v in enumerate(graph.inputs)}
        slots: list[tuple[tuple[int, ...], np.dtype]] = []
        slot_of: dict[str, int] = {}
        results: list[tuple[str, str, Any]] = []
        constants: dict[str, np.ndarray] = {}
        produced = {v for st in plan.steps if st.spec is not None for v in st.outputs}
        for v in graph.outputs:
            r = root(v.name, v.name)
            if r in produced and r not in slot_of:
                slot_of[r] = len(slots)
                slots.append((tuple(int(d) for d in plan.types[r].shape), plan.types[r].dtype.numpy))
                results.append((v.name, "slot", slot_of[r]))
            elif r in slot_of:
                results.append((v.name, "copy-slot", slot_of[r]))
            elif r in position:
                results.append((v.name, "copy-input", position[r]))
            else:
                constants[v.name] = np.ascontiguousarray(plan.consts[v.name])
                results.append((v.name, "constant", v.name))

        def location(value: str) -> tuple[int, Any, int]:
            r = root(value, value)
            if r in position:
                return (INPUT, position[r], 0)
            if r in slot_of:
                return (OUTPUT, slot_of[r], 0)
            if r in memory.offsets:
                return (ARENA, 0, memory.offsets[r])
            constants.setdefault(r, np.ascontiguousarray(plan.consts[r]))
            return (CONSTANT, r, 0)

        calls = []
        for st in plan.steps:
            if st.spec is None:
                continue
            layout = st.spec.run.layout
            by_param = dict(zip((p.name for p in st.spec.definition.params), st.inputs))
            by_output = dict(zip((t.name for t in st.spec.definition.outputs),
                                 st.outputs + st.temporaries))
            args = [location(by_param[n]) for n in layout.input_names]
            zero = []
            for name, shape, dtype, zeroed in layout.outputs:
                nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
                if zeroed and nbytes:
                    zero.append((len(args), nbytes))
                args.append(location(by_output[name]))
            if layout.checks_indices:
                args.append((ERROR, 0, 0))
            calls.append(Call(st.label, st.spec.run, st.spec.stages, tuple(args), tuple(zero)))
        types = plan.types
        return ProgramLayout(
            [Tensor(v.name, tuple(int(d) for d in types[v.name].shape), types[v.name].dtype.numpy)
             for v in graph.inputs],
            [Tensor(v.name, tuple(int(d) for d in types[v.name].shape), types[v.name].dtype.numpy)
             for v in graph.outputs],
            slots, results, calls, constants, max(memory.arena_bytes, 64))

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
                             {}, 64)

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
