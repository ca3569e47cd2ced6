"""No native run reads or writes outside a tensor: accesses range inference leaves
unproven are refused for the sizes of a call (AccessRangeError, before any code runs) or
checked when they run (BoundsError), on every target, against numpy oracles."""

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.frontends.loop_ir import parse_kernel
from tests.arm_tools import AARCH64
from tests.cuda.test_emulated import emulated  # noqa: F401  (fixture)

TARGETS = ["reference", "host", AARCH64, "cuda"]


def _kernel(source: str, target: str, request) -> pf.Kernel:
    if target == "cuda":
        request.getfixturevalue("emulated")  # the CUDA C runs on the CPU emulator
    return list(pf.define(source, target=target))[0]


def _rand(*shape):
    return np.random.default_rng(sum(shape)).uniform(-1, 1, shape).astype(np.float32)


# Each case: TC source, inputs in bounds and the numpy oracle, inputs whose sizes make an
# access reach outside, and what the refusal names (tensor, dimension).
REFUSED = {
    # the middle index of X is never solved for: its range comes from the other two
    "derived_size": (
        "def derived(float(P, PQ, Q) X) -> (O) { O(a, b) = X(a, a + b, b) }",
        lambda: (_rand(4, 7, 4),),
        lambda X: np.array([[X[a, a + b, b] for b in range(4)] for a in range(4)], np.float32),
        lambda: (_rand(6, 1, 6),), ("'X'", "dimension 1")),
    "derived_reduction": (
        "def tcc(float(P, PQ, Q) X) -> (S) { S(a) +=! X(a, a + b, b) }",
        lambda: (_rand(3, 5, 3),),
        lambda X: np.array([sum(X[a, a + b, b] for b in range(3)) for a in range(3)], np.float32),
        lambda: (_rand(3, 2, 3),), ("'X'", "dimension 1")),
    "strided_sum_index": (
        "def tcd(float(A, B, C, D, E) X) -> (S) { S(a) +=! X(a, b, a, c, 2 * a + b) }",
        lambda: (_rand(3, 2, 3, 2, 6),),
        lambda X: np.array([sum(X[a, b, a, c, 2 * a + b] for b in range(2) for c in range(2))
                            for a in range(3)], np.float32),
        lambda: (_rand(3, 4, 3, 2, 5),), ("'X'", "dimension 4")),
    "shifted_pairs": (
        "def tce(float(A, B, C, D, E) X) -> (S) { S(a) +=! X(b, b + 1, a, a + 3, 2 * a + b) }",
        lambda: (_rand(2, 3, 3, 6, 6),),
        lambda X: np.array([sum(X[b, b + 1, a, a + 3, 2 * a + b] for b in range(2))
                            for a in range(3)], np.float32),
        lambda: (_rand(2, 3, 3, 6, 5),), ("'X'", "dimension 4")),
    # a where clause gives a reduction index the range of another tensor (a gated layer
    # whose channel counts disagree)
    "where_from_another_tensor": (
        """def gate(float(B, H) Z, float(C, C) W) -> (G, R) {
             G(b, h) = tanh(Z(b, h)) * Z(b, h + 4)
             R(b, c) +=! W(c, r) * G(b, r) where r in 0:C
           }""",
        lambda: (_rand(2, 7), _rand(3, 3)),
        lambda Z, W: (np.tanh(Z[:, :3]) * Z[:, 4:],
                      (np.tanh(Z[:, :3]) * Z[:, 4:]).astype(np.float64) @ W.T.astype(np.float64)),
        lambda: (_rand(2, 7), _rand(4, 4)), ("'G'", "dimension 1")),
    "write_past_the_output": (
        "def f(float(N) X) -> (O) { O(i) = X(i)\n O(i) = 1.0 where i in 0:N+1 }",
        lambda: (_rand(1),), None,
        lambda: (_rand(3),), ("writes 'O'", "dimension 0")),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", REFUSED)
def test_access_outside_a_tensor_is_refused_before_running(case, target, request):
    source, good, oracle, bad, names = REFUSED[case]
    kernel = _kernel(source, target, request)
    if oracle is not None:
        args = good()
        got = kernel(*args)
        want = oracle(*args)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            np.testing.assert_allclose(g, np.asarray(w, np.float32), rtol=1e-5, atol=1e-6)
    with pytest.raises(pf.AccessRangeError) as err:
        kernel(*bad())
    message = str(err.value)
    for name in names:
        assert name in message
    assert "out of bounds" in message and "^" in message  # points at the access in the source
    assert isinstance(err.value, pf.BoundsError) and isinstance(err.value, pf.RangeInferenceError)


@pytest.mark.unit
def test_the_refusal_names_the_index_range_and_an_instance():
    kernel = pf.define("def f(float(N, NM, M) I) -> (O) { O(i, j) = I(i, i + j, j) }",
                       target="host").f
    with pytest.raises(pf.AccessRangeError) as err:
        kernel.specialize(np.zeros((3000, 1, 3000), np.float32))  # a segfault, unchecked
    message = str(err.value)
    assert "for N=3000, NM=1, M=3000" in message
    assert "dimension 1 runs over 0:5999 but the dimension has size 1" in message
    assert "<tc>:1:45:" in message  # line:col of the read I(i, i + j, j)


@pytest.mark.parametrize("target", TARGETS)
def test_reads_under_a_data_dependent_condition_are_checked_when_they_run(target, request):
    kernel = _kernel("def h(float(N) X, float(N) C) -> (O) "
                     "{ O(i) = C(i) > 0.0 ? X(i + 2) : -1.0 where i in 0:N }", target, request)
    X = np.arange(5, dtype=np.float32)
    C = np.array([1, 0, 1, 0, 0], np.float32)
    np.testing.assert_array_equal(kernel(X, C), np.where(C > 0, np.append(X, [0, 0])[2:], -1))
    with pytest.raises(pf.BoundsError) as err:
        kernel(X, np.array([1, 1, 1, 1, 0], np.float32))  # X(5) would be read at i=3
    assert not isinstance(err.value, pf.AccessRangeError)


@pytest.mark.parametrize("target", TARGETS)
def test_an_index_with_a_scalar_parameter_is_checked_when_it_runs(target, request):
    kernel = _kernel("def s(float(N) X, int32 k) -> (O) { O(i) = X(i + k) where i in 0:N - 2 }",
                     target, request)
    X = np.arange(6, dtype=np.float32)
    for k in (0, 1, 2):
        np.testing.assert_array_equal(kernel(X, k), X[k:k + 4])
    for k in (3, -1):
        with pytest.raises(pf.BoundsError):
            kernel(X, k)


@pytest.mark.parametrize("target", TARGETS)
def test_a_product_of_indices_is_proven_or_checked(target, request):
    kernel = _kernel("def p(float(N) X) -> (O) { O(i, j) = X(i * j) where i in 0:N, j in 0:M }"
                     .replace("0:M", "0:2"), target, request)
    X = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(kernel(X), np.outer(np.arange(5), np.arange(2)).astype(np.float32))
    wide = _kernel("def q(float(N) X) -> (O) { O(i, j) = X(i * j) where i in 0:N, j in 0:3 }",
                   target, request)
    with pytest.raises(pf.BoundsError):
        wide(X)  # X(8) at i=4, j=2: not provable by isl, caught when it runs


GUARDED = [
    ("def g(float(N) X) -> (O) { O(i) = i >= 1 ? X(i - 1) : 0.0 where i in 0:N }",
     lambda X: np.concatenate([[0], X[:-1]])),
    ("def pad(float(N) X) -> (O) { O(i) +=! (i + k - 1 >= 0 && i + k - 1 < N) ? X(i + k - 1) : 0.0 "
     "where i in 0:N, k in 0:3 }",
     lambda X: np.convolve(X, np.ones(3), mode="same")),
    ("def sel(float(N) X) -> (O) { O(i) = !(i < N - 1) ? 5.0 : X(i + 1) where i in 0:N }",
     lambda X: np.append(X[1:], 5)),
]


@pytest.mark.parametrize("source,oracle", GUARDED)
def test_reads_guarded_by_affine_conditions_are_proven_and_not_checked(source, oracle):
    kernel = list(pf.define(source, target="host"))[0]
    X = np.arange(1, 7, dtype=np.float32)
    np.testing.assert_allclose(kernel(X), oracle(X).astype(np.float32))
    loops = kernel.specialize(X).stages["loops"]
    assert "checked(" not in loops and "polyfuse_error" not in loops


def test_checked_reads_print_and_parse_back_in_loop_ir():
    kernel = pf.define("def h(float(N) X, float(N) C) -> (O) "
                       "{ O(i) = C(i) > 0.0 ? X(i + 2) : 0.0 where i in 0:N }", target="host").h
    text = kernel.specialize(np.zeros(5, np.float32), np.zeros(5, np.float32)).stages["loops"]
    assert "X(checked(c0 + 2))" in text and "polyfuse_error" in text
    assert str(parse_kernel(text)) == text


def test_the_loop_interpreter_flags_checked_reads_like_the_targets():
    from polyfuse.ir.loops_interpreter import interpret_kernel
    text = pf.define("def h(float(N) X, float(N) C) -> (O) "
                     "{ O(i) = C(i) > 0.0 ? X(i + 2) : 0.0 where i in 0:N }", target="host").h \
        .specialize(np.zeros(5, np.float32), np.zeros(5, np.float32)).stages["loops"]
    X = np.arange(5, dtype=np.float32)
    good = interpret_kernel(parse_kernel(text), {"X": X, "C": np.array([1, 1, 1, 0, 0], np.float32)})
    assert good["polyfuse_error"][0] == 0
    np.testing.assert_array_equal(good["O"], [2, 3, 4, 0, 0])
    bad = interpret_kernel(parse_kernel(text), {"X": X, "C": np.ones(5, np.float32)})
    assert bad["polyfuse_error"][0] == 1


PROPERTY_RUNS = [("host", 60), pytest.param("aarch64", 12, marks=AARCH64.marks), ("cuda", 12)]


@pytest.mark.parametrize("target,examples", PROPERTY_RUNS)
def test_random_accesses_match_the_interpreter_or_raise_never_a_signal(target, examples, tmp_path):
    """tests/scheduler/bounds_property.py in a child process: a signal fails this test."""
    if target == "cuda":
        from tests.cuda.emulator import CXX
        if CXX is None:
            pytest.skip("the CUDA emulator needs a C++20 compiler")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "POLYFUSE_PROPERTY_TARGET": target,
           "POLYFUSE_PROPERTY_EXAMPLES": str(examples)}
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         str(root / "tests/scheduler/bounds_property.py")],
        cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert child.returncode >= 0, f"killed by signal {-child.returncode} running:\n{child.stderr[-2000:]}"
    assert child.returncode == 0, child.stdout[-4000:]
    assert " passed" in child.stdout


