"""Epilogues in the register tile's stores (scheduler/gpu_epilogues.py): a contraction's
pointwise consumers (bias, activation, residual) run on the accumulators in the tile's
launch instead of a launch of their own each. Results against numpy thread by thread
(GPU-IR interpreter) at sizes no tile divides, and as CUDA C on the emulator."""

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.ir.gpu_interpreter import interpret_gpu_kernel
from polyfuse.scheduler.model import zero_filled_outputs
from tests.cuda.test_emulated import emulated  # noqa: F401  (a fixture)
from tests.cuda.test_register_tiles import SMALL, _inputs, _schedule
from tests.tc_programs import PROGRAMS_BY_NAME

RESIDUAL = """def fc_res(float(M,K) A, float(N,K) W, float(M,N) R) -> (T, Y) {
    T(m,n) +=! A(m,k) * W(n,k)
    Y(m,n) = fmax(T(m,n) + R(m,n), 0.0)
}"""
NOT_POINTWISE = """def shifted(float(M,K) A, float(N,K) W) -> (T, Y) {
    T(m,n) +=! A(m,k) * W(n,k)
    Y(m,n) = T(m,n) + T(m,0)
}"""
TRANSPOSED = """def transposed(float(M,K) A, float(N,K) W) -> (T, Y) {
    T(m,n) +=! A(m,k) * W(n,k)
    Y(n,m) = T(m,n) * 2.0
}"""


def _run(source, shapes, options=None):
    kernel, d = _schedule(source, shapes, options)
    args = _inputs(shapes)
    sizes = {s.name: n for t, shape in zip(d.inputs, shapes) for s, n in zip(t.shape, shape) if hasattr(s, "name")}
    got = interpret_gpu_kernel(kernel, {t.name: a for t, a in zip(d.inputs, args)},
                               zero_filled_outputs(d, sizes), seed=4)
    return kernel, args, [got[t.name] for t in d.outputs]


@pytest.mark.unit
@pytest.mark.parametrize("options, shapes", [(None, [(34, 8), (33, 8), (33,)]),
                                             (SMALL, [(19, 21), (13, 21), (13,)])],
                         ids=["heuristic", "small-tiles"])
def test_bias_and_relu_run_in_the_tiles_stores(options, shapes):
    program = PROGRAMS_BY_NAME["fc_bias_relu"]
    kernel, args, (got,) = _run(program.source, shapes, options)
    assert len(kernel.launches) == 1
    assert "fmax(acc1(" in str(kernel)
    np.testing.assert_allclose(got, program.oracle(*args)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.unit
def test_a_new_output_is_stored_beside_the_product():
    shapes = [(19, 21), (13, 21), (19, 13)]
    kernel, (a, w, r), (t, y) = _run(RESIDUAL, shapes, SMALL)
    assert len(kernel.launches) == 1
    want = a.astype(np.float64) @ w.T
    np.testing.assert_allclose(t, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y, np.maximum(want + r, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.unit
@pytest.mark.parametrize("source, oracle", [
    (NOT_POINTWISE, lambda t: t + t[:, :1]),   # reads T at another element
    (TRANSPOSED, lambda t: 2 * t.T),           # writes elsewhere than it reads
], ids=["not-pointwise", "transposed"])
def test_a_consumer_that_is_not_pointwise_keeps_its_launch(source, oracle):
    shapes = [(19, 21), (13, 21)]
    kernel, (a, w), (t, y) = _run(source, shapes, SMALL)
    assert len(kernel.launches) == 2
    want = a.astype(np.float64) @ w.T
    np.testing.assert_allclose(t, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y, oracle(want), rtol=1e-4, atol=1e-4)


def test_three_layers_of_fc_and_relu_run_in_three_launches(emulated):  # noqa: F811
    program = PROGRAMS_BY_NAME["mlp3"]
    rng = np.random.default_rng(5)
    shapes = [(70, 40), (50, 40), (50,), (45, 50), (45,), (36, 45), (36,)]
    args = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    kernel = getattr(pf.define(program.source, target="cuda"), program.entry)
    got = kernel(*args)
    for g, w in zip(got, program.oracle(*args)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    assert len(emulated.launches) == 3
