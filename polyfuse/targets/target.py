"""The one description of where code runs: a name, and for native targets the LLVM triple."""

from __future__ import annotations

import platform
from dataclasses import dataclass

from polyfuse.errors import TargetError

NAMES = ("reference", "x86", "aarch64", "cuda", "host")


@dataclass(frozen=True, slots=True)
class Target:
    """``reference`` (the numpy interpreter), ``x86``, ``aarch64`` or ``cuda``."""

    name: str
    triple: str = ""

    @staticmethod
    def parse(spec: str | Target) -> Target:
        """A target from its name; ``host`` is this machine's CPU."""
        if isinstance(spec, Target):
            return spec
        if not isinstance(spec, str) or spec not in NAMES:
            raise TargetError(f"unknown target {spec!r}; choose one of {', '.join(NAMES)}")
        if spec == "host":
            return Target.parse(host_name())
        triple = {"x86": "x86_64-unknown-linux-gnu", "aarch64": "aarch64-unknown-linux-gnu",
                  "cuda": "nvptx64-nvidia-cuda"}.get(spec, "")
        return Target(spec, triple)

    def __str__(self) -> str:
        return self.name


def host_name() -> str:
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        return "x86"
    if machine in ("aarch64", "arm64"):
        return "aarch64"
    raise TargetError(f"this machine's CPU ({machine}) is not a polyfuse target; "
                      "use target='reference'")
