"""Accuracy and code shape of the vector math functions in polyfuse.targets.llvm_math.

Each function runs JIT-compiled inside ``void apply(float* in, float* out, i64 n)``
at widths 1, 8 and 16 and is compared with numpy in float64, rounded to float32.
Errors are counted in ulps of float32 (adjacent floats are 1 apart, -0 == +0).
"""

import ctypes
import math
import platform
import re
from functools import cache

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir

from polyfuse.errors import TargetError
from polyfuse.targets.cpu import link_object
from polyfuse.targets.llvm_math import SUPPORTED, math_function

WIDTHS = (1, 8, 16)
MAX_ULP = 2
# scaling by 2^n with llvm.ldexp, as the host codegen does on AVX-512 (one vscalefps)
SCALES = (False, True) if llvm.get_host_cpu_features().get("avx512f") else (False,)
# Functions with a zero crossing are judged by absolute error where |f| <= 1e-3.
ABSOLUTE_NEAR_ZERO = {"tanh": 1e-7, "sigmoid": 1e-7, "erf": 1e-7}

_erf = np.frompyfunc(math.erf, 1, 1)
REFERENCES = {
    "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "log1p": np.log1p,
    "tanh": np.tanh, "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "erf": lambda x: _erf(x).astype(np.float64),
}
# The interval each function is swept densely over, where its behaviour changes.
DENSE = {
    "exp": (-105.0, 90.0), "exp2": (-152.0, 130.0), "log": (0.0, 4.0), "log2": (0.0, 4.0),
    "log1p": (-1.0, 2.0), "tanh": (-10.0, 10.0), "sigmoid": (-110.0, 30.0), "erf": (-5.0, 5.0),
}
SPECIALS = np.float32([
    0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, 1e-45, -1e-45, 1.1754944e-38,
    3.4028235e38, -3.4028235e38, 88.72283, 88.722855, -87.33654, -103.97208, -103.97209,
    127.99999, 128.0, -149.0, -150.0, 0.625, -0.625, 0.927734375, 3.8325069, 4.0,
    -0.99999994, 1e-30, -1e-30,
])


@pytest.mark.unit
def test_supported_names():
    assert {"exp", "log", "tanh", "erf", "sigmoid"} <= SUPPORTED
    assert set(REFERENCES) == SUPPORTED


@pytest.fixture(scope="module", autouse=True)
def llvm_targets():
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


@pytest.fixture
def machine():
    """A target machine for this CPU; a fresh one per test, as a JIT engine takes ownership."""
    return llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)


def kernel(name, width, scale=False):
    """``apply(in, out, n)``: out[i] = name(in[i]), ``width`` elements at a time."""
    module = ir.Module(name=f"test_{name}_{width}")
    f32, i64, ptr = ir.FloatType(), ir.IntType(64), ir.PointerType()
    ty = f32 if width == 1 else ir.VectorType(f32, width)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr, i64]), "apply")
    src, dst, n = fn.args
    entry, head, body, done = (fn.append_basic_block(s) for s in ("entry", "head", "body", "done"))
    b = ir.IRBuilder(entry)
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    b.cbranch(b.icmp_signed("<", i, n), body, done)
    b.position_at_end(body)
    x = b.load(b.gep(src, [i], source_etype=f32), typ=ty, align=4)
    y = b.call(math_function(module, name, width, scale), [x])
    b.store(y, b.gep(dst, [i], source_etype=f32), align=4)
    i.add_incoming(b.add(i, ir.Constant(i64, width)), body)
    b.branch(head)
    b.position_at_end(done)
    b.ret_void()
    return module


def compile_kernel(machine, module, *, optimize):
    """The parsed, verified (and optionally O3-optimized) LLVM module."""
    mod = llvm.parse_assembly(str(module))
    mod.triple = machine.triple
    mod.data_layout = str(machine.target_data)
    mod.verify()
    if optimize:
        tuning = llvm.create_pipeline_tuning_options(speed_level=3)  # must outlive builder
        builder = llvm.create_pass_builder(machine, tuning)
        builder.getModulePassManager().run(mod, builder)
        mod.verify()
    return mod


class Jit:
    """A JIT-compiled ``apply`` callable on float32 arrays (keeps its library loaded)."""

    def __init__(self, machine, mod):
        address, self.library = link_object(machine.emit_object(mod), "apply")
        proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
        self.fn = proto(address)

    def __call__(self, x):
        out = np.empty_like(x)
        self.fn(x.ctypes.data, out.ctypes.data, x.size)
        return out


