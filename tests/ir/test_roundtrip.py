"""The comprehension IR's text form is TC: parse(print(ir)) == ir, and printing is stable."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from polyfuse.frontends.tc import parse
from polyfuse.ir.comprehension_interpreter import interpret
from polyfuse.ir.sizes import bind_sizes
from polyfuse.runtime.arguments import bind_arguments
from tests.tc_programs import PROGRAMS
from tests.tc_random import programs



def assert_round_trip(source: str):
    module = parse(source)
    text = str(module)
    again = parse(text)
    assert again == module, text
    assert str(again) == text
    return module


@pytest.mark.unit
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_canonical_program_round_trips(program):
    module = assert_round_trip(program.source)
    d = module[program.entry]
    bound = bind_arguments(d, program.make_inputs(np.random.default_rng(0)))
    specialized = bind_sizes(d, bound.sizes)
    assert_round_trip(str(specialized))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_print_parse_print_stable(source):
    from polyfuse.errors import TCSemanticError
    try:
        module = parse(source)
    except TCSemanticError:
        return  # e.g. an index that only meets other unknowns; the generator is loose
    text = str(module)
    again = parse(text)
    assert again == module
    assert str(again) == text
    # both texts mean the same thing: equal results on the same inputs
    d, d2 = module["f"], again["f"]
    rng = np.random.default_rng(1)
    extent = {"N": 3, "M": 4, "K": 5}
    args = {t.name: (rng.standard_normal([extent[s.name] for s in t.shape]) * 3).astype(t.dtype.numpy)
            for t in d.inputs}
    a = interpret(d, args, extent)
    b = interpret(d2, args, extent)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
