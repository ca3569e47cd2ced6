"""The native runtime: parallel-for, thread pool size, aligned buffers, kernel calls."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from polyfuse.errors import OptionError
from polyfuse.runtime import native

BODY = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)
PARALLEL_FOR_THREADS = ctypes.CFUNCTYPE(None, BODY, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)
KERNEL = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p))


@pytest.fixture(autouse=True)
def restore_num_threads():
    before = native.get_num_threads()
    yield
    native.set_num_threads(before)


def run_with_timeout(fn, seconds: float = 20.0) -> None:
    """Run ``fn`` in a daemon thread; fail instead of hanging if it deadlocks."""
    errors: list[BaseException] = []

    def target():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "deadlock: the call did not return"
    if errors:
        raise errors[0]


# ---- parallel-for -----------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("n", [0, 1, 2, 7, 1000])
def test_parallel_for_covers_every_index_once(n, threads):
    native.set_num_threads(threads)
    counts = np.zeros(n, np.int64)
    native.call(native.test_kernel_address("count"), [counts, n, 0])
    np.testing.assert_array_equal(counts, np.ones(n, np.int64))


@pytest.mark.unit
@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("n", [0, 1, 2, 7, 1000])
def test_parallel_for_splits_into_contiguous_chunks_claimed_by_the_threads(n, threads):
    native.set_num_threads(threads)
    chunks: list[tuple[int, int, int]] = []

    @BODY
    def body(begin, end, ctx):  # ctypes callbacks take the GIL, so appending is safe
        chunks.append((begin, end, threading.get_ident()))

    parallel_for = PARALLEL_FOR_THREADS(native.parallel_for_threads_address())
    run_with_timeout(lambda: parallel_for(body, n, None, 0))
    spans = sorted((b, e) for b, e, _ in chunks)
    used = min(n, threads)
    assert len(spans) == (min(n, 4 * used) if used > 1 else min(n, 1))
    if n:
        assert [b for b, _ in spans] == [0] + [e for _, e in spans[:-1]]  # contiguous
        assert spans[-1][1] == n
        sizes = [e - b for b, e in spans]
        assert max(sizes) - min(sizes) <= 1
    assert len({ident for _, _, ident in chunks}) <= max(used, 1)


@pytest.mark.unit
@pytest.mark.parametrize(("cap", "expected"), [(1, 1), (2, 2), (3, 3), (64, 4), (0, 4), (-1, 4)])
def test_parallel_for_threads_caps_the_threads_of_one_region(cap, expected):
    native.set_num_threads(4)
    chunks: list[tuple[int, int, int]] = []

    @BODY
    def body(begin, end, ctx):
        chunks.append((begin, end, threading.get_ident()))

    parallel_for = PARALLEL_FOR_THREADS(native.parallel_for_threads_address())
    run_with_timeout(lambda: parallel_for(body, 100, None, cap))
    assert len(chunks) == (4 * expected if expected > 1 else 1)
    assert len({ident for _, _, ident in chunks}) <= expected
    assert sum(e - b for b, e, _ in chunks) == 100


@pytest.mark.unit
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_nested_parallel_for_runs_inline_without_deadlock(threads):
    native.set_num_threads(threads)
    counts = np.zeros((13, 29), np.int64)
    run_with_timeout(lambda: native.call(native.test_kernel_address("nested_count"), [counts, 13, 29]))
    np.testing.assert_array_equal(counts, 1)


@pytest.mark.unit
def test_regions_from_several_threads_all_complete():
    native.set_num_threads(2)
    kernel = native.test_kernel_address("count")
    arrays = [np.zeros(257, np.int64) for _ in range(4)]

    def work(counts):
        for _ in range(100):
            native.call(kernel, (counts, counts.size, 0))

    def run_all():
        threads = [threading.Thread(target=work, args=(a,)) for a in arrays]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    run_with_timeout(run_all)
    for counts in arrays:
        np.testing.assert_array_equal(counts, 100)


@pytest.mark.unit
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_gets_a_working_pool():
    native.set_num_threads(2)
    kernel = native.test_kernel_address("count")
    native.call(kernel, [np.zeros(10, np.int64), 10, 0])  # the parent's workers are running
    pid = os.fork()
    if pid == 0:  # child: exit status says whether the pool worked
        counts = np.zeros(100, np.int64)
        native.call(kernel, [counts, 100, 0])
        os._exit(0 if (counts == 1).all() else 1)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("forked child deadlocked in parallel-for")


# ---- pool size ------------------------------------------------------------

@pytest.mark.unit
def test_set_and_get_num_threads():
    for n in (1, 3, 2):
        native.set_num_threads(n)
        assert native.get_num_threads() == n
    for bad in (0, -1, 100_000):
        with pytest.raises(ValueError, match="number of threads"):
            native.set_num_threads(bad)
    assert native.get_num_threads() == 2


# $POLYFUSE_NUM_THREADS -> the pool's size; a refused value leaves the default, one thread per CPU
NUM_THREADS_CASES = {None: None, "": None, " ": None, "3": 3, " 5 ": 5, "+4": 4, "4096": 4096,
                     "many": None, "2.5": None, "4x": None, "0x10": None, "0": None, "-2": None,
                     "4097": None, "99999999999999999999": None}
REFUSED = [v for v, n in NUM_THREADS_CASES.items() if n is None and v is not None and v.strip()]


def _num_threads_in_subprocesses(command: list[str], values) -> dict[str | None, tuple[str, str]]:
    """(stdout, stderr) of ``command`` per POLYFUSE_NUM_THREADS value, all run at once."""
    processes = {}
    for value in values:
        env = {k: v for k, v in os.environ.items() if k != "POLYFUSE_NUM_THREADS"}
        if value is not None:
            env["POLYFUSE_NUM_THREADS"] = value
        processes[value] = subprocess.Popen(command, env=env, text=True,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    results = {value: p.communicate(timeout=60) for value, p in processes.items()}
    assert all(p.returncode == 0 for p in processes.values()), results
    return {value: (out.strip(), err) for value, (out, err) in results.items()}


def _check_num_threads(results: dict[str | None, tuple[str, str]], refusal: str) -> None:
    """Each value's pool size, and a refusal message naming each refused value only."""
    cpus = os.cpu_count()
    for value, (size, messages) in results.items():
        expected = NUM_THREADS_CASES[value]
        assert size == str(expected or cpus), (value, size, messages)
        said = refusal.format(value=value, cpus=cpus)
        assert (said in messages) == (value in REFUSED), (value, messages)


