"""TC's builtins (CUDA's single-precision math) on every target, against scipy/numpy/mpmath.

All builtins are compiled into one kernel per target: row r of the input A holds the
r-th argument row, and each output applies one builtin to its rows. Results are
judged in ulps of float32 (adjacent floats are 1 apart, -0 == +0) against the
float64 oracle rounded to float32; NaN must be NaN and infinities exact. Functions
with zeros inside their domain also accept a small absolute error (``atol``).
"""

import math
import re
from dataclasses import dataclass, field

import ml_dtypes
import mpmath
import numpy as np
import pytest
import scipy.special as sp

import polyfuse as pf
from polyfuse.frontends.loop_ir import parse_kernel
from polyfuse.frontends.tc import parse_definition
from polyfuse.ir.loops_interpreter import interpret_kernel
from polyfuse.runtime.arguments import bind_arguments
from polyfuse.scheduler.options import MappingOptions
from polyfuse.scheduler.pipeline import schedule_definition
from polyfuse.targets.cpu import native_dots
from polyfuse.targets.llvm_expr import VECTOR_BODIES
from polyfuse.targets.target import Target
from tests.arm_tools import AARCH64, needs_arm_tools
from tests.cuda.emulator import CXX
from tests.cuda.test_emulated import emulated  # noqa: F401 (the emulated-device fixture)
from tests.ir.test_roundtrip import assert_round_trip

N = 2048
F = np.float32
EDGES = F([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1e-45,
           -1e-45, 1e-38, 3.4028235e38, -3.4028235e38, 8388607.5, 8388609.0, 16777217.0, 1e30])


def _mix(rng, lo, hi, *, log=False, edges=EDGES):
    """N points: dense uniform (or log-uniform magnitudes of both signs) in [lo, hi], then edges."""
    n = N - len(edges)
    if log:
        dense = np.exp(rng.uniform(math.log(lo), math.log(hi), n)) * rng.choice([-1, 1], n)
    else:
        dense = rng.uniform(lo, hi, n)
    return np.concatenate([dense, edges]).astype(F)


def _mp(fn):
    f = np.frompyfunc(lambda v: float(fn(mpmath.mpf(float(v)))) if math.isfinite(v) else math.nan, 1, 1)
    return lambda x: f(x).astype(np.float64)


def _fma(x, y, z):
    """x y + z rounded once to float32 (mpmath: exact product, sum at 24 bits)."""
    def one(a, b, c):
        if not all(map(math.isfinite, (a, b, c))):
            return a * b + c
        return float(mpmath.fadd(mpmath.fmul(a, b, exact=True), c, prec=24, rounding="n"))
    return np.frompyfunc(one, 3, 1)(x, y, z).astype(np.float64)


def _norm(*xs):
    out = np.sqrt(sum(x * x for x in xs))
    return np.where(np.any([np.isinf(x) for x in xs], axis=0), np.inf, out)


def _bessel_i(fn, odd):
    def oracle(x):
        out = fn(x)
        return np.where(np.isinf(x), np.copysign(np.inf, x) if odd else np.inf, out)
    return oracle


def _c_at_inf(fn, at_inf, at_minus_inf):
    """scipy's function with C's values at +-inf where scipy says otherwise (j0(inf) = 0)."""
    return lambda x: np.where(x == np.inf, at_inf, np.where(x == -np.inf, at_minus_inf, fn(x)))


def _tf32(x):
    """x to 11 significant bits (a 10-bit fraction), ties away from zero, in float64: steps of
    2^(e - 10) for |x| in [2^e, 2^(e+1)), of 2^-136 below float32's normal range."""
    _, e = np.frexp(x)
    step = np.ldexp(1.0, np.maximum(e - 1, -126) - 10)
    out = np.copysign(np.floor(np.abs(x) / step + 0.5) * step, x)
    return np.where(np.isfinite(x), out, x)


def _fdim(x, y):
    return np.where(x > y, x - y, np.where(np.isnan(x) | np.isnan(y), np.nan, 0.0))


@dataclass
class Spec:
    oracle: object
    args: object                      # rng -> list of float32 arrays
    ulp: int = 2
    atol: float = 0.0
    by_target: dict = field(default_factory=dict)   # target -> (ulp, atol) where it differs


