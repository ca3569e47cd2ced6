"""A pass manager for any IR level: runs named passes in order, verifies after each when
asked, keeps the IR after each for ``--dump``-style inspection, and times the passes.

A pass is a pure function IR -> IR; its name is the function's ``__name__``, or a
:class:`Pass` names a function that needs options bound (``Pass("unroll_and_jam",
lambda k: unroll_and_jam(k, 4))``). Subclasses say which level they serve (``level``,
``unit``: the words errors use) and how to verify it.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Generic, TypeVar

from polyfuse.errors import PolyfuseError

IR = TypeVar("IR")


@dataclass(frozen=True, slots=True)
class Pass(Generic[IR]):
    """A pass under the name dumps and errors call it by."""

    name: str
    fn: Callable[[IR], IR]

    def __call__(self, ir: IR) -> IR:
        return self.fn(ir)


def pass_name(p: Callable[[IR], IR]) -> str:
    return p.name if isinstance(p, Pass) else p.__name__


# IR objects (immutable) a manager's check passed, by (manager class, id): a pass that
# returns its input unchanged (inline_scalars on a definition with no scalars: every
# kernel of a DenseNet) leaves nothing new to check, where the input was checked before
_VERIFIED: weakref.WeakValueDictionary[tuple[type, int], object] = weakref.WeakValueDictionary()
_VERIFIED_LOCK = threading.Lock()


@dataclass
class PassManager(Generic[IR]):
    """Runs ``passes`` in order; ``verify`` checks the IR after each, ``keep`` keeps the
    IR after each (``dumps`` prints them), the input first under ``input_name``."""

    passes: Sequence[Callable[[IR], IR]] = ()
    verify: bool = False
    keep: bool = False
    input_name: str = "input"
    kept: list[tuple[str, IR]] = field(default_factory=list)     # (pass name, IR after it)
    times: list[tuple[str, float]] = field(default_factory=list)

    level: ClassVar[str] = "ir"      # errors say "in <level> pass '<name>' on <unit> '<x>'"
    unit: ClassVar[str] = "unit"

    def check(self, ir: IR) -> None:
        """Verify ``ir``: raise a PolyfuseError naming what is wrong (subclasses)."""

    def run(self, ir: IR) -> IR:
        if self.keep:
            self.kept.append((self.input_name, ir))
        for p in self.passes:
            name = pass_name(p)
            start = time.perf_counter()
            try:
                ir = p(ir)
                if self.verify:
                    self._verified(ir)
            except PolyfuseError as err:
                label = getattr(ir, "name", "?")
                raise type(err)(f"in {self.level} pass '{name}' on {self.unit} '{label}': {err}") from None
            self.times.append((name, time.perf_counter() - start))
            if self.keep:
                self.kept.append((name, ir))
        return ir

    def _verified(self, ir: IR) -> None:
        """``check(ir)``, unless this kind of manager checked this very object before
        (IR is immutable: it holds still)."""
        key = (type(self), id(ir))
        with _VERIFIED_LOCK:
            if _VERIFIED.get(key) is ir:
                return
        self.check(ir)
        try:
            with _VERIFIED_LOCK:
                _VERIFIED[key] = ir
        except TypeError:   # (an IR object that takes no weak reference: checked each time)
            pass

    @property
    def dumps(self) -> list[tuple[str, str]]:
        """``(pass name, printed IR)`` after each pass, the input first."""
        return [(name, str(ir)) for name, ir in self.kept]
