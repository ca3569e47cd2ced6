"""The one description of where code runs: a name, and for native targets the LLVM
triple, CPU and features.

A target is written as ``NAME[:CPU][+FEATURE...]``: ``"x86"`` (this machine's CPU and
features), ``"aarch64"`` (a Neoverse N1: ARMv8.2 with NEON), ``"aarch64+sve"`` (an
A64FX: SVE, 512-bit vectors), ``"aarch64:cortex-a72"``, ``"x86:skylake-avx512"`` (for
ahead-of-time bundles built for another machine). ``"host"`` is this machine's CPU with
all its features (on an ARM machine: whatever its CPU is).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

from polyfuse.errors import TargetError

NAMES = ("reference", "x86", "aarch64", "cuda", "host")

TRIPLES = {"x86": "x86_64-unknown-linux-gnu", "aarch64": "aarch64-unknown-linux-gnu",
           "cuda": "nvptx64-nvidia-cuda"}

# aarch64 CPUs: the default, and the one that "+sve" picks when no CPU is named
AARCH64_CPU = "neoverse-n1"
AARCH64_SVE_CPU = "a64fx"


@dataclass(frozen=True, slots=True)
class Target:
    """``reference`` (the numpy interpreter), ``x86``, ``aarch64`` or ``cuda``; native CPU
    targets carry the LLVM ``cpu`` and ``features`` they generate code for (empty on
    ``x86``: this machine's)."""

    name: str
    triple: str = ""
    cpu: str = ""
    features: tuple[str, ...] = ()   # LLVM features without the sign: ("neon", "sve")

    @staticmethod
    def parse(spec: str | Target) -> Target:
        """A target from its spec (see the module docstring); ``host`` is this machine."""
        if isinstance(spec, Target):
            return spec
        if not isinstance(spec, str):
            raise TargetError(f"a target is a name such as 'x86' or 'aarch64+sve', "
                              f"got {type(spec).__name__}")
        head, *features = spec.split("+")
        name, _, cpu = head.partition(":")
        if name not in NAMES or not all(features) or (cpu or features) and name not in ("x86", "aarch64"):
            raise TargetError(f"unknown target {spec!r}; choose one of {', '.join(NAMES)}, "
                              "optionally with :CPU and +FEATURE for x86 and aarch64 "
                              "(e.g. 'aarch64+sve', 'aarch64:cortex-a72')")
        if name == "host":    # this machine's CPU and features, whatever they are
            host = host_name()
            return Target(host, TRIPLES[host])
        if name == "aarch64":
            cpu = cpu or (AARCH64_SVE_CPU if "sve" in features else AARCH64_CPU)
            features = ["neon", *(f for f in features if f != "neon")]
        return Target(name, TRIPLES.get(name, ""), cpu, tuple(features))

    @property
    def llvm_features(self) -> str:
        """The features as LLVM spells them: ``+neon,+sve``."""
        return ",".join(f"+{f}" for f in self.features)

    def __str__(self) -> str:
        """The spec that parses back to this target, defaults left out."""
        spec = self.name
        features = list(self.features)
        if self.name == "aarch64" and not self.cpu:
            return "host"     # this machine's CPU (only made on an aarch64 host)
        if self.name == "aarch64":
            features.remove("neon")
            if self.cpu != (AARCH64_SVE_CPU if "sve" in features else AARCH64_CPU):
                spec += f":{self.cpu}"
        elif self.cpu:
            spec += f":{self.cpu}"
        return spec + "".join(f"+{f}" for f in features)


def host_name() -> str:
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        return "x86"
    if machine in ("aarch64", "arm64"):
        return "aarch64"
    raise TargetError(f"this machine's CPU ({machine}) is not a polyfuse target; "
                      "use target='reference'")
