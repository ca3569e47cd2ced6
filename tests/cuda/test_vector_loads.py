"""Vector accesses in thread loops (issue 37's vector widths): a thread loop along x with
``vector`` w > 1 gives each thread groups of w consecutive iterations, so a row
reduction's thread reads four neighbouring float32 as one 128-bit word (LDG.E.128)
where a word is aligned, one element at a time where not, and the iterations past the
last group one per thread. Checked against numpy on the GPU IR interpreter (thread by
thread) and as CUDA C on the emulator, at row lengths that divide no vector and at
misaligned buffers, and in the SASS."""

import itertools

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.errors import IRVerificationError
from polyfuse.ir.comprehension import IndexVar, Literal, Read
from polyfuse.ir.gpu import (Barrier, BlockLoops, GpuKernel, Launch, LoopRange, ThreadFor, verify_gpu_kernel,
                             walk_gpu)
from polyfuse.ir.gpu_interpreter import interpret_gpu_kernel, thread_iterations
from polyfuse.ir.loops import Buffer, BufferRole, Store
from polyfuse.ir.types import DType
from polyfuse.runtime.arguments import bind_arguments
from polyfuse.scheduler.gpu_barriers import place_barriers
from polyfuse.scheduler.gpu_heuristics import default_gpu_options
from polyfuse.scheduler.gpu_mapping import DeviceLimits
from polyfuse.scheduler.model import zero_filled_outputs
from polyfuse.scheduler.options import Fusion, MappingOptions
from polyfuse.scheduler.pipeline import schedule_gpu_definition
from polyfuse.targets.cuda_sass import Mix, instruction_mix
from tests.cuda.test_emulated import emulated  # noqa: F401  (the fixture)
from tests.cuda.test_sass import ROW_PIPELINES, needs_nvdisasm
from tests.targets.test_x86 import as_tuple, assert_close

f32 = np.float32


def _lit(v):
    return Literal(v, DType.INT64)


@pytest.mark.unit
@pytest.mark.parametrize("lo, hi, w, threads", [(0, 1024, 4, 256), (0, 1023, 4, 256), (3, 40, 4, 3),
                                                (5, 5, 2, 4), (0, 7, 8, 2), (2, 100, 2, 7), (10, 4, 4, 2)])
def test_the_threads_take_every_iteration_once(lo, hi, w, threads):
    loop = ThreadFor("c", _lit(lo), _lit(hi), 0, (), vector=w)
    runs = [list(thread_iterations(loop, lo, hi, t, threads)) for t in range(threads)]
    assert sorted(itertools.chain(*runs)) == list(range(lo, hi))
    full = lo + max(0, hi - lo) // w * w
    for t, run in enumerate(runs):   # whole groups of w from lo + w t, then one of the rest
        groups = [v for v in run if v < full]
        assert len(groups) % w == 0 and all(g[0] % w == lo % w and g == list(range(g[0], g[0] + w))
                                            for g in (groups[k:k + w] for k in range(0, len(groups), w)))
        assert [v for v in run if v >= full] == list(range(full + t, hi, threads))


@pytest.mark.unit
@pytest.mark.parametrize("vector, step, axis", [(3, 1, 0), (4, 2, 0), (4, 1, 1)])
def test_a_vector_is_a_power_of_two_along_x_by_steps_of_one(vector, step, axis):
    loop = ThreadFor("c", _lit(0), _lit(64), axis, (), step, vector=vector)
    kernel = GpuKernel("k", (), (), (Launch("k_0", (loop,), 1, (32, 2, 1)),))
    with pytest.raises(IRVerificationError, match="power of two on a loop of step 1 along x"):
        verify_gpu_kernel(kernel)


def _copies(first: int, second: int) -> GpuKernel:
    """Y(r, c) = X(r, c), then Z(r, c) = Y(r, c), by thread loops of the given vectors."""
    r, c = IndexVar("r"), IndexVar("c")
    at = (r, c)
    one = ThreadFor("c", _lit(0), _lit(70), 0, (Store("Y", at, Read("X", at, DType.FLOAT32)),), vector=first)
    two = ThreadFor("c", _lit(0), _lit(70), 0, (Store("Z", at, Read("Y", at, DType.FLOAT32)),), vector=second)
    buffers = tuple(Buffer(n, DType.FLOAT32, (3, 70), role) for n, role in
                    (("X", BufferRole.IN), ("Y", BufferRole.OUT), ("Z", BufferRole.OUT)))
    body = (BlockLoops((LoopRange("r", 0, 1, 3),), (one, two)),)
    return GpuKernel("copies", buffers, (), (Launch("copies_0", body, 3, (16, 1, 1)),))


@pytest.mark.unit
@pytest.mark.parametrize("first, second, barrier", [(4, 4, False), (1, 1, False), (4, 1, True), (2, 4, True)])
def test_a_barrier_stands_where_vectors_hand_elements_to_other_threads(first, second, barrier):
    """The same vector over the same range: each thread reads back what it wrote; another
    vector gives the element to another thread, which must wait for it."""
    placed = place_barriers(_copies(first, second))
    assert any(isinstance(s, Barrier) for s in walk_gpu(placed.launches[0].body)) is barrier
    x = np.random.default_rng(0).standard_normal((3, 70)).astype(f32)
    got = interpret_gpu_kernel(placed, {"X": x}, set())
    assert_close(got["Z"], x, "copied twice")


