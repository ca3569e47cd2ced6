"""What measuring a candidate takes and gives: its settings, its error codes, its result.

Shared by the builder (:mod:`polyfuse.autotune.builder`), the runner
(:mod:`polyfuse.autotune.runner`) and their front, :mod:`polyfuse.autotune.measure`,
which re-exports every name here.
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from polyfuse.scheduler.options import MappingOptions, number


class ErrorCode(enum.Enum):
    """Why a candidate has no costs (the values go into JSON records)."""

    NONE = "none"
    COMPILE_ERROR = "compile_error"    # the scheduler or code generator refused it, or crashed
    RUNTIME_ERROR = "runtime_error"    # the kernel raised or killed its process (a signal)
    TIMEOUT = "timeout"                # the build or the run took longer than allowed
    WRONG_ANSWER = "wrong_answer"      # outputs differ from the reference interpreter's


class Fault(enum.Enum):
    """Testing aid: a failure :attr:`MeasureConfig.inject_faults` makes a child suffer."""

    SEGFAULT = "segfault"          # a real SIGSEGV (a read of address 0) instead of a call
    HANG = "hang"                  # an endless loop instead of a call
    WRONG_ANSWER = "wrong_answer"  # each call's outputs changed after the kernel ran


@dataclass(frozen=True)
class MeasureConfig:
    number: int = 10          # calls per repeat
    repeat: int = 3           # costs per candidate
    warmup: int = 1           # untimed calls before the first repeat
    build_timeout: float = 60.0
    run_timeout: float = 10.0  # for the check, the warm-up and every repeat together
    check: bool = True         # compare with the reference interpreter first
    seed: int = 0              # of task.random_inputs
    jobs: int = field(default_factory=lambda: os.cpu_count() or 1)  # parallel local builds
    cutoff: float = math.inf   # seconds: a candidate whose first call takes longer is
                               # measured by that call alone (a search sets a few times its best)
    rtol: float = 1e-3         # float outputs: |got - want| <= rtol*|want| + atol*max|want|
    atol: float = 1e-4
    # Testing aid, never set by a search: candidates whose options are keys here suffer
    # that fault in their child, to prove that the runner survives it.
    inject_faults: Mapping[MappingOptions, Fault] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for name, low in (("number", 1), ("repeat", 1), ("warmup", 0), ("jobs", 1), ("seed", 0)):
            object.__setattr__(self, name, number("MeasureConfig", name, getattr(self, name), low=low))
        for name, low in (("build_timeout", 1e-3), ("run_timeout", 1e-3), ("cutoff", 0.0),
                          ("rtol", 0.0), ("atol", 0.0)):
            object.__setattr__(self, name, number("MeasureConfig", name, getattr(self, name), float,
                                                  low=low))


@dataclass(frozen=True)
class MeasureResult:
    costs: tuple[float, ...]   # seconds of one call, one per repeat; empty unless ok
    error: ErrorCode
    message: str = ""          # what went wrong, for a person
    build_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is ErrorCode.NONE

    @property
    def mean(self) -> float:
        """Mean cost in seconds; infinite for a failed candidate."""
        return sum(self.costs) / len(self.costs) if self.ok and self.costs else float("inf")

    def to_json(self) -> dict[str, Any]:
        return {"costs": list(self.costs), "error": self.error.value, "message": self.message,
                "build_seconds": self.build_seconds}

    @staticmethod
    def from_json(j: dict[str, Any]) -> MeasureResult:
        return MeasureResult(tuple(float(c) for c in j["costs"]), ErrorCode(j["error"]),
                             str(j.get("message", "")), float(j.get("build_seconds", 0.0)))