@pytest.mark.native
def test_num_threads_default_comes_from_the_environment():
    """A few cases (each process imports polyfuse); the bundles' pool below takes them all."""
    code = "from polyfuse.runtime import native; print(native.get_num_threads())"
    values = [None, "3", "many", "4097"]
    _check_num_threads(_num_threads_in_subprocesses([sys.executable, "-c", code], values),
                       "RuntimeWarning: POLYFUSE_NUM_THREADS='{value}' is not a whole number from 1 to 4096; "
                       "using {cpus} threads, one per CPU")


@pytest.mark.native
def test_a_bundles_pool_reads_num_threads_as_the_runtime_does(tmp_path):
    """thread_pool.c (the pool linked into bundles) shares num_threads.h with the runtime."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    main = tmp_path / "main.c"
    main.write_text('#include <stdio.h>\nint polyfuse_get_num_threads(void);\n'
                    'int main(void) { printf("%d\\n", polyfuse_get_num_threads()); return 0; }\n')
    pool = Path(native.__file__).parent / "native" / "thread_pool.c"
    subprocess.run([cc, "-std=c11", "-O1", "-pthread", str(main), str(pool), "-o", str(tmp_path / "pool")],
                   check=True, capture_output=True)
    _check_num_threads(_num_threads_in_subprocesses([str(tmp_path / "pool")], NUM_THREADS_CASES),
                       "polyfuse: POLYFUSE_NUM_THREADS='{value}' is not a whole number from 1 to 4096; "
                       "using {cpus} threads, one per CPU\n")


# ---- aligned buffers --------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("shape", [(), 0, 1, (7, 3), (2, 3, 5), [4, 0, 2]])
@pytest.mark.parametrize("dtype", [np.float32, "float64", np.int8, np.complex128, np.bool_, np.float16])
@pytest.mark.parametrize("alignment", [16, 64, 4096])
def test_empty_aligned(shape, dtype, alignment):
    a = native.empty_aligned(shape, dtype, alignment)
    expected_shape = (shape,) if isinstance(shape, int) else tuple(shape)
    assert a.shape == expected_shape
    assert a.dtype == np.dtype(dtype)
    assert a.flags.c_contiguous and a.flags.writeable
    assert native.is_aligned(a, alignment)
    assert a.ctypes.data % alignment == 0
    a[...] = 1
    np.testing.assert_array_equal(a, np.ones(expected_shape, dtype))


@pytest.mark.unit
def test_empty_aligned_default_alignment_is_64():
    assert native.is_aligned(native.empty_aligned((3, 3), np.float32), 64)


@pytest.mark.unit
def test_empty_aligned_frees_its_memory_with_the_last_view():
    before = native.aligned_buffers_live()
    arrays = [native.empty_aligned((100, 100), np.float32) for _ in range(10)]
    views = [a[1:, ::2] for a in arrays]
    assert native.aligned_buffers_live() == before + 10
    del arrays
    assert native.aligned_buffers_live() == before + 10  # the views keep them alive
    del views
    assert native.aligned_buffers_live() == before


def _mapping_flags(address: int) -> list[str]:
    """The VmFlags of the mapping holding ``address`` in /proc/self/smaps."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.unit
