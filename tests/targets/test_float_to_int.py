"""Floats converted to integers mean the same on every target: toward zero into 64 bits,
saturating (NaN is 0), then narrowed modulo 2**bits; uint64 saturates by itself. Checked
against ``ir.types.float_to_int`` and, for values in range, against numpy's own cast."""

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.frontends.tc import parse
from polyfuse.ir.loops_interpreter import interpret_kernel
from polyfuse.ir.types import DType, float_to_int
from polyfuse.runtime.arguments import bind_arguments
from polyfuse.scheduler.options import MappingOptions
from polyfuse.scheduler.pipeline import schedule_definition
from tests.arm_tools import AARCH64

SPECIAL = [np.nan, np.inf, -np.inf, 1e30, -1e30, 3e9, -3e9, 1e19, -1e19, 2.0**63, -2.0**63,
           2.7, -2.7, 255.9, -1.5, 0.0, -0.0, 65536.5, 127.5, -128.5]
INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def program(src: str, dst: str) -> str:
    return f"def f({src}(N) A) -> (B) {{ B(i) = {dst}(A(i)) }}"


@pytest.mark.unit
def test_the_definition_on_values_in_range_is_numpys_cast():
    v = np.array([2.7, -2.7, 100.5, -100.5, 0.0], np.float64)
    for t in ("int8", "int32", "int64"):
        np.testing.assert_array_equal(float_to_int(v, DType.from_name(t)), v.astype(t))
    assert list(float_to_int([np.nan, np.inf, -np.inf, -1.5, 1e30], DType.UINT8)) == [0, 255, 0, 255, 255]
    assert list(float_to_int([np.nan, -5.0, 1e30, 7.9], DType.UINT64)) == [0, 0, 2**64 - 1, 7]
    assert list(float_to_int([np.inf, -np.inf, 3e9], DType.INT32)) == [-1, 0, -1294967296]


@pytest.mark.parametrize("dst", INTS)
@pytest.mark.parametrize("src", ["float32", "float64", "float16"])
@pytest.mark.parametrize("target", ["reference", "host", AARCH64])
def test_every_target_converts_special_values_the_same(src, dst, target):
    with np.errstate(over="ignore"):  # 1e30 and 3e9 are inf in float16
        values = np.array(SPECIAL, dtype=src)
    got = pf.define(program(src, dst), target=target).f(values)
    np.testing.assert_array_equal(got, float_to_int(values, DType.from_name(dst)))


@pytest.mark.parametrize("dst", INTS)
@pytest.mark.parametrize("src", ["float32", "float64"])
def test_vector_lanes_convert_as_scalars_do(src, dst):
    # long enough that the loop runs vectorized: every lane saturates on its own
    rng = np.random.default_rng(len(dst))
    values = np.concatenate([np.array(SPECIAL * 8), rng.normal(0, 1, 500) * 10.0 ** rng.integers(0, 25, 500)])
    values = rng.permutation(values * np.where(rng.random(values.size) < 0.5, -1, 1)).astype(src)
    got = pf.define(program(src, dst), target="host").f(values)
    np.testing.assert_array_equal(got, float_to_int(values, DType.from_name(dst)))


@pytest.mark.parametrize("dst", ["int8", "uint8", "int16", "int32", "int64", "uint64"])
@pytest.mark.parametrize("src", ["float32", "float64"])
@pytest.mark.parametrize("clamp, lo, hi", [("min(max(A(i), -300.5), 300.5)", -300.5, 300.5),
                                           ("max(min(A(i), 2e9), -7.0)", -7.0, 2e9),
                                           ("min(max(A(i), -3e9), 255.0)", -3e9, 255.0),
                                           ("max(min(max(A(i), 0.0), 1e30), 9.0)", 9.0, 1e30)])
def test_clamped_values_convert_as_unclamped_ones_do(clamp, lo, hi, src, dst):
    # within 32 bits the clamp lets a 32-bit conversion serve (NaN still 0); wider, the 64-bit one
    rng = np.random.default_rng(3)
    values = np.concatenate([np.array(SPECIAL * 8), rng.normal(0, 1, 300) * 10.0 ** rng.integers(0, 12, 300)])
    values = rng.permutation(values * np.where(rng.random(values.size) < 0.5, -1, 1)).astype(src)
    got = pf.define(f"def f({src}(N) A) -> (B) {{ B(i) = {dst}({clamp}) }}", target="host").f(values)
    clamped = np.minimum(np.maximum(values.astype(np.float64), lo), hi)   # NaN stays NaN
    np.testing.assert_array_equal(got, float_to_int(clamped, DType.from_name(dst)))


@pytest.mark.unit
@pytest.mark.parametrize("dst", ["int32", "uint8", "uint64"])
def test_the_loop_ir_interpreter_converts_the_same(dst):
    values = np.array(SPECIAL, np.float32)
    d = parse(program("float32", dst))["f"]
    bound = bind_arguments(d, (values,))
    kernel = schedule_definition(d, bound.sizes, MappingOptions())
    got = interpret_kernel(kernel, bound.values)["B"]
    np.testing.assert_array_equal(got, float_to_int(values, DType.from_name(dst)))


def _cuda_store(dst: str) -> str:
    text = pf.define(program("float32", dst), target="cuda").f.specialize(
        np.ones(4, np.float32)).stages["cuda"]
    return next(line.strip() for line in text.splitlines() if line.strip().startswith("B["))


def test_cuda_c_converts_through_the_gpus_saturating_conversions():
    # the GPU's cvt.rzi saturates and gives 0 for NaN: signed 64 bits, then narrowed
    assert _cuda_store("uint8") == "B[c1] = (unsigned char)((long long)(unsigned char)((long long)A[c1]));"
    assert "(unsigned long long)A[c1]" in _cuda_store("uint64")