SIGNATURE_CASES = [source for source, *_ in REFUSED.values()] + [source for source, _ in GUARDED] + [
    "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
    "def shift(float(N) X, float(S) Y) -> (O) { O(i) = X(i + S) + Y(S - 1) where i in 0:N - S }",
    "def win(float(N) X) -> (O) { O(i) +=! X(i + k) where i in 0:N - 2, k in 0:3 }",
    "def rev(float(N) X) -> (O) { O(i) = X(N - 1 - i) }",
    "def tail(float(N, D) X) -> (O) { O(i, d) = X(max(i, 1) - 1, d) where i in 0:N }",
    "def half(float(N) X) -> (O) { O(i) = X(2 * i) where i in 0:N }",
    "def gather(float(N) X, int32(M) I) -> (O) { O(m) = X(I(m)) }",
    "def part(float(N) X, float(M) Y) -> (float(N) O) { O(i) = X(i) + Y(0) where i in 0:M }",
    "def wrap(float(C, N) X) -> (O) { O(n) = X(0 < 0 ? 0 + 12 : 0, n) }",
    "def wrap2(float(C, N) X) -> (O) { O(n) = X(0 < 1 ? C - 1 : 0, n) }",
]


@pytest.mark.unit
@pytest.mark.parametrize("source", SIGNATURE_CASES)
def test_sizes_that_meet_the_conditions_have_the_signature_that_checking_gives(source):
    """Issue 36: a symbolic kernel bound at a new size skips the access checks where the
    :func:`in_bounds` conditions hold; its signature must be what checking gives, at
    every size, and sizes that are refused must not meet the conditions."""
    from polyfuse.ir.symbolic import evaluate_int
    from polyfuse.scheduler.bounds import in_bounds
    from polyfuse.scheduler.pipeline import SymbolicSignatures, symbolic_signature

    d = list(pf.define(source, target="reference"))[0].definition
    names = sorted(d.sizes)
    symbolic = frozenset(names)
    signatures = SymbolicSignatures(d, symbolic)
    met = 0
    for values in itertools.product(*([range(1, 6)] * len(names))):
        sizes = dict(zip(names, values))
        if any(evaluate_int(e, sizes) < 0 for t in d.outputs for e in t.shape):
            continue
        conditions = in_bounds(d, sizes, symbolic)
        holds = conditions is not None and all(
            f.get("", 0) + sum(c * sizes[n] for n, c in f.items() if n) >= 0 for f in conditions)
        met += holds
        try:
            want = symbolic_signature(d, sizes, symbolic)
        except pf.AccessRangeError:
            assert not holds, sizes
            continue
        assert signatures(sizes) == want, sizes
    if source.startswith(("def mm", "def part", "def wrap", "def shift", "def win", "def rev", "def tail", "def half", "def gather")):
        assert met > 0   # the fast path serves these
