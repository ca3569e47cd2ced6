"""Details of the generated CUDA C that the runtime tests cannot see without a GPU."""

import math

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.ir.types import DType
from polyfuse.targets.cuda import nvrtc_compile
from polyfuse.targets.cuda_expr import c_name, literal


@pytest.mark.unit
@pytest.mark.parametrize("value", [0.1, -3.0e-39, 1.0e30, 2.0**-149, 0.0])
def test_float_literals_are_exact(value):
    text = literal(value, DType.FLOAT64)
    assert float.fromhex(text) == value
    assert float.fromhex(literal(value, DType.FLOAT32)[:-1]) == value  # "f" suffix


@pytest.mark.unit
@pytest.mark.parametrize("value, dtype, text", [
    (math.inf, DType.FLOAT32, "__int_as_float(0x7f800000)"),
    (-math.inf, DType.FLOAT64, "__longlong_as_double(0xfff0000000000000LL)"),
    (math.nan, DType.FLOAT32, "__int_as_float(0x7fc00000)"),
    (-2**63, DType.INT64, "(-9223372036854775807LL - 1)"),
    (True, DType.BOOL, "true")])
def test_special_literals(value, dtype, text):
    assert literal(value, dtype) == text


@pytest.mark.unit
def test_names_that_are_cuda_words_are_renamed():
    assert [c_name(n) for n in ("float", "threadIdx", "pf_x", "A", "new")] == \
        ["float_", "threadIdx_", "pf_x_", "A", "new_"]


def test_tc_names_that_are_cuda_words_compile():
    mod = pf.define("def f(float(N) int, float(N) blockIdx) -> (register) "
                    "{ register(i) = int(i) * blockIdx(i) }", target="cuda")
    spec = mod.f.specialize(np.ones(40, np.float32), np.ones(40, np.float32))
    assert "const float* __restrict__ int_" in spec.stages["cuda"]


def test_nvrtc_errors_are_codegen_errors_with_the_log():
    with pytest.raises(pf.CodegenError, match="undefined|identifier"):
        nvrtc_compile('extern "C" __global__ void k() { undefined_thing(); }', "broken")
