"""Every canonical TC program, run by the numpy reference evaluator, against its oracle."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import polyfuse
from tests.tc_programs import PROGRAMS, PROGRAMS_BY_NAME, Program

pytestmark = pytest.mark.unit

LOW_PRECISION = {np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)}


def _as_tuple(result) -> tuple:
    return result if isinstance(result, tuple) else (result,)


def assert_outputs_match(got: tuple, expected: tuple, name: str = "") -> None:
    """Same count, shapes and dtypes; values exact for ints, close for floats."""
    assert len(got) == len(expected), f"{name}: {len(got)} outputs, expected {len(expected)}"
    for k, (g, e) in enumerate(zip(got, expected)):
        what = f"{name} output {k}"
        assert isinstance(g, np.ndarray), f"{what}: got {type(g).__name__}, not an ndarray"
        assert g.shape == e.shape, f"{what}: shape {g.shape}, expected {e.shape}"
        assert g.dtype == e.dtype, f"{what}: dtype {g.dtype}, expected {e.dtype}"
        if e.dtype.kind in "iub":
            np.testing.assert_array_equal(g, e, err_msg=what)
        elif e.dtype in LOW_PRECISION:
            np.testing.assert_allclose(g.astype(np.float32), e.astype(np.float32),
                                       rtol=1e-2, atol=1e-3, err_msg=what)
        else:
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5, err_msg=what)


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_reference_matches_oracle(program: Program) -> None:
    mod = polyfuse.define(program.source, target="reference")
    args = program.make_inputs(np.random.default_rng(0))
    saved = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    expected = program.oracle(*args)

    result = getattr(mod, program.entry)(*args)

    # One output comes back as the bare array, several as a tuple in declared order.
    if len(expected) == 1:
        assert isinstance(result, np.ndarray), f"single output returned as {type(result).__name__}"
    else:
        assert isinstance(result, tuple), f"several outputs returned as {type(result).__name__}"
    assert_outputs_match(_as_tuple(result), expected, program.name)

    # Inputs are never written.
    for a, s in zip(args, saved):
        if isinstance(s, np.ndarray):
            np.testing.assert_array_equal(a, s)


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_repeated_calls_are_independent(program: Program) -> None:
    """A kernel called twice with other inputs gives the other answer (no stale state)."""
    fn = getattr(polyfuse.define(program.source, target="reference"), program.entry)
    for seed in (1, 2):
        args = program.make_inputs(np.random.default_rng(seed))
        assert_outputs_match(_as_tuple(fn(*args)), program.oracle(*args), program.name)


def test_axpy_keyword_arguments() -> None:
    p = PROGRAMS_BY_NAME["axpy"]
    mod = polyfuse.define(p.source, target="reference")
    a, X, Y = p.make_inputs(np.random.default_rng(0))
    expected = p.oracle(a, X, Y)

    assert_outputs_match(_as_tuple(mod.axpy(a=a, X=X, Y=Y)), expected, "axpy(a=, X=, Y=)")
    assert_outputs_match(_as_tuple(mod.axpy(Y=Y, a=a, X=X)), expected, "axpy(Y=, a=, X=)")
    assert_outputs_match(_as_tuple(mod.axpy(a, Y=Y, X=X)), expected, "axpy(a, Y=, X=)")


def test_multi_def_module_exposes_every_def() -> None:
    p = PROGRAMS_BY_NAME["multi_def_scale"]
    mod = polyfuse.define(p.source, target="reference")
    for name in ("scale", "rowsum_f", "addmul"):
        assert callable(getattr(mod, name)), name
