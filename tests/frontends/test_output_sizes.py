"""An output's size when range inference gives its index a nonzero minimum (shifts,
partial copies, padding, convolution gradients): tensors start at index 0 and an output
is as long as its largest written index + 1; the elements below the minimum are never
written (zeros, or what ``out=`` held). Checked on every target against numpy."""

import numpy as np
import pytest

import polyfuse as pf
from tests.arm_tools import AARCH64
from tests.cuda.emulator import CXX
from tests.cuda.test_emulated import emulated  # noqa: F401 (a fixture)
from tests.tc_programs import PROGRAMS_BY_NAME

SOURCE = """
def shift(float(N) I) -> (O) { O(i) = I(i - 1) }
def part(float(N) I) -> (O) { O(i) = I(i) where i in 2:N }
def reverse(float(N) I) -> (O) { O(i) = I(10 - i) }
def padded(float(N) I, float(K) W) -> (P, O) {
  P(i) = I(i - 2)
  O(i) +=! P(i + k) * W(k)
}
"""

rng = np.random.default_rng(3)
I = rng.standard_normal(8).astype(np.float32)
W = rng.standard_normal(3).astype(np.float32)


def _padded():
    P = np.concatenate([[0, 0], I.astype(np.float64)])         # P(i) = I(i-2) for i in 2:N+2
    O = np.array([P[i:i + 3] @ W for i in range(len(P) - 2)])  # i in 0:N+2-K+1
    return P, O


CASES = {
    # name: (arguments, expected outputs, printed output types)
    "shift": ((I,), (np.concatenate([[0], I]),), "float32(N + 1) O"),
    "part": ((I,), (np.concatenate([[0, 0], I[2:]]),), "float32(N) O"),
    "reverse": ((I,), (np.concatenate([np.zeros(3), I[::-1]]),), "float32(11) O"),
    "padded": ((I, W), _padded(), "float32(N + 2) P, float32(N + 3 - K) O"),
}


def check(target):
    mod = pf.define(SOURCE, target=target)
    for name, (args, want, printed) in CASES.items():
        kernel = getattr(mod, name)
        assert printed in str(kernel.definition).splitlines()[0], (name, str(kernel.definition))
        got = kernel(*args)
        got = got if isinstance(got, tuple) else (got,)
        for g, w in zip(got, want):
            assert g.shape == w.shape, (name, target, g.shape, w.shape)
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"{name} on {target}")
    O = np.full(9, 7, np.float32)                              # below the minimum: kept with out=
    mod.shift(I, out=O)
    np.testing.assert_array_equal(O, np.concatenate([[7], I]))


@pytest.mark.unit
def test_the_catalogue_sizes_shifted_outputs_from_index_zero():
    """tests/tc_programs.py's shift_pad and conv_grad_input run on every target there."""
    for name, printed in (("shift_pad", "float32(H + 1, W + 2) O"),
                          ("conv_grad_input", "float32(N) dI")):
        program = PROGRAMS_BY_NAME[name]
        kernel = getattr(pf.define(program.source), program.entry)
        assert printed in str(kernel.definition).splitlines()[0]


@pytest.mark.parametrize("target", ["reference", "x86", AARCH64])
def test_outputs_start_at_zero_and_end_at_the_largest_index(target):
    check(target)


@pytest.mark.skipif(CXX is None, reason="the emulator needs a C++20 compiler")
def test_outputs_start_at_zero_and_end_at_the_largest_index_on_cuda(emulated):
    check("cuda")
