"""The compile cache: in memory, on disk across processes, and robust to bad entries."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import polyfuse as pf

SCRIPT = textwrap.dedent("""
    import json, numpy as np, polyfuse as pf
    from polyfuse.runtime import cpu
    mod = pf.define("def sq(float(N) X) -> (Y) { Y(i) = X(i) * X(i) + 3.0 }", target="host")
    x = np.arange(37, dtype=np.float32)
    np.testing.assert_array_equal(mod.sq(x), x * x + 3)
    print(json.dumps(cpu.STATS))
""")


def run(cache_dir):
    env = {**os.environ, "POLYFUSE_CACHE_DIR": str(cache_dir)}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_loads_from_disk(tmp_path):
    assert run(tmp_path) == {"compiled": 1, "disk": 0, "memory": 0}
    assert run(tmp_path) == {"compiled": 0, "disk": 1, "memory": 0}
    assert len(list(tmp_path.glob("*.o"))) == 1


def test_corrupt_entry_is_rebuilt(tmp_path):
    run(tmp_path)
    for f in tmp_path.glob("*.o"):
        f.write_bytes(b"garbage")
    assert run(tmp_path) == {"compiled": 1, "disk": 0, "memory": 0}
    assert run(tmp_path)["disk"] == 1


def test_disk_cache_can_be_turned_off():
    assert run("")["compiled"] == 1  # POLYFUSE_CACHE_DIR="" means no disk cache


def test_same_kernel_in_one_process_compiles_once():
    from polyfuse.runtime import cpu
    src = "def cube(float(N) X) -> (Y) { Y(i) = X(i) * X(i) * X(i) }"
    x = np.arange(5, dtype=np.float32)
    before = dict(cpu.STATS)
    for _ in range(3):
        np.testing.assert_array_equal(pf.define(src, target="host").cube(x), x ** 3)
    assert cpu.STATS["memory"] - before["memory"] == 2
    assert cpu.STATS["compiled"] + cpu.STATS["disk"] - before["compiled"] - before["disk"] == 1


def test_fast_path_still_checks_new_kinds_of_arguments():
    mod = pf.define("def axpy(float a, float(N) X, float(N) Y) -> (Z) { Z(i) = a * X(i) + Y(i) }",
                    target="host")
    x = np.ones(4, np.float32)
    for _ in range(2):
        np.testing.assert_array_equal(mod.axpy(2.0, x, x), np.full(4, 3, np.float32))
    with pytest.raises(pf.DTypeError):
        mod.axpy(2.0, x, x.astype(np.float64))
    with pytest.raises(pf.ShapeError):
        mod.axpy(2.0, x, np.ones(5, np.float32))
    with pytest.raises(pf.DTypeError):
        mod.axpy("2", x, x)
    np.testing.assert_array_equal(mod.axpy(1, x[::2], x[1::2]), np.full(2, 2, np.float32))