@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc")
def test_large_buffers_start_on_huge_pages_and_ask_for_them():
    before = native.set_huge_pages(True)
    try:
        small = native.empty_aligned((1 << 19) - 16, np.float32)   # just under 2 MiB
        large = native.empty_aligned((3, 1 << 19), np.float32)      # 6 MiB
        large[...] = 2.0
        assert large.ctypes.data % (2 << 20) == 0 and small.ctypes.data % (2 << 20) != 0
        assert "hg" in _mapping_flags(large.ctypes.data)            # MADV_HUGEPAGE
        assert native.set_huge_pages(False) is True
        plain = native.empty_aligned((3, 1 << 19), np.float32)      # a separate pool entry
        assert plain.ctypes.data % (2 << 20) != 0
        np.testing.assert_array_equal(large, np.full((3, 1 << 19), 2.0, np.float32))
    finally:
        native.set_huge_pages(before)
    with pytest.raises(OptionError, match="True or False, got 'no'"):
        native.set_huge_pages("no")   # type: ignore[arg-type]


@pytest.mark.unit
def test_empty_aligned_rejects_bad_requests():
    with pytest.raises(ValueError, match="power of two"):
        native.empty_aligned(4, np.float32, 48)
    with pytest.raises(ValueError, match="power of two"):
        native.empty_aligned(4, np.float32, 0)
    with pytest.raises(ValueError, match="negative dimension"):
        native.empty_aligned((2, -1), np.float32)
    with pytest.raises(ValueError, match="too big"):
        native.empty_aligned((2**40, 2**40), np.float32)
    with pytest.raises(TypeError, match="Python objects"):
        native.empty_aligned(3, object)
    with pytest.raises(TypeError):
        native.empty_aligned(3.5, np.float32)


@pytest.mark.unit
def test_is_aligned():
    a = native.empty_aligned(64, np.float32, 64)
    assert native.is_aligned(a, 64)
    assert not native.is_aligned(a[1:], 64)
    assert native.is_aligned(a[1:], 4)
    assert native.is_aligned(a[16:], 64)
    with pytest.raises(TypeError, match="numpy array"):
        native.is_aligned([1.0, 2.0], 4)
    with pytest.raises(ValueError):
        native.is_aligned(a, 0)


# ---- call() -----------------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [0, 1, 33, 10_000])
def test_call_add_kernel_matches_numpy(n, threads):
    native.set_num_threads(threads)
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal((2, n), dtype=np.float32)
    out = native.empty_aligned(n, np.float32)
    native.call(native.test_kernel_address("add"), [a, b, out, n])
    np.testing.assert_array_equal(out, a + b)


@pytest.mark.unit
@pytest.mark.parametrize("n", [np.int64(50), np.int32(50), np.uint8(50), True])
def test_call_accepts_numpy_and_bool_scalars_as_int64(n):
    counts = np.zeros(60, np.int64)
    native.call(native.test_kernel_address("count"), (counts, n, 0))
    np.testing.assert_array_equal(counts, [1] * int(n) + [0] * (60 - int(n)))


