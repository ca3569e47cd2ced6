"""The one description of where code runs: a name, and for native targets the LLVM
triple, CPU and features.

A target is written as ``NAME[:CPU][+FEATURE...]``: ``"x86"`` (this machine's CPU and
features), ``"cuda"`` (the GPU's architecture, or sm_90 without one), ``"cuda:sm_80"``, ``"aarch64"`` (a Neoverse N1: ARMv8.2 with NEON), ``"aarch64+sve"`` (an
A64FX: SVE, 512-bit vectors), ``"aarch64:cortex-a72"``, ``"x86:skylake-avx512"`` (for
ahead-of-time bundles built for another machine). ``"host"`` is this machine's CPU with
all its features (on an ARM machine: whatever its CPU is).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

from polyfuse.errors import TargetError
from polyfuse.targets.backends import BACKENDS, Backend

NAMES = (*BACKENDS, "host")

TRIPLES = {b.name: b.triple for b in BACKENDS.values() if b.triple}


@dataclass(frozen=True, slots=True)
class Target:
    """``reference`` (the numpy interpreter), ``x86``, ``aarch64`` or ``cuda``; native CPU
    targets carry the LLVM ``cpu`` and ``features`` they generate code for (empty on
    ``x86``: this machine's), ``cuda`` the GPU architecture as ``cpu`` (empty: the GPU's)."""

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
        backend = BACKENDS.get(host_name() if name == "host" and not (cpu or features) else name)
        if backend is not None and backend.archs and cpu and not features:
            if cpu not in backend.archs:
                raise TargetError(f"unknown GPU architecture {cpu!r} for target '{name}'; "
                                  f"choose one of {', '.join(backend.archs)}")
            return Target(name, backend.triple, cpu)
        if backend is None or not all(features) or (cpu or features) and not backend.cpus:
            raise TargetError(f"unknown target {spec!r}; choose one of {', '.join(NAMES)}, "
                              "optionally with :CPU and +FEATURE for "
                              f"{' and '.join(b.name for b in BACKENDS.values() if b.cpus)} "
                              "(e.g. 'aarch64+sve', 'aarch64:cortex-a72')")
        if name == "host":    # this machine's CPU and features, whatever they are
            return Target(backend.name, backend.triple)
        # one spelling per target (records match targets by it): the features always on
        # first, then the others sorted, each once
        features = [*backend.features, *sorted(set(features) - set(backend.features))]
        if backend.default_cpu:   # a spec without a CPU means a named one, not this machine's
            cpu = cpu or backend.cpu_for(tuple(features))
        return Target(name, backend.triple, cpu, tuple(features))

    @property
    def backend(self) -> Backend:
        """What builds and runs this target's code (see :mod:`polyfuse.targets.backends`)."""
        try:
            return BACKENDS[self.name]
        except KeyError:
            raise TargetError(f"target '{self.name}' has no code generator in this version of "
                              f"polyfuse; available: {', '.join(BACKENDS)}") from None

    @property
    def llvm_features(self) -> str:
        """The features as LLVM spells them: ``+neon,+sve``."""
        return ",".join(f"+{f}" for f in self.features)

    def __str__(self) -> str:
        """The spec that parses back to this target, defaults left out."""
        spec = self.name
        backend = self.backend
        if backend.default_cpu and not self.cpu:
            return "host"     # this machine's CPU (only made on a host of that architecture)
        features = [f for f in self.features if f not in backend.features]
        if self.cpu and self.cpu != backend.cpu_for(tuple(features)):
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
