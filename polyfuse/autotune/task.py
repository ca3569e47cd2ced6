"""A tuning task: one TC definition at fixed input shapes, for one target.

Tasks come from a ``.tc`` source and the shapes of its inputs, or from the kernels of a
compiled ONNX model (one per fusion group). Their keys name them in the records:

* ``workload_key``: the definition's canonical text, input shapes and dtypes, hashed:
  records with this key measured exactly this kernel;
* ``family_key``: the same text with every number erased: the same kernel at other
  sizes, whose best options are a starting point when no exact record exists.

A task's ``target`` is a :class:`~polyfuse.targets.Target` with its CPU and features
(``x86:skylake-avx512``, ``aarch64+sve``); a spec string given instead is parsed.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from polyfuse.errors import ArgumentError
from polyfuse.frontends.tc import parse
from polyfuse.ir.comprehension import Definition
from polyfuse.runtime.arguments import bind_arguments, placeholder
from polyfuse.targets import Target


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Task:
    source: str                              # TC text holding the definition ``entry``
    entry: str
    shapes: tuple[tuple[int, ...], ...]      # of the tensor parameters, in order
    dtypes: tuple[str, ...]                  # their numpy dtype names
    target: Target = Target.parse("x86")    # a spec such as "aarch64+sve" is parsed
    name: str = ""                           # for display (e.g. a fusion group's label)

    def __post_init__(self) -> None:
        object.__setattr__(self, "target", Target.parse(self.target))

    @staticmethod
    def of(definition: Definition, arrays: list[np.ndarray], target: Target | str = "x86",
           name: str = "") -> Task:
        """The task of ``definition`` called with arrays of these shapes and dtypes (on a GPU
        target, of its architecture: ``cuda`` is this machine's GPU's, see
        :func:`~polyfuse.targets.cuda.with_arch`)."""
        target = Target.parse(target)
        if target.backend.archs:
            from polyfuse.targets.cuda import with_arch
            target = with_arch(target)
        return Task(str(definition), definition.name, tuple(tuple(int(d) for d in a.shape) for a in arrays),
                    tuple(np.dtype(a.dtype).name for a in arrays), target, name or definition.name)

    @cached_property
    def definition(self) -> Definition:
        try:
            d = parse(self.source)[self.entry]
        except KeyError:
            raise ArgumentError(f"the TC source defines no '{self.entry}'") from None
        if d.scalars:
            raise ArgumentError(f"'{self.entry}' has scalar parameters "
                                f"({', '.join(s.name for s in d.scalars)}); tuning takes "
                                "definitions whose parameters are all tensors")
        return d

    @cached_property
    def sizes(self) -> dict[str, int]:
        """Every size of the definition, bound by the shapes (checked against it)."""
        return bind_arguments(self.definition, self.placeholders()).sizes

    @property
    def workload_key(self) -> str:
        return _hash(f"{self.definition}|{self.shapes}|{self.dtypes}")

    @property
    def family_key(self) -> str:
        return _hash(re.sub(r"\d+", "#", str(self.definition)))

    def placeholders(self) -> list[np.ndarray]:
        """Arrays of the task's shapes and dtypes holding no memory."""
        return [placeholder(shape, dt) for shape, dt in zip(self.shapes, self.dtypes)]

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Inputs to measure and check candidates with: normal floats, small integers
        (0 or 1, which every dimension an index tensor may index has), random bools."""
        rng = np.random.default_rng(seed)
        arrays = []
        for shape, dt in zip(self.shapes, self.dtypes):
            kind = np.dtype(dt).kind
            if kind == "f":
                arrays.append(rng.standard_normal(shape).astype(dt))
            elif kind == "b":
                arrays.append(rng.integers(0, 2, shape).astype(bool))
            else:
                arrays.append(rng.integers(0, 2, shape).astype(dt))
        return arrays

    def __str__(self) -> str:
        shapes = ", ".join(f"{dt}{list(s)}" for s, dt in zip(self.shapes, self.dtypes))
        return f"{self.name or self.entry}({shapes}) on {self.target}"
