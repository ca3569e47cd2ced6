"""The property behind tests/scheduler/test_bounds.py, run there in a child process (so
that a signal is a failure of that test, not the end of the suite): random
comprehensions with random affine accesses, selects, where clauses and sizes either
match the comprehension interpreter on a native target or raise a polyfuse error there
exactly when the interpreter does.

Run as ``python -m pytest tests/scheduler/bounds_property.py`` with
``POLYFUSE_PROPERTY_TARGET`` (host, aarch64 or cuda) and ``POLYFUSE_PROPERTY_EXAMPLES``.
"""

import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polyfuse as pf
from polyfuse.ir.comprehension_interpreter import interpret

from tests.cuda.test_emulated import emulated  # noqa: F401  (fixture)

TARGET = os.environ.get("POLYFUSE_PROPERTY_TARGET", "host")
EXAMPLES = int(os.environ.get("POLYFUSE_PROPERTY_EXAMPLES", "40"))
SIZES = ("N", "M")
INDICES = ("i", "j", "k")


@st.composite
def affine(draw, indices):
    """Mostly one index plus a constant, sometimes a combination of two."""
    chosen = draw(st.lists(st.sampled_from(indices), unique=True, min_size=1,
                           max_size=1 if draw(st.integers(0, 2)) else 2))
    terms = [f"{c} * {i}" if c != 1 else i
             for i in chosen for c in [draw(st.sampled_from([1, 1, 1, 2, -1]))]]
    const = draw(st.integers(-2, 2))
    text = " + ".join(terms)
    return text if const == 0 else f"{text} + {const}" if const > 0 else f"{text} - {-const}"


@st.composite
def programs(draw):
    inputs = []
    for t in range(draw(st.integers(1, 2))):
        rank = draw(st.integers(1, 3))
        inputs.append((f"X{t}", tuple(draw(st.sampled_from(SIZES)) for _ in range(rank))))

    def read():
        name, shape = draw(st.sampled_from(inputs))
        return f"{name}({', '.join(draw(affine(INDICES)) for _ in shape)})"

    def condition():
        if draw(st.booleans()):
            return f"{draw(affine(INDICES))} {draw(st.sampled_from(['<', '>=', '==', '!=']))} " \
                   f"{draw(st.sampled_from(['0', '1', 'N', 'M - 1']))}"
        return f"{read()} > 0.0"  # data-dependent: checked when it runs

    def value(depth=0):
        choice = draw(st.integers(0, 3 if depth < 2 else 0))
        if choice == 0:
            return read()
        if choice == 1:
            return f"({value(depth + 1)} + {value(depth + 1)})"
        if choice == 2:
            return f"({condition()} ? {value(depth + 1)} : -1.0)"
        return f"fmax({value(depth + 1)}, 0.5)"

    rhs = value()
    used = [i for i in INDICES if i in rhs.replace("fmax", "")]
    lhs = draw(st.lists(st.sampled_from(used), unique=True, max_size=2))
    op = "=" if set(used) <= set(lhs) else draw(st.sampled_from(["+=!", "max=!"]))
    wheres = [f"{i} in {draw(st.integers(0, 1))}:{draw(st.sampled_from(['N', 'M', 'N + 1', '3']))}"
              for i in INDICES if i in used and draw(st.booleans())]
    where = f" where {', '.join(wheres)}" if wheres else ""
    params = ", ".join(f"float({', '.join(shape)}) {name}" for name, shape in inputs)
    source = f"def f({params}) -> (O) {{ O({', '.join(lhs)}) {op} {rhs}{where} }}"
    sizes = {s: draw(st.integers(1, 5)) for s in SIZES}
    return source, inputs, sizes


@pytest.fixture(autouse=True)
def device(request):
    if TARGET == "cuda":  # CUDA C runs on the CPU emulator
        request.getfixturevalue("emulated")


def _outcome(fn):
    try:
        return fn(), None
    except pf.PolyfuseError as e:
        return None, e


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(programs())
def test_random_accesses_match_the_interpreter_or_raise(case):
    source, inputs, sizes = case
    print(source, sizes, file=sys.stderr, flush=True)  # the last one printed, if it crashes
    rng = np.random.default_rng(0)
    args = [rng.uniform(-1, 1, [sizes[s] for s in shape]).astype(np.float32) for _, shape in inputs]
    reference, _ = _outcome(lambda: pf.define(source).f)
    if reference is None:  # refused by the front end, for every target alike
        return
    native = pf.define(source, target=TARGET).f
    # the oracle: the interpreter itself, whose reads raise only where one really runs
    spec, spec_error = _outcome(lambda: reference.specialize(*args))
    if spec_error is not None and not isinstance(spec_error, pf.AccessRangeError):
        assert _outcome(lambda: native(*args))[1] is not None
        return
    d = reference.definition
    bound = {t.name: a for t, a in zip(d.inputs, args)}
    shape_sizes = {s: a.shape[k] for t, a in zip(d.inputs, args)
                   for k, s in enumerate(str(e) for e in t.shape)}
    want, want_error = _outcome(lambda: interpret(d, bound, shape_sizes)["O"])
    got, got_error = _outcome(lambda: native(*args))
    if want_error is not None:
        assert got_error is not None, f"{source}: the interpreter raised {want_error!r}, {TARGET} did not"
        return
    if spec_error is not None:  # refused statically although the interpreter reads nothing outside
        raise AssertionError(f"{source}: refused ({spec_error}) but the interpreter ran")
    assert got_error is None, f"{source}: {TARGET} raised {got_error!r}"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=source)
