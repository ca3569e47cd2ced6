"""The instructions of a program (:class:`~polyfuse.runtime.program.ProgramLayout`):
kernel calls, and what runs a plan's loops and branches without Python.

A program is a list of instructions run from a program counter (the native runtime's
``Program``, the entry point of bundles and emulated programs: :mod:`polyfuse.runtime.link`).
Each operand is a location ``(base, index, offset)`` (see :mod:`polyfuse.runtime.program`):

* :class:`Run` calls kernel ``call`` of the program's calls;
* :class:`Copy` copies ``nbytes`` from one location to another, at row ``*row`` of the
  destination when given (a scan value into its stacked buffer);
* :class:`Set` writes an integer into the low ``nbytes`` of a location, :class:`Increment`
  adds one to an int64;
* :class:`Jump`, :class:`JumpUnless` (a bool is false) and :class:`JumpIfAtLeast` (an int64
  counter has reached an int64 limit) go to instruction ``target``.

:func:`program_code` lays a plan's steps out as instructions: a loop tests its trip
count and condition, runs its body, copies the scan values, the next condition and the
carried values, counts, and jumps back; a branch jumps over the block not taken.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from polyfuse.ir.plan import BranchStep, LoopStep, Plan, Step, nbytes

Location = tuple[int, Any, int]


# what makes a location native: (base, index, offset) with a constant's address resolved
Place = Callable[..., tuple[int, int, int]]


@dataclass(frozen=True)
class Run:
    call: int


@dataclass(frozen=True)
class Copy:
    dst: Location
    src: Location
    nbytes: int
    row: Location | None = None

    def native(self, program: Any, place: Place) -> None:
        """Append this instruction to a :class:`polyfuse.runtime.native.Program` (so do the
        others but :class:`Run`, whose kernel the program's maker binds)."""
        program.copy(place(*self.dst), place(*self.src), self.nbytes, None if self.row is None else place(*self.row))


@dataclass(frozen=True)
class Set:
    dst: Location
    value: int
    nbytes: int

    def native(self, program: Any, place: Place) -> None:
        program.set(place(*self.dst), self.value, self.nbytes)


@dataclass(frozen=True)
class Increment:
    counter: Location

    def native(self, program: Any, place: Place) -> None:
        program.increment(place(*self.counter))


@dataclass(frozen=True)
class Jump:
    target: int

    def native(self, program: Any, place: Place) -> None:
        program.jump(self.target)


@dataclass(frozen=True)
class JumpUnless:
    cond: Location
    target: int

    def native(self, program: Any, place: Place) -> None:
        program.jump_unless(place(*self.cond), self.target)


@dataclass(frozen=True)
class JumpIfAtLeast:
    counter: Location
    limit: Location
    target: int

    def native(self, program: Any, place: Place) -> None:
        program.jump_if_at_least(place(*self.counter), place(*self.limit), self.target)


Instruction = Run | Copy | Set | Increment | Jump | JumpUnless | JumpIfAtLeast


def straight(code: list[Instruction]) -> bool:
    """Whether ``code`` only calls kernels, one after another."""
    return all(isinstance(ins, Run) for ins in code)


def program_code(plan: Plan, location: Callable[[str], Location], call_of: dict[int, int]) -> list[Instruction]:
    """The instructions running ``plan``'s steps; ``location`` places a value,
    ``call_of`` gives each kernel step's call (by the step's id)."""
    code: list[Instruction] = []

    def size(name: str) -> int:
        return nbytes(plan.types[name])

    def copy(dst: str, src: str) -> None:
        if location(dst) != location(src):
            code.append(Copy(location(dst), location(src), size(dst)))

    def pending(ins: Instruction) -> int:
        code.append(ins)
        return len(code) - 1

    def land(at: int) -> None:   # the jump at ``at`` goes to the next instruction
        jump = code[at]
        assert isinstance(jump, (Jump, JumpUnless, JumpIfAtLeast)), jump   # pending() put it there
        code[at] = dataclasses.replace(jump, target=len(code))

    def emit(steps: tuple[Step, ...]) -> None:
        for st in steps:
            if isinstance(st, LoopStep):
                loop(st)
            elif isinstance(st, BranchStep):
                skip = pending(JumpUnless(location(st.cond), -1))
                emit(st.then.steps)
                for out, result in zip(st.outputs, st.then.results):
                    copy(out, result)
                done = pending(Jump(-1))
                land(skip)
                emit(st.other.steps)
                for out, result in zip(st.outputs, st.other.results):
                    copy(out, result)
                land(done)
            elif id(st) in call_of:
                code.append(Run(call_of[id(st)]))

    def loop(st: LoopStep) -> None:
        for name, init in zip(st.carried, st.initial):
            copy(name, init)
        code.append(Set(location(st.counter), 0, 8))
        if st.cond:
            copy(st.going, st.cond)
        else:
            code.append(Set(location(st.going), 1, 1))
        top = len(code)
        exits = [pending(JumpIfAtLeast(location(st.counter), location(st.trip), -1))] if st.trip else []
        exits.append(pending(JumpUnless(location(st.going), -1)))
        emit(st.body.steps)
        for stacked, scan in zip(st.stacked, st.scans):
            code.append(Copy(location(stacked), location(scan), size(scan), location(st.counter)))
        copy(st.going, st.next_cond)     # before the carried values: it may read one
        for name, result in zip(st.carried, st.results):
            copy(name, result)
        code.append(Increment(location(st.counter)))
        code.append(Jump(top))
        for at in exits:
            land(at)

    emit(plan.steps)
    return code
