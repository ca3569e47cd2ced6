"""Profiles: the range of every float tensor of a model over calibration inputs.

A profile is what int8 quantization is calibrated from (``polyfuse profile``,
``CompiledModel.profile_ranges``). Each tensor keeps its minimum, its maximum and a
histogram of ``BINS`` equal bins over a running range that always holds 0. When a new
batch of values falls outside the range, the range widens to hold it and the counts so
far are spread over the new bins as if uniform within each old bin (the histogram's
cumulative counts interpolated at the new edges), so batches merge in any order into
nearly the histogram of all values at once. Only finite values are counted.

The file is JSON::

    {"format": "polyfuse-profile", "version": 1,
     "model": {"sha256": "..."},        # of the ONNX bytes the profile was made from
     "samples": 32, "bins": 2048,
     "tensors": {"name": {"min": -1.5, "max": 3.0,
                          "histogram": {"range": [-1.5, 3.0], "counts": [...]}}}}
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from polyfuse.errors import ArgumentError

FORMAT = "polyfuse-profile"
VERSION = 1
BINS = 2048


@dataclass(frozen=True)
class TensorRange:
    """One tensor's finite values seen so far: their extremes and histogram."""

    min: float
    max: float
    lo: float                 # the histogram's range, [lo, hi], lo <= 0 <= hi
    hi: float
    counts: np.ndarray = field(repr=False)   # float64, len = bins

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(self.lo, self.hi, len(self.counts) + 1)

    @staticmethod
    def of(values: np.ndarray, bins: int = BINS) -> TensorRange | None:
        """The range of ``values`` (None when none is finite)."""
        v = np.asarray(values, np.float64).ravel()
        v = v[np.isfinite(v)]
        if v.size == 0:
            return None
        lo, hi = min(float(v.min()), 0.0), max(float(v.max()), 0.0)
        if lo == hi:       # all zero: any range holding 0 will do
            hi = 1.0
        counts, _ = np.histogram(v, bins, (lo, hi))
        return TensorRange(float(v.min()), float(v.max()), lo, hi, counts.astype(np.float64))

    def merged(self, other: TensorRange) -> TensorRange:
        """The range of both tensors' values (the histograms re-binned over the union)."""
        lo, hi = min(self.lo, other.lo), max(self.hi, other.hi)
        counts = self._rebinned(lo, hi) + other._rebinned(lo, hi)
        return TensorRange(min(self.min, other.min), max(self.max, other.max), lo, hi, counts)

    def _rebinned(self, lo: float, hi: float) -> np.ndarray:
        """The counts over ``len(counts)`` bins of [lo, hi] (a range holding this one)."""
        if (lo, hi) == (self.lo, self.hi):
            return self.counts
        cumulative = np.concatenate([[0.0], np.cumsum(self.counts)])
        new_edges = np.linspace(lo, hi, len(self.counts) + 1)
        return np.diff(np.interp(new_edges, self.edges, cumulative))

    def to_json(self) -> dict[str, Any]:
        counts = [int(c) if float(c).is_integer() else float(c) for c in self.counts]
        return {"min": self.min, "max": self.max,
                "histogram": {"range": [self.lo, self.hi], "counts": counts}}

    @staticmethod
    def from_json(data: dict[str, Any]) -> TensorRange:
        h = data["histogram"]
        lo, hi = (float(x) for x in h["range"])
        return TensorRange(float(data["min"]), float(data["max"]), lo, hi,
                           np.asarray(h["counts"], np.float64))


@dataclass(frozen=True)
class Profile:
    """The ranges of a model's float tensors, by value name, and the model's digest."""

    digest: str
    tensors: dict[str, TensorRange]
    samples: int = 0
    bins: int = BINS

    def recorded(self, values: dict[str, np.ndarray]) -> Profile:
        """This profile with one more sample: ``values`` by tensor name."""
        tensors = dict(self.tensors)
        for name, v in values.items():
            new = TensorRange.of(v, self.bins)
            if new is not None:
                tensors[name] = tensors[name].merged(new) if name in tensors else new
        return replace(self, tensors=tensors, samples=self.samples + 1)

    def check_model(self, digest: str, what: str = "the model") -> None:
        """Refuse a profile made from another model."""
        if digest != self.digest:
            raise ArgumentError(f"the profile was made from another model (sha256 "
                                f"{self.digest[:12]}...); {what} has sha256 {digest[:12]}...: "
                                "profile this model with `polyfuse profile`")

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "model": {"sha256": self.digest},
                "samples": self.samples, "bins": self.bins,
                "tensors": {n: t.to_json() for n, t in self.tensors.items()}}

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(self.to_json()))

    @staticmethod
    def from_json(data: Any, where: str = "the profile") -> Profile:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ArgumentError(f"{where} is not a polyfuse profile (no \"format\": \"{FORMAT}\")")
        if data.get("version") != VERSION:
            raise ArgumentError(f"{where} has version {data.get('version')!r}; this polyfuse "
                                f"reads version {VERSION}: profile the model again")
        try:
            tensors = {str(n): TensorRange.from_json(t) for n, t in data["tensors"].items()}
            return Profile(str(data["model"]["sha256"]), tensors, int(data["samples"]),
                           int(data["bins"]))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ArgumentError(f"{where} is malformed: {err!r}") from None

    @staticmethod
    def load(source: str | os.PathLike | Profile) -> Profile:
        """A profile, or the one in a JSON file."""
        if isinstance(source, Profile):
            return source
        if not isinstance(source, (str, os.PathLike)):
            raise ArgumentError(f"a profile is a Profile or the path of a profile file, got "
                                f"{type(source).__name__}")
        try:
            data = json.loads(Path(source).read_text())
        except (OSError, ValueError) as err:
            raise ArgumentError(f"cannot read the profile '{source}': {err}") from None
        return Profile.from_json(data, f"'{source}'")
