"""32-bit index arithmetic on the GPU (issue 37): a launch whose buffers have fewer than
2**31 elements and whose index expressions are bounded within +-2**30 at every node (from
the ranges of the loops around them) computes its indices in ``int``; any other keeps
``long long``. Checked on the analysis itself, on the generated C and SASS, and by
running kernels at the edge on the emulator against numpy."""

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.ir.comprehension import Binary, BinaryOp, Call, IndexVar, Literal, Read
from polyfuse.ir.types import DType
from polyfuse.runtime import cuda as cuda_runtime
from polyfuse.runtime.arguments import placeholder
from polyfuse.targets import cuda_codegen
from polyfuse.targets.cuda import compile_gpu_kernel
from polyfuse.targets.cuda_codegen import INT32_SPAN, _bounded
from polyfuse.targets.cuda_sass import Mix, disassemble, instruction_mix
from tests.cuda.test_emulated import emulated  # noqa: F401
from tests.cuda.test_sass import needs_nvdisasm

I64 = DType.INT64
INTEGER = ("IMAD", "IADD3", "LEA", "ISETP", "SHF", "LOP3", "SEL")


def var(name):
    return IndexVar(name)


def lit(v):
    return Literal(v, I64)


def mul(a, b):
    return Binary(BinaryOp.MUL, a, b, I64)


@pytest.mark.unit
def test_index_arithmetic_is_bounded_node_by_node():
    env = {"i": (0, 99_999), "j": (-1, 56)}
    assert _bounded(Binary(BinaryOp.ADD, mul(var("i"), lit(4096)), var("j"), I64), env) == (-1, 99_999 * 4096 + 56)
    # the result is small but the product on the way is not: not 32-bit
    assert _bounded(Binary(BinaryOp.MOD, mul(var("i"), lit(1_000_003)), lit(7), I64), env) is None
    # C's division truncates; floordiv floors
    assert _bounded(Binary(BinaryOp.DIV, var("j"), lit(2), I64), env) == (0, 28)
    assert _bounded(Call("floordiv", (var("j"), lit(2)), I64), env) == (-1, 28)
    assert _bounded(Binary(BinaryOp.MOD, var("j"), lit(8), I64), env) == (-7, 7)
    # a divisor that is not a positive constant, an unknown variable: not bounded
    assert _bounded(Binary(BinaryOp.DIV, var("i"), var("j"), I64), env) is None
    assert _bounded(var("k"), env) is None
    # a read's value is a long long: what it meets widens, its indices must be bounded
    read = Read("X", (mul(var("i"), lit(2)),), I64)
    assert _bounded(mul(read, lit(2**40)), env) is True
    assert _bounded(Read("X", (mul(var("i"), lit(40_000)),), I64), env) is None
    # a literal beyond the span is a long long: what it meets is 64-bit
    assert _bounded(mul(var("i"), lit(INT32_SPAN)), env) is True


@pytest.fixture
def fresh_kernels(monkeypatch, tmp_path):
    """Kernels compiled here, not found in the caches: each test sees its own code."""
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cuda_runtime, "_COMPILED", type(cuda_runtime._COMPILED)())


def launch_source(kernel):
    return kernel.stages["cuda"].split('extern "C"', 1)[1]


def narrow(code):
    """Whether the launch's loops count in int (and none in long long)."""
    return "for (int " in code and "for (long long " not in code


def test_sizes_below_two_to_the_31_take_int_indices_and_above_long_long(fresh_kernels):
    k = pf.define("def add1(float(M, N) A) -> (B) { B(m, n) = A(m, n) + 1.0 }", target="cuda").add1
    small = launch_source(k.specialize(placeholder((1 << 15, 1 << 15), np.float32)))
    large = launch_source(k.specialize(placeholder((1 << 16, (1 << 15) + 1), np.float32)))
    assert narrow(small) and "long long" not in small.replace("unsigned long long", "")
    assert not narrow(large) and "const long long c" in large


@needs_nvdisasm
def test_a_matmul_in_32_bit_indices_runs_fewer_integer_instructions(fresh_kernels, monkeypatch):
    kernels = []
    real = cuda_runtime.compile_gpu_kernel
    monkeypatch.setattr(cuda_runtime, "compile_gpu_kernel", lambda k, arch: kernels.append((k, arch)) or real(k, arch))
    mm = pf.define("def mm32(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }", target="cuda").mm32
    big = placeholder((4096, 4096), np.float32)
    mm.specialize(big, big)
    (kernel, arch), = kernels
    mixes = {}
    for narrow in (True, False):
        if not narrow:
            monkeypatch.setattr(cuda_codegen, "narrow_indices", lambda kernel, launch: False)
        binary = compile_gpu_kernel(kernel, arch)
        (mixes[narrow],) = instruction_mix(disassemble(binary.cubin)).values()
    counts = {n: sum(Mix.count(m.instructions, op) for op in INTEGER) for n, m in mixes.items()}
    assert counts[True] <= 0.8 * counts[False], counts
    assert Mix.count(mixes[True].instructions, "FFMA") == Mix.count(mixes[False].instructions, "FFMA")


@pytest.mark.parametrize("source, make, oracle, in_int", [
    # an index whose product on the way overflows 32 bits: the launch keeps long long
    ("def hop(float(N) X) -> (Y) { Y(i) = X((i * 20000003) % N) where i in 0:N }",
     lambda rng: (rng.standard_normal(97).astype(np.float32),),
     lambda x: x[(np.arange(97, dtype=np.int64) * 20000003) % 97], False),
    # an index read from memory in a 32-bit launch: the gathered index widens its sum
    ("def gather(float(N, D) X, int64(M) I) -> (Y) { Y(m, d) = X(I(m), d) }",
     lambda rng: (rng.standard_normal((50, 33)).astype(np.float32), rng.integers(0, 50, 40)),
     lambda x, i: x[i], True),
    # negative offsets and truncating division in int
    ("def pool(float(N) X) -> (Y) { Y(i) = (i >= 1 ? X(i - 1) : 0.0) + X(i / 2) where i in 0:N }",
     lambda rng: (rng.standard_normal(77).astype(np.float32),),
     lambda x: np.concatenate([[0.0], x[:-1]]).astype(np.float32) + x[np.arange(77) // 2], True),
], ids=["overflowing-product", "gather", "offsets"])
def test_kernels_at_the_edges_of_32_bits_run_right_on_the_emulator(source, make, oracle, in_int, emulated):  # noqa: F811
    args = make(np.random.default_rng(0))
    (kernel,) = pf.define(source, target="cuda")
    code = launch_source(kernel.specialize(*args))
    assert narrow(code) == in_int
    got = kernel(*args)
    assert emulated.launches
    np.testing.assert_allclose(got, oracle(*args), rtol=1e-6)