def _one(lo, hi, **kw):
    return lambda rng: [_mix(rng, lo, hi, **kw)]


def _two(lo, hi, **kw):
    return lambda rng: [_mix(rng, lo, hi, **kw), np.roll(_mix(rng, lo, hi, **kw), 7)]


# libm's float32 Bessel functions (x86, aarch64, the emulator's host) are
# judged like CUDA's documented bounds: absolute error near the zeros.
LIBM = {t: (16, 2e-6) for t in ("x86", "aarch64", "cuda")}
HOST_LIBM = {"cuda": LIBM["cuda"]}     # the emulator's lgammaf and tgammaf
SPECS = {
    "round": Spec(lambda x: np.copysign(np.floor(np.abs(x) + 0.5), x), _one(-10, 10), 0),
    "rint": Spec(np.rint, _one(-10, 10), 0),
    "acosh": Spec(np.arccosh, lambda rng: [_mix(rng, 1.0, 1e6, log=True)]),
    "asinh": Spec(np.arcsinh, _one(1e-30, 1e38, log=True)),
    "atanh": Spec(np.arctanh, _one(-1.0, 1.0), 3),
    "copysign": Spec(np.copysign, _two(-5, 5), 0),
    "cospi": Spec(_mp(mpmath.cospi), _one(-1e3, 1e3), atol=1e-7),
    "sinpi": Spec(_mp(mpmath.sinpi), _one(-1e3, 1e3), atol=1e-7),
    "cyl_bessel_i0": Spec(_bessel_i(sp.i0, False), _one(-95, 95), 4),
    "cyl_bessel_i1": Spec(_bessel_i(sp.i1, True), _one(-95, 95), 4),
    "erfinv": Spec(sp.erfinv, lambda rng: [np.concatenate([
        _mix(rng, -1, 1)[:N // 2], (1 - np.exp(rng.uniform(-16.6, 0, N // 2))).astype(F)])]),
    "erfcinv": Spec(sp.erfcinv, lambda rng: [np.concatenate([
        _mix(rng, 0, 2)[:N // 2], np.exp(rng.uniform(-103, 0, N // 2)).astype(F)])]),
    "normcdfinv": Spec(sp.ndtri, lambda rng: [np.concatenate([
        _mix(rng, 0, 1)[:N // 2], np.exp(rng.uniform(-103, 0, N // 2)).astype(F)])]),
    "erfcx": Spec(sp.erfcx, lambda rng: [np.concatenate([
        _mix(rng, -10, 30)[:N // 2], np.exp(rng.uniform(0, 70, N // 2)).astype(F)])], 4),
    "exp10": Spec(sp.exp10, _one(-46, 39), 1),
    "fdim": Spec(_fdim, _two(-5, 5), 0),
    "fdivide": Spec(np.true_divide, _two(-5, 5), 0),
    "fma": Spec(_fma, lambda rng: [_mix(rng, -5, 5), _mix(rng, -5, 5), np.roll(_mix(rng, -25, 25), 3)], 0),
    "hypot": Spec(_norm, _two(1e-30, 1e38, log=True), 1),
    "rhypot": Spec(lambda x, y: 1 / _norm(x, y), _two(1e-18, 1e18, log=True), 1),
    "norm3d": Spec(_norm, lambda rng: [_mix(rng, -1e3, 1e3) for _ in range(3)], 1),
    "rnorm3d": Spec(lambda *xs: 1 / _norm(*xs), lambda rng: [_mix(rng, -1e3, 1e3) for _ in range(3)], 1),
    "norm4d": Spec(_norm, lambda rng: [_mix(rng, -1e3, 1e3) for _ in range(4)], 1),
    "rnorm4d": Spec(lambda *xs: 1 / _norm(*xs), lambda rng: [_mix(rng, -1e3, 1e3) for _ in range(4)], 1),
    "j0": Spec(_c_at_inf(sp.j0, 0.0, 0.0), _one(-100, 100), 4, 1e-7, LIBM),
    "j1": Spec(_c_at_inf(sp.j1, 0.0, 0.0), _one(-100, 100), 4, 1e-7, LIBM),
    "y0": Spec(_c_at_inf(sp.y0, 0.0, np.nan), _one(0, 100), 4, 1e-7, LIBM),
    "y1": Spec(_c_at_inf(sp.y1, 0.0, np.nan), _one(0, 100), 4, 1e-7, LIBM),
    "lgamma": Spec(_c_at_inf(sp.gammaln, np.inf, np.inf), _one(-50, 50), 2, 2e-7, HOST_LIBM),
    "tgamma": Spec(sp.gamma, _one(-40, 36), 4, 0.0, HOST_LIBM),
    "tf32": Spec(_tf32, _one(1e-45, 3e38, log=True), 0),
    "logb": Spec(lambda x: np.where(x == 0, -np.inf, np.floor(np.log2(np.abs(x)))),
                 _one(1e-45, 3e38, log=True), 0),
    "nextafter": Spec(lambda x, y: np.nextafter(F(x), F(y)).astype(np.float64), _two(-3, 3), 0),
    "normcdf": Spec(sp.ndtr, _one(-14, 6), 4),
    "rcbrt": Spec(lambda x: 1 / np.cbrt(x), _one(1e-45, 3e38, log=True), 1),
    "remainder": Spec(np.vectorize(lambda x, y: math.remainder(x, y) if math.isfinite(x) and y != 0
                                   and not math.isnan(y) else math.nan),
                      lambda rng: [_mix(rng, -1e6, 1e6), _mix(rng, 1e-3, 50, log=True)], 0),
}


def _program():
    """One kernel applying every builtin to its rows of A, the rows, and each builtin's rows."""
    rng = np.random.default_rng(0)
    rows, lines, outputs, slices = [], [], [], {}
    for k, (name, spec) in enumerate(SPECS.items()):
        args = spec.args(rng)
        reads = ", ".join(f"A({len(rows) + j}, n)" for j in range(len(args)))
        slices[name] = slice(len(rows), len(rows) + len(args))
        rows += [np.resize(a, N) for a in args]
        outputs.append(f"O{k}")
        lines.append(f"  O{k}(n) = {name}({reads})")
    source = f"def builtins(float(R, N) A) -> ({', '.join(outputs)}) {{\n" + "\n".join(lines) + "\n}"
    return source, np.stack(rows), slices


SOURCE, ROWS, SLICES = _program()


def ulp_distance(got, want):
    def ordered(v):
        i = v.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(ordered(got) - ordered(want))


def check(target, outputs):
    failures = []
    for (name, spec), got in zip(SPECS.items(), outputs):
        args = ROWS[SLICES[name]].astype(np.float64)
        with np.errstate(all="ignore"):
            want = np.asarray(spec.oracle(*args), np.float64).astype(F)
        ulp, atol = spec.by_target.get(target, (spec.ulp, spec.atol))
        with np.errstate(invalid="ignore"):
            bad_nan = np.isnan(got) != np.isnan(want)
            bad_inf = (np.isinf(want) | np.isinf(got)) & (got != want) & ~np.isnan(want)
            distance = np.where(np.isnan(want) | np.isinf(want), 0, ulp_distance(got, want))
            close = np.abs(got.astype(np.float64) - want) <= atol
        bad = bad_nan | bad_inf | ((distance > ulp) & ~close)
        if bad.any():
            k = np.flatnonzero(bad)[:3]
            failures.append(f"{name}: {bad.sum()} bad, max {distance[~np.isnan(want)].max()} ulp; "
                            f"args {args[:, k].T.tolist()} got {got[k]} want {want[k]}")
    assert not failures, f"{target}:\n" + "\n".join(failures)


@pytest.mark.unit
def test_reference_interpreter_matches_the_oracles():
    check("reference", pf.define(SOURCE).builtins(ROWS))


def test_x86_matches_the_oracles_and_vectorizes(capfd):
    kernel = pf.define(SOURCE, target="x86").builtins
    outputs = kernel(ROWS)
    assert capfd.readouterr().err == ""          # no "loop not vectorized" remarks
    check("x86", outputs)


@pytest.mark.parametrize("target", [AARCH64, pytest.param("aarch64+sve", marks=needs_arm_tools)])
def test_aarch64_matches_the_oracles(target, capfd):
    outputs = pf.define(SOURCE, target=target).builtins(ROWS)
    assert capfd.readouterr().err == ""
    check("aarch64", outputs)


@pytest.mark.skipif(CXX is None, reason="the emulator needs a C++20 compiler")
def test_cuda_c_matches_the_oracles_on_the_emulator(emulated):
    kernel = pf.define(SOURCE, target="cuda").builtins
    outputs = kernel(ROWS)
    assert emulated.launches
    check("cuda", outputs)


@pytest.mark.unit
def test_loop_ir_interpreter_matches_the_oracles_element_by_element():
    """The loop-IR interpreter calls the same table one scalar at a time (0-d arrays)."""
    d = parse_definition(SOURCE)
    rows = ROWS[:, ::64].copy()            # every 64th point keeps the scalar loop short
    bound = bind_arguments(d, (rows,))
    got = interpret_kernel(schedule_definition(d, bound.sizes, MappingOptions()), bound.values)
    want = pf.define(SOURCE).builtins(rows)
    for k, name in enumerate(SPECS):
        np.testing.assert_array_equal(got[f"O{k}"], want[k], err_msg=name)


def test_every_builtin_round_trips_through_the_tc_and_loop_ir_texts():
    assert_round_trip(SOURCE)
    loops = pf.define(SOURCE, target="x86").builtins.specialize(ROWS).stages["loops"]
    assert "norm4d(" in loops and "fma(" in loops
    assert str(parse_kernel(loops)) == loops


def test_loops_over_the_float32_algorithms_vectorize(capfd):
    names = sorted(VECTOR_BODIES)
    arity = {name: SLICES[name].stop - SLICES[name].start for name in names}
    lines = [f"  O{k}(n) = {name}({', '.join(['X(n)'] * arity[name])})" for k, name in enumerate(names)]
    source = (f"def vec(float(N) X) -> ({', '.join(f'O{k}' for k in range(len(names)))}) {{\n"
              + "\n".join(lines) + "\n}")
    x = np.linspace(0.1, 0.9, 256, dtype=F)
    kernel = pf.define(source, target="x86").vec.specialize(x)
    llvm = kernel.stages["llvm_opt"]
    assert re.search(r"<(4|8|16) x float>", llvm) and "vector.body" in llvm
    assert not re.findall(r"call \S+ @(?!llvm\.)\w+\((?:float|double)", llvm), "no scalar libm calls"
    assert capfd.readouterr().err == ""


@pytest.mark.unit
def test_wrong_arity_is_a_tc_error_naming_the_builtin():
    with pytest.raises(pf.PolyfuseError, match="'norm4d' takes 4 arguments, got 3"):
        pf.define("def f(float(N) X) -> (Y) { Y(n) = norm4d(X(n), X(n), X(n)) }")


def test_round_is_half_away_from_zero_and_rint_half_to_even_everywhere():
    x = F([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, 8388609.0])
    source = "def r(float(N) X) -> (R, E) { R(n) = round(X(n)) E(n) = rint(X(n)) }"
    for target in ("reference", "x86"):
        rounded, even = pf.define(source, target=target).r(x)
        np.testing.assert_array_equal(rounded, [-3, -2, -1, 1, 2, 3, 0, 8388609], err_msg=target)
        np.testing.assert_array_equal(even, np.rint(x), err_msg=target)


def test_double_arguments_use_libm_or_say_the_algorithm_is_float32_only():
    x = np.array([1.5, 3.0], np.float64)
    got = pf.define("def f(double(N) X) -> (Y) { Y(n) = acosh(X(n)) + fdivide(X(n), 2.0) }",
                    target="x86").f(x)
    np.testing.assert_allclose(got, np.arccosh(x) + x / 2, rtol=1e-15)
    with pytest.raises(pf.PolyfuseError, match="only a float32 implementation"):
        pf.define("def f(double(N) X) -> (Y) { Y(n) = erfinv(X(n)) }", target="x86").f(x)


# --- dot4: int8 dot products ------------------------------------------------------------------

# the dot products' forms: VNNI/BF16 x86, AVX-512 without them, numpy, aarch64, CUDA C
DOT_TARGETS = ["host", "x86:skylake", "reference", AARCH64,
               pytest.param("cuda", marks=pytest.mark.skipif(
                   CXX is None, reason="the emulator needs a C++20 compiler"))]
DOT4 = "def d(int32(M, K) A, int32(K, N) B) -> (C) { C(m, n) +=! dot4(A(m, k), B(k, n)) }"


def _dot4_operands():
    """Words of random bytes (every sign bit and 0, 255, 128 and 127 among them), a row
    count no vector divides, and the sums numpy makes of them as bytes."""
    rng = np.random.default_rng(4)
    a = rng.integers(0, 256, (5, 7, 4), dtype=np.uint8)
    b = rng.integers(0, 256, (7, 40, 4), dtype=np.uint8)
    a[0, 0], b[0, :4] = [0, 255, 128, 127], [[255, 128, 127, 0]] * 4
    want = np.einsum("mkj,knj->mn", a.astype(np.int64), b.view(np.int8).astype(np.int64))
    return a.view(np.int32)[..., 0], b.view(np.int32)[..., 0], want.astype(np.int32)


@pytest.mark.parametrize("target", DOT_TARGETS)
def test_dot4_sums_unsigned_bytes_times_signed_ones(target, request):
    if target == "cuda":
        request.getfixturevalue("emulated")
    a, b, want = _dot4_operands()
    np.testing.assert_array_equal(pf.define(DOT4, target=target).d(a, b), want)


def test_dot4_is_vnni_where_the_host_has_it_and_byte_arithmetic_elsewhere(capfd):
    a, b, _ = _dot4_operands()
    host = pf.define(DOT4, target="host").d.specialize(a, b).stages
    skylake = pf.define(DOT4, target="x86:skylake").d.specialize(a, b).stages
    assert ("vpdpbusd" in host["asm"]) == ("dot4" in native_dots(Target.parse("host")))
    assert "vpdpbusd" not in skylake["asm"] and "polyfuse_dot4" not in skylake["llvm"]
    assert capfd.readouterr().err == ""


def _every_byte_pair():
    """Words whose first bytes meet every unsigned byte with every signed one (the
    other bytes shifted copies of them), a column count no vector divides, and numpy's sums."""
    m, k, n = np.arange(256), np.arange(3), np.arange(259)
    a = (m[:, None, None] + 64 * np.arange(4) + 17 * k[None, :, None]) % 256
    b = (n[None, :, None] + 64 * np.arange(4) + 31 * k[:, None, None]) % 256
    a, b = a.astype(np.uint8), b.astype(np.uint8)
    want = np.einsum("mkj,knj->mn", a.astype(np.int64), b.view(np.int8).astype(np.int64))
    return a.view(np.int32)[..., 0], b.view(np.int32)[..., 0], want.astype(np.int32)


@pytest.mark.unit
def test_sdot_offset_sums_unsigned_bytes_as_signed_ones_plus_128():
    """acc + dot4(a, b) = sdot(acc, a ^ 0x80808080, b) + 128 sdot(0, 0x01010101, b), in
    int32 arithmetic, for every pair of bytes and words of extreme bytes."""
    u, s = np.meshgrid(np.arange(256, dtype=np.uint8), np.arange(256, dtype=np.uint8))
    a = np.stack([u.ravel(), np.roll(u.ravel(), 1), 255 - u.ravel(), u.ravel() ^ 0x80], -1)
    b = np.stack([s.ravel(), np.roll(s.ravel(), 3), 255 - s.ravel(), s.ravel()], -1).view(np.int8)
    acc, b = np.int64(2**31 - 5), b.astype(np.int64)   # sums wrap to int32 alike
    want = acc + np.einsum("wj,wj->w", a.astype(np.int64), b)
    offset = (a ^ 0x80).view(np.int8).astype(np.int64)
    got = acc + np.einsum("wj,wj->w", offset, b) + 128 * np.einsum("wj,wj->w", np.ones_like(b), b)
    np.testing.assert_array_equal(got.astype(np.int32), want.astype(np.int32))


@pytest.mark.parametrize("target, instruction", [("aarch64", None), ("aarch64+dotprod", "sdot"),
                                                 ("aarch64+i8mm", "usdot")])
@needs_arm_tools
def test_dot4_is_sdot_with_dotprod_usdot_with_i8mm_and_bytes_without(target, instruction, capfd):
    a, b, want = _every_byte_pair()
    kernel = pf.define(DOT4, target=target).d
    asm = kernel.specialize(a, b).stages["asm"]
    found = {i for i in ("sdot", "usdot") if re.search(rf"\b{i}\b", asm)}
    assert found == ({instruction} if instruction else set())
    np.testing.assert_array_equal(kernel(a, b), want)
    small_a, small_b, small_want = _dot4_operands()
    np.testing.assert_array_equal(kernel(small_a, small_b), small_want)
    assert capfd.readouterr().err == ""


def test_dot4_round_trips_and_runs_on_the_loop_ir_interpreter():
    a, b, want = _dot4_operands()
    assert_round_trip(DOT4)
    loops = pf.define(DOT4, target="x86").d.specialize(a, b).stages["loops"]
    assert str(parse_kernel(loops)) == loops
    d = parse_definition(DOT4)
    bound = bind_arguments(d, (a, b))
    got = interpret_kernel(schedule_definition(d, bound.sizes, MappingOptions()), bound.values)
    np.testing.assert_array_equal(got["C"], want)


# --- bfdot2: bfloat16 dot products --------------------------------------------------------------

BFDOT2 = "def d(int32(M, K) A, int32(K, N) B) -> (C) { C(m, n) +=! bfdot2(A(m, k), B(k, n)) }"


def _bfdot2_operands(exact):
    """Words of 2 bfloat16 (a row count no vector divides) and their sums in float32 as
    vdpbf16ps makes them: per word, the upper halves' product added first. ``exact``:
    multiples of 1/2 below 8, whose sums every order gets exactly; else normal values."""
    rng = np.random.default_rng(2)
    if exact:
        a, b = rng.integers(-16, 17, (5, 7, 2)) / 2, rng.integers(-16, 17, (7, 40, 2)) / 2
    else:
        a, b = rng.standard_normal((5, 7, 2)) * 3, rng.standard_normal((7, 40, 2)) / 3
    a, b = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
    af, bf = a.astype(F), b.astype(F)
    want = np.zeros((5, 40), F)
    for k in range(7):
        for half in (1, 0):
            want = want + af[:, k, half, None] * bf[None, k, :, half]
    return a.view(np.int32)[..., 0], b.view(np.int32)[..., 0], want


@pytest.mark.parametrize("target", DOT_TARGETS)
def test_bfdot2_sums_products_of_bfloat16_halves_in_float32(target, request):
    if target == "cuda":
        request.getfixturevalue("emulated")
    a, b, want = _bfdot2_operands(exact=True)
    np.testing.assert_array_equal(pf.define(BFDOT2, target=target).d(a, b), want)


@pytest.mark.parametrize("target", ["host", "x86:skylake", AARCH64])
def test_bfdot2_rounds_as_vdpbf16ps_on_every_cpu(target):
    a, b, want = _bfdot2_operands(exact=False)
    np.testing.assert_array_equal(pf.define(BFDOT2, target=target).d(a, b), want)


def test_bfdot2_is_vdpbf16ps_where_the_host_has_it_and_float_arithmetic_elsewhere(capfd):
    a, b, want = _bfdot2_operands(exact=False)
    host = pf.define(BFDOT2, target="host").d.specialize(a, b).stages
    skylake = pf.define(BFDOT2, target="x86:skylake").d.specialize(a, b).stages
    assert ("vdpbf16ps" in host["asm"]) == ("bfdot2" in native_dots(Target.parse("host")))
    assert "vdpbf16ps" not in skylake["asm"] and "polyfuse_bfdot2" not in skylake["llvm"]
    assert capfd.readouterr().err == ""
    # the interpreters add each word's two products before the accumulator: one rounding apart
    np.testing.assert_allclose(pf.define(BFDOT2, target="reference").d(a, b), want, rtol=1e-5,
                               atol=1e-5)
    assert_round_trip(BFDOT2)
    loops = pf.define(BFDOT2, target="x86").d.specialize(a, b).stages["loops"]
    assert str(parse_kernel(loops)) == loops


@pytest.mark.unit
@pytest.mark.parametrize("fn", ["dot4", "bfdot2"])
def test_a_word_builtin_refuses_float_arguments_at_their_line_and_column(fn):
    """A float converted to an int32 word would be read as packed bytes or bfloat16
    halves: the front end names the builtin and the argument's type instead."""
    with pytest.raises(pf.TCSemanticError, match=rf"1:35: error: '{fn}' reads int32 words.*float32"):
        parse_definition(f"def f(float(N) A) -> (B) {{ B(i) = {fn}(A(i), A(i)) }}")
