"""What one fuzz case came to, and how two results are compared.

Every case ends in one of these outcomes: ``ok`` (the native answer is the reference's),
``refused`` (a :class:`polyfuse.PolyfuseError`, from the reference, the native target or
both), ``raw`` (any other exception: a defect), ``wrong`` (an answer that is not the
reference's: a defect) or, for models, ``lenient`` (polyfuse ran what the reference
refused; its examples are kept for review). A signal ends the child process and fails the test that ran it.
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import polyfuse as pf

OUTCOMES = ("ok", "refused", "raw", "wrong", "lenient")


class Mismatch(AssertionError):
    """A native result that differs from the reference's."""


@dataclass
class Tally:
    """Counts of outcomes and the first few defects, each with the case that caused it."""

    counts: Counter = field(default_factory=Counter)
    refusals: Counter = field(default_factory=Counter)  # error class -> count
    defects: list[dict] = field(default_factory=list)
    seen: set = field(default_factory=set)  # (outcome, where) already kept

    def record(self, outcome: str, case: str | Callable[[], str] = "",
               error: BaseException | None = None) -> None:
        """Count ``outcome``; keep ``case`` (text, or a function that prints it, called
        only for a defect not kept before) with the first few defects."""
        self.counts[outcome] += 1
        if outcome == "refused" and error is not None:
            self.refusals[type(error).__name__] += 1
        if outcome in ("raw", "wrong", "lenient") and error is not None:
            frames = traceback.extract_tb(error.__traceback__)
            where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
            key = (outcome, type(error).__name__, where,
                   str(error)[:80] if outcome == "lenient" else "")
            if key not in self.seen and len(self.defects) < 20:
                self.seen.add(key)
                case = case() if callable(case) else case
                self.defects.append({"outcome": outcome, "error": f"{type(error).__name__}: "
                                     f"{str(error)[:500]}", "where": where, "case": case[:4000],
                                     "traceback": "".join(traceback.format_exception(error))[-3000:]})

    def summary(self) -> dict:
        return {"counts": {o: self.counts[o] for o in OUTCOMES},
                "refusals": dict(self.refusals.most_common()), "defects": self.defects}


def outcome_of(run) -> tuple[str, BaseException | None, object]:
    """Run ``run()``: ('ok', None, result), ('refused', error, None) or ('raw', error, None)."""
    try:
        return "ok", None, run()
    except pf.PolyfuseError as e:
        return "refused", e, None
    except Exception as e:  # noqa: BLE001 - a raw exception is what the fuzzer looks for
        return "raw", e, None


def judge(tally: Tally, want: tuple, got: tuple, case: str | Callable[[], str], *,
          reference_refused: str = "wrong", **tolerance) -> None:
    """Record what a native run (``got``, an :func:`outcome_of`) came to against the
    reference's (``want``): its raw error, its refusal, ``reference_refused`` when it
    answered what the reference refused, else whether the answers agree."""
    (outcome, error, expected), (native, native_error, result) = want, got
    if native == "raw":
        return tally.record("raw", case, native_error)
    if native == "refused":
        return tally.record("refused", case, native_error)
    if outcome != "ok":
        return tally.record(reference_refused, case, Mismatch(
            f"the reference refused ({type(error).__name__}: {str(error)[:300]}) but the native "
            "target returned a result"))
    try:
        assert_same(result, expected, **tolerance)
    except Mismatch as e:
        return tally.record("wrong", case, e)
    tally.record("ok")


def as_tuple(result) -> tuple:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def assert_same(got, want, *, rtol: float = 1e-3, atol: float = 1e-3,
                finite_only: bool = False) -> None:
    """``got`` has ``want``'s arrays: dtypes, shapes, and values within tolerance (NaN
    where NaN, the same infinities; integers and booleans exactly). ``finite_only``
    (for arguments holding infinities, NaNs or values near float32's limit, whose results
    depend on the order of evaluation and on how max treats NaN) compares only where
    both values are finite and below 1e30."""
    got, want = as_tuple(got), as_tuple(want)
    if len(got) != len(want):
        raise Mismatch(f"{len(got)} results, the reference gave {len(want)}")
    for k, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        if g.dtype != w.dtype or g.shape != w.shape:
            raise Mismatch(f"result {k}: {g.dtype}{g.shape}, the reference gave {w.dtype}{w.shape}")
        if w.dtype.kind in "biu":
            if not np.array_equal(g, w):
                raise Mismatch(f"result {k}: integers differ at {np.argwhere(g != w)[:3].tolist()}")
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        tol = max(rtol, 1e-2 if w.dtype.itemsize <= 2 else 0.0)
        close = np.isclose(g64, w64, rtol=tol, atol=atol, equal_nan=True)
        close |= np.isinf(w64) & (g64 == w64)
        # values far beyond float32's range lose meaning in any order of evaluation
        close |= (np.abs(w64) > 1e30) & (np.abs(g64) > 1e30) & (np.sign(g64) == np.sign(w64))
        if finite_only:
            close |= ~(np.isfinite(g64) & np.isfinite(w64)) | (np.abs(w64) > 1e30)
        if not close.all():
            at = tuple(np.argwhere(~close)[0])
            raise Mismatch(f"result {k}: {g[at]!r} at {at}, the reference gave {w[at]!r}")
