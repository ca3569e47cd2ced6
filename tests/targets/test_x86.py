"""Native x86 kernels against the reference interpreter."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import polyfuse as pf
from polyfuse.scheduler.options import Fusion, MappingOptions
from tests.tc_programs import PROGRAMS
from tests.tc_random import programs

OPTIONS = {
    "default": None,
    "tiled-odd-unroll8": MappingOptions(tile_sizes=(3, 5, 2), vector_width=8, unroll=8),
    "min-fusion-unroll1": MappingOptions(fusion=Fusion.MIN, unroll=1),
    "preserve-1-thread": MappingOptions(fusion=Fusion.PRESERVE, tile_sizes=(4, 4), num_threads=1),
    "2-threads-vector16": MappingOptions(num_threads=2, vector_width=16, unroll=2),
    "micro-kernel-intra-min": MappingOptions(tile_sizes=(4, 8, 4), register_tile=(2, 8, 0),
                                             point_order=(2, 0, 1), unroll_jam=2, vector_width=8,
                                             reorder_reductions=True, fusion=Fusion.MIN,
                                             intra_tile_fusion=Fusion.MIN),
}


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def assert_close(got, want, name):
    assert got.dtype == want.dtype and got.shape == want.shape, name
    low = want.dtype.itemsize <= 2 and want.dtype.kind == "f" or str(want.dtype) == "bfloat16"
    rtol, atol = (1e-2, 1e-2) if low else (1e-4, 1e-5)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                               atol=atol, equal_nan=True, err_msg=name)


@pytest.mark.parametrize("opt", OPTIONS, ids=list(OPTIONS))
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_canonical_program_on_x86(program, opt):
    args = program.make_inputs(np.random.default_rng(0))
    want = as_tuple(getattr(pf.define(program.source), program.entry)(*args))
    mod = pf.define(program.source, target="x86", options=OPTIONS[opt])
    got = as_tuple(getattr(mod, program.entry)(*args))
    for k, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, f"{program.name} output {k}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_comprehensions_on_x86(source):
    try:
        ref = pf.define(source)
    except pf.TCSemanticError:
        return
    d = next(iter(ref)).definition
    rng = np.random.default_rng(2)
    extent = {"N": 3, "M": 4, "K": 5}
    args = [(rng.uniform(0.5, 2.0, [extent[s.name] for s in t.shape]) * 2).astype(t.dtype.numpy)
            for t in d.inputs]
    want = as_tuple(ref.f(*args))
    got = as_tuple(pf.define(source, target="x86").f(*args))
    for k, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, f"output {k} of\n{source}")


def test_bad_indirect_index_raises_before_returning():
    mod = pf.define("def emb(float(V, D) E, int32(B) Idx) -> (O) { O(b, d) = E(Idx(b), d) }",
                    target="x86")
    table = np.arange(8, dtype=np.float32).reshape(4, 2)
    np.testing.assert_array_equal(mod.emb(table, np.array([3, 0], np.int32)), table[[3, 0]])
    for bad in (-1, 4, 1 << 20):
        with pytest.raises(pf.BoundsError, match="index tensor"):
            mod.emb(table, np.array([0, bad], np.int32))


def test_stages_hold_every_level():
    mod = pf.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
                    target="x86")
    a = np.ones((128, 64), np.float32)
    k = mod.mm.specialize(a, a.T.copy())
    for stage in ("source", "comprehension", "specialized", "options", "schedule", "loops",
                  "llvm", "llvm_opt", "asm"):
        assert k.stages[stage].strip(), stage
    assert "parallel for" in k.stages["loops"]
    assert "polyfuse_parallel_for_threads" in k.stages["llvm"]
    np.testing.assert_array_equal(k(a, a.T.copy()), np.full((128, 128), 64, np.float32))


def test_requested_vector_width_reaches_the_machine_code():
    src = "def f(float(N) X) -> (Y) { Y(i) = X(i) * 2.0 + 1.0 }"
    x = np.arange(1000, dtype=np.float32)
    k = pf.define(src, target="x86", options=MappingOptions(vector_width=8, parallel=0)).f.specialize(x)
    assert "<8 x float>" in k.stages["llvm_opt"]
    np.testing.assert_array_equal(k(x), x * 2 + 1)


@pytest.mark.parametrize("n", [49, 144, 200, 16])
def test_vector_loops_end_in_whole_or_masked_vectors(n):
    """The interleave count divides the number of whole vectors (144 = 9 vectors: not
    interleaved by 2, which would leave the last vector to a scalar loop); a trip count
    that is not whole vectors ends in a masked vector on AVX-512 hosts."""
    from polyfuse.targets.cpu import vector_bits
    from polyfuse.targets.llvm_kernel import _fit_to_trip_count
    from polyfuse.ir.comprehension import Literal
    from polyfuse.ir.loops import For
    from polyfuse.ir.types import DType
    loop = For("c", Literal(0, DType.INT64), Literal(n, DType.INT64), (), vector=16, unroll=2)
    fitted = _fit_to_trip_count(loop)
    assert (fitted.vector, fitted.unroll) == {49: (16, 2), 144: (16, 1), 200: (16, 2), 16: (16, 1)}[n]
    # a register block's row of 24: three half vectors in one pass, none masked
    short = _fit_to_trip_count(For("c", Literal(0, DType.INT64), Literal(24, DType.INT64), (), vector=16, unroll=4))
    assert (short.vector, short.unroll) == (8, 3)
    src = "def f(float(H, C) X, float(C) B) -> (Y) { Y(h, c) = exp(X(h, c) + B(c)) }"
    x = np.random.default_rng(n).standard_normal((5, n)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    k = pf.define(src, target="host", options=MappingOptions(vector_width=16, unroll=2, parallel=0)).f
    spec = k.specialize(x, b)
    masked = "llvm.loop.vectorize.predicate.enable" in spec.stages["llvm"]
    assert masked == (n % 16 != 0 and vector_bits(spec.target) == 512)
    np.testing.assert_allclose(k(x, b), np.exp(x + b), rtol=2e-6)


def test_vector_loops_of_symbolic_trips_end_in_a_masked_vector():
    """A kernel for symbolic sizes does not know its rows' length: on AVX-512 hosts its
    vector loops over them fold the last, partial vector under a mask (a scalar loop of
    up to 15 exps otherwise), at every length; a specialized kernel's whole vectors stay
    unmasked."""
    from polyfuse.targets.cpu import vector_bits
    src = "def f(float(H, C) X, float(C) B) -> (Y) { Y(h, c) = exp(X(h, c) + B(c)) }"
    k = pf.define(src, target="host", sizes="symbolic").f
    rng = np.random.default_rng(3)
    for n in (77, 16, 5, 130):
        x = rng.standard_normal((3, n)).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        np.testing.assert_allclose(k(x, b), np.exp(x + b), rtol=2e-6)
    spec = k.specialize(x, b)
    assert ("llvm.loop.vectorize.predicate.enable" in spec.stages["llvm"]) == (vector_bits(spec.target) == 512)
    whole = pf.define(src, target="host").f.specialize(np.ones((3, 64), np.float32), np.ones(64, np.float32))
    assert "llvm.loop.vectorize.predicate.enable" not in whole.stages["llvm"]


def test_vector_loops_of_constant_trips_run_whole_vectors_then_one_masked():
    """On AVX-512, a vector loop of a constant count that whole vectors do not make (100
    columns of a register block) runs its whole vectors unmasked, interleaved, then its
    last, partial vector under a mask: two vector loops, one masked, not a loop that
    masks every vector."""
    import re
    from polyfuse.targets.cpu import vector_bits
    src = "def f(float(H, C) X, float(C) B) -> (Y) { Y(h, c) = exp(X(h, c) + B(c)) }"
    k = pf.define(src, target="host", options=MappingOptions(vector_width=16, unroll=2, parallel=0)).f
    rng = np.random.default_rng(4)
    x, b = rng.standard_normal((5, 100)).astype(np.float32), rng.standard_normal(100).astype(np.float32)
    np.testing.assert_allclose(k(x, b), np.exp(x + b), rtol=2e-6)
    spec = k.specialize(x, b)
    if vector_bits(spec.target) != 512:
        pytest.skip("masked vectors: AVX-512 only")
    llvm = spec.stages["llvm"]
    nodes = dict(re.findall(r"^(!\d+) = (.*)$", llvm, re.M))
    vector = [n for n, text in nodes.items() if "distinct" in text
              and any('"llvm.loop.vectorize.enable"' in nodes.get(m, "") for m in re.findall(r"!\d+", text))]
    masked = [n for n in vector if any("predicate.enable" in nodes.get(m, "") for m in re.findall(r"!\d+", nodes[n]))]
    assert len(vector) == 2 and len(masked) == 1, llvm[-2000:]
