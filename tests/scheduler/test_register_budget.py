"""A register block fits the target's vector registers: its accumulators, the vector
operand's row and a broadcast scalar (AVX2's 16 registers took 6 x 2 blocks where
AVX-512's 32 take 6 x 4)."""

import pytest

from polyfuse.frontends.tc import parse
from polyfuse.scheduler.heuristics import _fit_registers, default_options
from polyfuse.targets import Target
from polyfuse.targets.cpu import machine, vector_registers

pytestmark = pytest.mark.unit

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


@pytest.mark.parametrize("rows, vectors, registers, fitted", [
    (6, 4, 32, (6, 4)), (6, 4, 16, (6, 2)), (8, 2, 16, (8, 1)), (6, 2, 16, (6, 2)),
    (4, 4, 16, (4, 3)), (16, 1, 16, (14, 1)), (6, 4, 8, (6, 1))])
def test_blocks_shrink_to_the_registers(rows, vectors, registers, fitted):
    got = _fit_registers(rows, vectors, registers)
    assert got == fitted
    r, v = got
    assert r * v + v + 1 <= registers


@pytest.mark.parametrize("target, registers", [("x86:skylake-avx512", 32), ("x86:znver4", 32),
                                                ("x86:skylake", 16), ("x86:znver3", 16),
                                                ("aarch64", 32)])
def test_named_targets_have_their_registers(target, registers):
    assert vector_registers(Target.parse(target)) == registers


@pytest.mark.parametrize("target, columns", [("x86:skylake-avx512", 4 * 16), ("x86:znver3", 2 * 8)])
def test_a_matmul_block_takes_the_columns_its_registers_hold(target, columns):
    d = parse(MM).definitions[0]
    t = Target.parse(target)
    options = default_options(d, {"M": 1024, "K": 1024, "N": 1024}, machine(t))
    rows, cols, _ = options.register_tile
    assert (rows, cols) == (6, columns)
