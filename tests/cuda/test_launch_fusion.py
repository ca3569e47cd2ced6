"""Consecutive launches over the same blocks run as one (scheduler/gpu_launches.py) where
each block of the second touches only its own box of what the first wrote: a split-k
sum and its bias and activation, elementwise statements a fusion-less schedule puts
in nests of their own. A read of another block's data (a row reversed, a transpose)
keeps its launch. Checked on the launch count, against numpy on the GPU IR interpreter
and as CUDA C on the emulator."""

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.ir.gpu_interpreter import interpret_gpu_kernel
from polyfuse.runtime.arguments import bind_arguments
from polyfuse.scheduler.gpu_heuristics import default_gpu_options
from polyfuse.scheduler.gpu_mapping import DeviceLimits
from polyfuse.scheduler.model import zero_filled_outputs
from polyfuse.scheduler.options import Fusion, MappingOptions
from polyfuse.scheduler.pipeline import schedule_gpu_definition
from tests.cuda.test_emulated import emulated  # noqa: F401  (the fixture)
from tests.targets.test_x86 import as_tuple, assert_close

f32 = np.float32
APART = MappingOptions(fusion=Fusion.MIN, tile_sizes=(32, 32), block=(32,))   # each statement its own nest

CASES = {
    # name: source, inputs, numpy, launches, options
    "pointwise-chain": ("""def f(float(N) X) -> (Y, Z) {
        Y(i) = X(i) * 2.0
        Z(i) = Y(i) + 1.0
    }""", lambda r: (r.standard_normal(100).astype(f32),), lambda x: (x * 2, x * 2 + 1), 1, APART),
    "reversed": ("""def f(float(N) X) -> (Y, Z) {
        Y(i) = X(i) * 2.0
        Z(i) = Y(N - 1 - i) + 1.0
    }""", lambda r: (r.standard_normal(100).astype(f32),), lambda x: (x * 2, x[::-1] * 2 + 1), 2, APART),
    "transposed": ("""def f(float(N,N) X) -> (Y, Z) {
        Y(i,j) = X(i,j) * 2.0
        Z(i,j) = Y(j,i) + 1.0
    }""", lambda r: (r.standard_normal((70, 70)).astype(f32),), lambda x: (x * 2, x.T * 2 + 1), 2, APART),
    "rows-then-columns": ("""def f(float(N,N) X) -> (Y, Z) {
        Y(i,j) = X(i,j) * 2.0
        Z(i,j) = Y(i,j) - Y(i,0)
    }""", lambda r: (r.standard_normal((70, 70)).astype(f32),), lambda x: (x * 2, x * 2 - x[:, :1] * 2), 2,
        APART),
    # a split-k contraction: slices, then their sum with the bias and activation in one launch
    "split-k-epilogue": ("""def fc(float(B,M) I, float(N,M) W, float(N) b) -> (O) {
        O(i,n) +=! I(i,m) * W(n,m)
        O(i,n) = fmax(O(i,n) + b(n), 0.0)
    }""", lambda r: (r.uniform(-1, 1, (40, 128)).astype(f32), r.uniform(-1, 1, (70, 128)).astype(f32),
                     r.uniform(-1, 1, 70).astype(f32)),
        lambda i, w, b: (np.maximum(i.astype(np.float64) @ w.T.astype(np.float64) + b, 0).astype(f32),), 2, "split"),
}


def _options(name, d):
    """The case's options; "split": the heuristic's for a 128 x 256 product 4096 deep
    (register tiles, 4 slices), which fit these smaller sizes too."""
    options = CASES[name][4]
    if options == "split":
        options = default_gpu_options(d, {"B": 128, "M": 4096, "N": 256})
        assert options.split_k == 4
    return options


def _kernel(name):
    source, make, oracle, launches, options = CASES[name]
    args = make(np.random.default_rng(3))
    d = next(iter(pf.define(source)._kernels.values())).definition
    bound = bind_arguments(d, args)
    return schedule_gpu_definition(d, bound.sizes, _options(name, d), DeviceLimits()), bound, d, args


@pytest.mark.unit
def test_the_split_k_sum_takes_its_epilogue():
    kernel, _, _, _ = _kernel("split-k-epilogue")
    slices, rest = kernel.launches
    assert "O_parts(" in str(slices) and "O_parts(" in str(rest) and "fmax" in str(rest)
    # the sum's threads write what the same threads read back (no barrier between them);
    # the bias comes through shared memory, a barrier after its copy
    text = str(rest)
    total, epilogue = text[:text.index("copy")], text[text.index("copy"):]
    assert "barrier" not in total and epilogue.index("barrier") < epilogue.index("fmax")


@pytest.mark.parametrize("name", CASES)
def test_fused_launches_match_numpy_thread_by_thread(name):
    kernel, bound, d, args = _kernel(name)
    assert len(kernel.launches) == CASES[name][3]
    got = interpret_gpu_kernel(kernel, dict(bound.values), zero_filled_outputs(d, bound.sizes), seed=4)
    for t, want in zip(d.outputs, CASES[name][2](*args)):
        assert_close(got[t.name], want, f"{name} {t.name}")


@pytest.mark.parametrize("name", CASES)
def test_fused_launches_in_cuda_c_match_numpy(name, emulated):  # noqa: F811
    source, make, oracle, launches, options = CASES[name]
    args = make(np.random.default_rng(3))
    d = next(iter(pf.define(source)._kernels.values())).definition
    kernel = next(iter(pf.define(source, target="cuda", options=_options(name, d))._kernels.values()))
    got = as_tuple(kernel(*args))
    assert len(emulated.launches) == launches
    for k, (g, w) in enumerate(zip(got, oracle(*args))):
        assert_close(g, w, f"{name} output {k}")