@pytest.mark.unit
def test_call_passes_data_pointers_and_8_byte_scalar_slots():
    arrays = [np.arange(3, dtype=np.float32) + i for i in range(20)]  # more than 16 arguments
    scalars = [7, -(2**63), np.int16(-4), np.bool_(True), 2.25, np.float32(1.5)]
    seen: list[object] = []

    @KERNEL
    def kernel(args):
        seen.extend(args[i] for i in range(len(arrays)))
        ints = [ctypes.c_int64.from_address(args[len(arrays) + i]).value for i in range(4)]
        doubles = [ctypes.c_double.from_address(args[len(arrays) + 4 + i]).value for i in range(2)]
        seen.extend(ints + doubles)

    native.call(ctypes.cast(kernel, ctypes.c_void_p).value, arrays + scalars)
    assert seen[:len(arrays)] == [a.ctypes.data for a in arrays]
    assert seen[len(arrays):] == [7, -(2**63), -4, 1, 2.25, 1.5]


@pytest.mark.unit
def test_call_argument_errors_name_the_position():
    noop = native.test_kernel_address("noop")
    a = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match=r"args\[1\] is a str"):
        native.call(noop, [a, "x"])
    with pytest.raises(TypeError, match=r"args\[0\] is a list"):
        native.call(noop, [[1.0, 2.0]])
    with pytest.raises(TypeError, match=r"args\[2\] is a complex"):
        native.call(noop, (a, 1, 1j))
    with pytest.raises(TypeError, match=r"args\[1\] is not a C-contiguous array"):
        native.call(noop, [a, a[::2]])
    with pytest.raises(TypeError, match=r"args\[0\] = 18446744073709551616 does not fit in int64"):
        native.call(noop, [2**64])
    with pytest.raises(TypeError, match=r"args\[17\] is a NoneType"):
        native.call(noop, [a] * 17 + [None])


@pytest.mark.unit
def test_call_rejects_a_bad_kernel_or_argument_list():
    noop = native.test_kernel_address("noop")
    with pytest.raises(TypeError, match="list or a tuple"):
        native.call(noop, np.zeros(3))
    with pytest.raises(TypeError, match="fn_address must be an int"):
        native.call(float(noop), [])
    with pytest.raises(ValueError, match="fn_address is 0"):
        native.call(0, [])
    with pytest.raises(TypeError, match="takes 2 arguments"):
        native.call(noop)  # type: ignore[call-arg]
    with pytest.raises(KeyError, match="no test kernel"):
        native.test_kernel_address("missing")


@pytest.mark.unit
def test_addresses_are_distinct_nonzero_ints():
    addresses = {native.parallel_for_address(), native.parallel_for_threads_address()}
    assert len(addresses) == 2 and 0 not in addresses


def loop_program(n: int) -> native.Program:
    """``if flag: acc = a; for k < limit: out = acc + b; acc = out; rows[k] = out``, as
    the instructions of a program (operands: arena 0, input 1, output 2)."""
    acc, counter = (0, 0, 64), (0, 0, 0)
    a, b, size, limit, flag = ((1, k, 0) for k in range(5))
    out, rows = (2, 0, 0), (2, 1, 0)
    p = native.Program()
    p.jump_unless(flag, 9)
    p.copy(acc, a, 4 * n)
    p.set(counter, 0, 8)
    p.jump_if_at_least(counter, limit, 9)
    p.add(native.test_kernel_address("add"), [acc, b, out, size], [])
    p.copy(acc, out, 4 * n)
    p.copy(rows, out, 4 * n, counter)
    p.increment(counter)
    p.jump(3)
    return p


@pytest.mark.unit
@pytest.mark.parametrize("trips, flag", [(5, True), (0, True), (3, False)])
def test_a_program_runs_a_loop_of_copies_counters_and_jumps(trips, flag):
    n = 7
    a, b = np.arange(n, dtype=np.float32), np.full(n, 0.5, np.float32)
    inputs = [a, b, np.array([n], np.int64), np.array([trips], np.int64), np.array([flag])]
    out, rows = np.full(n, -1, np.float32), np.full((max(trips, 1), n), -1, np.float32)
    program = loop_program(n)
    assert len(program) == 1
    times = np.zeros(1)
    assert program.run(native.empty_aligned(128 + 4 * n, np.uint8), inputs, [out, rows], times) == -1
    if not flag:   # jumped over everything
        assert (out == -1).all() and (rows == -1).all() and times[0] == 0
        return
    np.testing.assert_array_equal(out, a + trips * b if trips else -1)
    np.testing.assert_array_equal(rows[:trips], np.reshape([a + (k + 1) * b for k in range(trips)], (trips, n)))
    assert (times[0] > 0) == (trips > 0)


