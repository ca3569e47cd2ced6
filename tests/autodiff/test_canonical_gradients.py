"""The derived gradient of every differentiable canonical TC program (tests/tc_programs.py)
against central differences, in float64 on the reference interpreter."""

import numpy as np
import pytest

from polyfuse.lowering.autodiff import GradientError, differentiable_inputs, gradients
from tests.autodiff.fd import as_float64, check_gradients, widened
from tests.tc_programs import PROGRAMS, PROGRAMS_BY_NAME

pytestmark = pytest.mark.unit

# inputs inside the domain where the program is differentiable
_INPUTS = {
    # sqrt(1 - T^2) has an infinite derivative at T = +-1, which linspace(-1, 1) reaches
    "kaiser_window": lambda rng: (rng.uniform(-1, 1, 9), rng.uniform(-0.9, 0.9, 9), np.array([3.5])),
}
# lgamma's derivative (digamma) is no TC builtin
_NOT_DIFFERENTIABLE = {"binomial_and_quantiles": "lgamma"}
# reads the bits of float32 and float16 values, which float64 ones do not have
_NOT_WIDENED = {"reinterpret"}


@pytest.mark.parametrize("program", [p for p in PROGRAMS
                                     if p.name not in _NOT_DIFFERENTIABLE and p.name not in _NOT_WIDENED],
                         ids=lambda p: p.name)
def test_gradient_matches_finite_differences(program):
    d = widened(program.source, program.entry)
    rng = np.random.default_rng(7)
    make = _INPUTS.get(program.name, program.make_inputs)
    args = as_float64(make(rng))
    checked = check_gradients(d, args, rng=rng)
    assert checked == len(differentiable_inputs(d))


def test_programs_without_float_inputs_have_no_gradient():
    for name in ("int32_sum", "int_ops", "uint_mixed", "negative_divmod", "bitwise"):
        p = PROGRAMS_BY_NAME[name]
        assert gradients(widened(p.source, p.entry)) == ()


@pytest.mark.parametrize("name", sorted(_NOT_DIFFERENTIABLE))
def test_not_differentiable_program_names_the_statement(name):
    p = PROGRAMS_BY_NAME[name]
    from polyfuse.frontends.tc import parse
    with pytest.raises(GradientError) as err:
        gradients(parse(p.source)[p.entry], source=p.source)
    message = str(err.value)
    assert _NOT_DIFFERENTIABLE[name] in message and "writing 'L'" in message
    assert err.value.line == 3 and err.value.col is not None