SOFTMAX = ROW_PIPELINES["softmax"]
LAYERNORM = ROW_PIPELINES["layernorm"]
# vector loops whose bodies read across (a gather of columns, a row reversed)
SHUFFLE = """def shuffle(float(N,D) X, int32(D) P) -> (Y, T) {
    Y(n,d) = X(n, P(d)) * 2.0
    T(n,d) = X(n, D - 1 - d) + X(n,d)
}"""


def _rows(vector: int, threads: int) -> MappingOptions:
    return MappingOptions(fusion=Fusion.ROWS, tile_sizes=(1, 0), block=(threads,), block_reduction=True,
                          vector_width=vector)


def _softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True), x.max(axis=1), e.sum(axis=1)


def _layernorm(x, g, b):
    mean, var = x.mean(axis=1), x.var(axis=1)
    return (x - mean[:, None]) / np.sqrt(var[:, None] + 1e-5) * g + b, mean, var


def _shuffle(x, p):
    return x[:, p] * 2, x[:, ::-1] + x


def _case(name, width, rng):
    if name == "softmax":
        return SOFTMAX, (rng.uniform(-4, 4, (3, width)).astype(f32),), _softmax
    if name == "layernorm":
        return LAYERNORM, (rng.uniform(-1, 1, (3, width)).astype(f32), rng.uniform(-1, 1, width).astype(f32),
                           rng.uniform(-1, 1, width).astype(f32)), _layernorm
    return SHUFFLE, (rng.uniform(-1, 1, (3, width)).astype(f32), rng.permutation(width).astype(np.int32)), _shuffle


def _options(name, width, vector):
    """A block of 64 threads along a row (4 for a short one), each ``vector`` columns at a time."""
    threads = 4 if width < 64 else 64
    if name == "shuffle":
        return MappingOptions(tile_sizes=(1, 0), block=(threads,), vector_width=vector)
    return _rows(vector, threads)


# groups of 8 float32 are two words: they run element by element
CASES = [(name, width, vector) for name in ("softmax", "layernorm", "shuffle")
         for width, vector in ((1024, 4), (1023, 4), (301, 2), (37, 8), (700, 1))]


@pytest.mark.parametrize("name, width, vector", CASES)
def test_vector_loops_match_numpy_thread_by_thread(name, width, vector):
    source, args, oracle = _case(name, width, np.random.default_rng(width))
    d = pf.define(source)[name].definition
    bound = bind_arguments(d, args)
    kernel = schedule_gpu_definition(d, bound.sizes, _options(name, width, vector), DeviceLimits())
    vectors = {s.vector for launch in kernel.launches for s in walk_gpu(launch.body) if isinstance(s, ThreadFor)}
    assert max(vectors) == vector
    got = interpret_gpu_kernel(kernel, dict(bound.values), zero_filled_outputs(d, bound.sizes))
    for t, want in zip(d.outputs, oracle(*args)):
        assert_close(got[t.name], want, f"{name} {t.name} at {width} columns, vector {vector}")


@pytest.mark.parametrize("misalign", [0, 4])
@pytest.mark.parametrize("name, width, vector", CASES)
def test_vector_loops_in_cuda_c_match_numpy(name, width, vector, misalign, emulated):  # noqa: F811
    """On the emulator: whole words where the buffers and rows are aligned, elements one
    at a time where a buffer starts 4 bytes off a word (or a row of 1023 does)."""
    emulated.misalign = misalign
    source, args, oracle = _case(name, width, np.random.default_rng(width))
    kernel = pf.define(source, target="cuda", options=_options(name, width, vector))[name]
    got = as_tuple(kernel(*args))
    cuda = kernel.specialize(*args).stages["cuda"]
    assert ("pf_vec<float, " in cuda) is (1 < vector <= 4)
    for k, (g, w) in enumerate(zip(got, oracle(*args))):
        assert_close(g, w, f"{name} output {k} at {width} columns, vector {vector}, misaligned by {misalign}")


@pytest.mark.unit
def test_the_heuristic_gives_rows_a_word_per_thread():
    for source, vector in ((SOFTMAX, 4), (SOFTMAX.replace("float", "bfloat16"), 4),
                           (SOFTMAX.replace("float", "double"), 2)):
        d = pf.define(source).softmax.definition
        assert default_gpu_options(d, {"N": 16384, "D": 1024}).vector_width == vector
    d = pf.define(SOFTMAX).softmax.definition
    options = default_gpu_options(d, {"N": 16384, "D": 1024})
    kernel = schedule_gpu_definition(d, {"N": 16384, "D": 1024}, options, DeviceLimits())
    text = str(kernel)
    # the row's loops take groups of 4; the trees' loops (iteration t on thread t) do not
    assert text.count("vector 4") == 4 and "pf_t in 0:256 {" in text


@needs_nvdisasm
@pytest.mark.parametrize("name", ROW_PIPELINES)
def test_a_row_pipeline_reads_and_writes_128_bit_words(name):
    kernel = getattr(pf.define(ROW_PIPELINES[name], target="cuda"), name)
    x = np.zeros((16384, 1024), np.float32)
    spec = kernel.specialize(x, *[np.zeros(1024, np.float32)] * (len(kernel.definition.inputs) - 1))
    (mix,) = instruction_mix(spec.stages["sass"]).values()
    assert Mix.count(mix.instructions, "LDG.E.128") >= 2 and Mix.count(mix.instructions, "STG.E.128") >= 1