@cache
def inputs(name):
    """Specials, every 2^15-th float of either sign, a dense sweep; a multiple of 16 long."""
    spread = np.arange(0, 0x7F800000, 1 << 15, dtype=np.uint32).view(np.float32)
    dense = np.linspace(*DENSE[name], 1 << 16, dtype=np.float32)
    x = np.concatenate([SPECIALS, spread, -spread, dense])
    return np.ascontiguousarray(np.resize(x, -(-x.size // 16) * 16))


@cache
def reference(name):
    x = inputs(name)
    with np.errstate(all="ignore"):
        return np.asarray(REFERENCES[name](x.astype(np.float64))).astype(np.float32)


def ulps(got, want):
    """Distance in float32 steps; 0 between NaNs, infinite between NaN and a number."""
    def ordered(a):
        bits = a.view(np.int32).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)
    d = np.abs(ordered(got) - ordered(want)).astype(np.float64)
    d[np.isnan(got) & np.isnan(want)] = 0
    d[np.isnan(got) ^ np.isnan(want)] = np.inf
    return d


def check_accuracy(name, x, got, want):
    """Assert the documented bounds, naming the worst input on failure."""
    err = ulps(got, want)
    inf = np.isinf(want)
    assert np.array_equal(got[inf], want[inf]), f"{name}: infinities at {x[inf]}"
    if name in ABSOLUTE_NEAR_ZERO:
        near_zero = np.abs(want) <= 1e-3
        xs, gs, ws = x[near_zero], got[near_zero], want[near_zero]
        diff = np.abs(gs.astype(np.float64) - ws)
        worst = np.argmax(diff)
        assert diff[worst] <= ABSOLUTE_NEAR_ZERO[name], \
            f"{name}({xs[worst]!r}) = {gs[worst]!r}, want {ws[worst]!r}"
        err[near_zero] = 0
    worst = np.argmax(err)
    assert err[worst] <= MAX_ULP, \
        f"{name}({x[worst]!r}) = {got[worst]!r}, want {want[worst]!r} ({err[worst]} ulp)"


@pytest.mark.parametrize("scale", SCALES, ids=lambda s: "ldexp" if s else "exponent-bits")
@pytest.mark.parametrize("optimize", [True, False], ids=["O3", "unoptimized"])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_accuracy(machine, name, width, optimize, scale):
    jit = Jit(machine, compile_kernel(machine, kernel(name, width, scale), optimize=optimize))
    x = inputs(name)
    check_accuracy(name, x, jit(x), reference(name))


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 only")
@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_accuracy_without_fma(name):
    """Baseline x86-64 (SSE2, no FMA): llvm.fmuladd becomes a multiply and an add."""
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu="x86-64", features="", opt=3)
    mod = compile_kernel(machine, kernel(name, 8), optimize=True)
    assert "vfmadd" not in machine.emit_assembly(mod)
    x = inputs(name)
    check_accuracy(name, x, Jit(machine, mod)(x), reference(name))


NAN = float("nan")
TINY = 2.0 ** -149  # the smallest subnormal float32
# Results that are exact in float32, including IEEE special cases and saturation.
EXACT = [
    ("exp", [0.0, -0.0, np.inf, -np.inf, NAN, 88.72284, -104.0, -1000.0,   # (8 at a time)
             -103.97208, -103.972084, -3.4028235e38, -1e4, -105.0, 1e-30, -1e-30, -np.inf],
     [1.0, 1.0, np.inf, 0.0, NAN, np.inf, 0.0, 0.0, TINY, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0]),
    ("log", [0.0, -0.0, np.inf, -1.0, -np.inf, NAN, 1.0, TINY],
     [-np.inf, -np.inf, np.inf, NAN, NAN, NAN, 0.0, -149 * math.log(2)]),
    ("tanh", [0.0, -0.0, np.inf, -np.inf, NAN, 20.0, -20.0, 1e-30],
     [0.0, -0.0, 1.0, -1.0, NAN, 1.0, -1.0, 1e-30]),
    ("sigmoid", [0.0, np.inf, -np.inf, NAN, 200.0, -200.0, 90.0, -1e4],
     [0.5, 1.0, 0.0, NAN, 1.0, 0.0, 1.0, 0.0]),
    ("erf", [0.0, -0.0, np.inf, -np.inf, NAN, 10.0, -10.0, 4.0],
     [0.0, -0.0, 1.0, -1.0, NAN, 1.0, -1.0, 1.0]),
]


@pytest.mark.parametrize("scale", SCALES, ids=lambda s: "ldexp" if s else "exponent-bits")
@pytest.mark.parametrize(("name", "x", "want"), EXACT, ids=[row[0] for row in EXACT])
def test_special_values(machine, name, x, want, scale):
    jit = Jit(machine, compile_kernel(machine, kernel(name, 8, scale), optimize=True))
    got = jit(np.float32(x))
    np.testing.assert_array_equal(got, np.float32(want))  # NaN == NaN here
    numbers = ~np.isnan(got)
    np.testing.assert_array_equal(np.signbit(got[numbers]), np.signbit(np.float32(want)[numbers]))


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64") or platform.system() != "Linux",
                    reason="x86 floating-point flags, through glibc's libm")
