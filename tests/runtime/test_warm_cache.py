"""A second process runs from the disk cache what the first compiled: the same outputs,
bit for bit, with nothing compiled (tests/runtime/warm_cases.py: packed operands at
widths that are not whole panels, checked reads, control flow, a bundle, matrix tiles,
aarch64 and cuda code)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.runtime.warm_cases import CASES

ROOT = Path(__file__).resolve().parents[2]


def run_cases(cache_dir: Path, out: Path) -> dict:
    env = {**os.environ, "POLYFUSE_CACHE_DIR": str(cache_dir)}
    done = subprocess.run([sys.executable, "-m", "tests.runtime.warm_cases", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stderr == "", done.stderr[-2000:]    # compiling and loading stay quiet
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_runs_every_case_from_the_warm_cache(tmp_path):
    cold = run_cases(tmp_path / "cache", tmp_path / "cold.npz")
    entries = sorted(p.name for p in (tmp_path / "cache").iterdir())
    warm = run_cases(tmp_path / "cache", tmp_path / "warm.npz")
    assert cold["cpu"]["compiled"] >= 15 and cold["cpu"]["disk"] == 0, cold
    assert cold["cuda"] == {"compiled": 1, "disk": 0, "memory": 0}, cold
    assert warm["cpu"]["compiled"] == 0 and warm["cpu"]["disk"] == cold["cpu"]["compiled"], warm
    assert warm["cuda"] == {"compiled": 0, "disk": 1, "memory": 0}, warm
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == entries
    first, second = np.load(tmp_path / "cold.npz"), np.load(tmp_path / "warm.npz")
    assert {k.partition(".")[0] for k in first.files} >= set(CASES) - {"aarch64"}
    assert first.files == second.files
    for name in first.files:
        np.testing.assert_array_equal(second[name], first[name], err_msg=name)