@pytest.mark.unit
def test_a_program_refuses_a_jump_past_its_end():
    p = native.Program()
    p.jump(2)
    with pytest.raises(ValueError, match="a jump past the end"):
        p.run(native.empty_aligned(64, np.uint8), [], [])
    with pytest.raises(ValueError, match="bytes must be 1 to 8"):
        p.set((0, 0, 0), 1, 9)


@pytest.mark.unit
def test_a_patched_program_is_a_copy_with_its_calls_numbers_changed():
    """Program.patched (a plan template's program at new sizes): arguments, code and
    zeroing of the named calls change in the copy only; bad rows are refused."""
    n = 6
    add = native.test_kernel_address("add")
    p = native.Program()
    p.add(add, [(1, 0, 0), (1, 1, 0), (0, 0, 0), (1, 2, 0)], [])
    p.add(add, [(0, 0, 0), (1, 1, 0), (2, 0, 0), (1, 2, 0)], [(2, 4 * n)])
    a, b = np.arange(2 * n, dtype=np.float32), np.full(2 * n, 0.5, np.float32)
    size = np.array([n], np.int64)
    # the copy reads a's second half, writes its sum at arena byte 64, and zeroes nothing
    q = p.patched(np.array([[0, add]]), np.array([[0, 0, 1, 0, 4 * n], [0, 2, 0, 0, 64], [1, 0, 0, 0, 64]]),
                  np.array([[1, 2, 0]]))
    assert p.describe()[0][1][0] == (1, 0, 0) and q.describe()[0][1][0] == (1, 0, 4 * n)
    assert q.describe()[1][2] == [] and p.describe()[1][2] == [(2, 4 * n)]
    out = np.full(n, -1, np.float32)
    assert q.run(native.empty_aligned(64 + 4 * n, np.uint8), [a, b, size], [out]) == -1
    np.testing.assert_array_equal(out, a[n:] + 1.0)
    for fns, args, zero, message in [
            (np.array([[2, add]]), np.zeros((0, 5)), np.zeros((0, 3)), "no such call"),
            (np.array([[0, 0]]), np.zeros((0, 5)), np.zeros((0, 3)), "fn is 0"),
            (np.zeros((0, 2)), np.array([[0, 4, 0, 0, 0]]), np.zeros((0, 3)), "no such argument"),
            (np.zeros((0, 2)), np.array([[0, 0, 7, 0, 0]]), np.zeros((0, 3)), "bad argument base"),
            (np.zeros((0, 2)), np.zeros((0, 5)), np.array([[1, 0, -1]]), "bad zeroed argument"),
            (np.zeros((0, 2)), np.zeros((1, 4)), np.zeros((0, 3)), "rows of 5")]:
        with pytest.raises(ValueError, match=message):
            p.patched(fns, args, zero)


@pytest.mark.unit
def test_native_first_fit_places_values_as_the_planner_does():
    """native.first_fit (a templated call's arena) gives the offsets and bytes of
    polyfuse.ir.plan.first_fit (the planner's) over random liveness and sizes."""
    from polyfuse.ir.plan import first_fit

    rng = np.random.default_rng(0)
    for _ in range(500):
        count, events = int(rng.integers(1, 40)), int(rng.integers(1, 20))
        defined: list[list[str]] = [[] for _ in range(events)]
        last, size = {}, {}
        for k in range(count):
            at = int(rng.integers(events))
            defined[at].append(f"v{k}")
            last[f"v{k}"] = int(rng.integers(at, events + 1))
            size[f"v{k}"] = 64 * int(rng.integers(1, 50))
        names = [f"v{k}" for k in range(count)]
        bounds = np.cumsum([0] + [len(vs) for vs in defined])
        order = np.array([int(v[1:]) for vs in defined for v in vs], np.int64)
        offsets, arena = native.first_fit(bounds, order, np.array([last[v] for v in names]),
                                          np.array([size[v] for v in names]))
        assert (dict(zip(names, offsets.tolist())), arena) == first_fit(defined, last, size)
    with pytest.raises(ValueError, match="bad value"):
        native.first_fit(np.array([0, 1]), np.array([3]), np.array([0]), np.array([64]))