@pytest.mark.parametrize("scale", SCALES, ids=lambda s: "ldexp" if s else "exponent-bits")
def test_exp_of_what_rounds_to_zero_does_not_underflow(machine, scale):
    """exp of inputs far below the row's maximum (a softmax's masked scores: finfo.min,
    -1e4) is 0 without an underflowing product, which costs x86 a microcode assist per
    instruction; results that are subnormal still are, exactly."""
    libm = ctypes.CDLL("libm.so.6")
    fe_underflow = 0x10   # x86's FE_UNDERFLOW
    jit = Jit(machine, compile_kernel(machine, kernel("exp", 16, scale), optimize=True))
    x = np.resize(np.float32([np.finfo(np.float32).min, -1e4, -200.0, -104.0, 0.5, -3.0, 80.0, -87.0]), 64)
    libm.feclearexcept(fe_underflow)
    got = jit(x)
    assert not libm.fetestexcept(fe_underflow)
    np.testing.assert_allclose(got, np.exp(x.astype(np.float64)).astype(np.float32), rtol=2e-7)
    tiny = np.full(16, -95.0, np.float32)
    libm.feclearexcept(fe_underflow)
    assert jit(tiny)[0] == np.float32(np.exp(-95.0)) and libm.fetestexcept(fe_underflow)


def test_exp_is_inlined_vector_code(machine):
    mod = compile_kernel(machine, kernel("exp", 16), optimize=True)
    asm = machine.emit_assembly(mod)
    assert "polyfuse.math" not in asm  # inlined, then deleted
    assert not re.search(r"^\s*(call|callq|bl|blr)\s", asm, re.MULTILINE)
    assert not re.search(r"\bexpf?\b", asm)


@pytest.mark.parametrize(("triple", "cpu"), [("x86_64-unknown-linux-gnu", "x86-64"),
                                             ("aarch64-unknown-linux-gnu", "generic")])
def test_no_calls_on_baseline_targets(triple, cpu):
    """Every intrinsic used lowers to instructions even without FMA or SSE4.1."""
    machine = llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features="", opt=3)
    for name in sorted(SUPPORTED):
        asm = machine.emit_assembly(compile_kernel(machine, kernel(name, 16), optimize=True))
        calls = re.findall(r"^\s*(?:call|callq|bl|blr)\s+(\S+)", asm, re.MULTILINE)
        assert calls == [], f"{name} on {triple} calls {calls}"


def test_functions_are_emitted_once_per_name_and_width():
    module = ir.Module()
    first = math_function(module, "tanh", 8)
    assert math_function(module, "tanh", 8) is first
    assert math_function(module, "tanh", 4) is not first
    assert first.name == "polyfuse.math.tanh.v8f32"
    assert math_function(module, "tanh", 1).name == "polyfuse.math.tanh.f32"
    text = str(module)
    assert "define internal <8 x float> @\"polyfuse.math.tanh.v8f32\"" in text
    assert "alwaysinline" in text
    assert not re.search(r"\b(fast|reassoc|nnan|ninf|afn|contract)\b", text)
    llvm.parse_assembly(text).verify()


@pytest.mark.unit
@pytest.mark.parametrize(("name", "width"), [("cosh", 8), ("exp", 0), ("exp", 2.0)])
def test_bad_requests_raise(name, width):
    with pytest.raises(TargetError):
        math_function(ir.Module(), name, width)
