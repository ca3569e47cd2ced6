"""The fuzzer (tests/fuzz/run.py) in a child process per front end: malformed and random
TC, random and damaged ONNX models, right and wrong arguments. Every case must give the
reference's answer or raise a polyfuse error; a raw exception, a wrong answer or a
signal fails the test, which prints the case.

The default run takes a bounded slice with fixed seeds (new ones with POLYFUSE_RANDOM_TESTS=1),
and runs a share of the cases twice, compiling into a new disk cache, then from it;
``python -m pytest -m slow -s tests/fuzz`` runs 10,000 cases per front end
(``POLYFUSE_FUZZ_CASES`` to change) and prints the counts."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import RANDOM_TESTS

ROOT = Path(__file__).resolve().parents[2]
SLICE = {"tc": 200, "onnx": 40, "feeds": 200}
WARM_SHARE = {"tc": 50, "onnx": 10}   # cases run cold, then again from the warm disk cache
SEED = random.randrange(2**16) if RANDOM_TESTS else 0


def fuzz(front: str, count: int, seed: int, tmp_path: Path, timeout: float,
         cache_dir: Path | None = None) -> dict:
    case_file = tmp_path / f"{front}-case.txt"
    env = dict(os.environ, POLYFUSE_FUZZ_CASE_FILE=str(case_file))
    if cache_dir is not None:
        env["POLYFUSE_CACHE_DIR"] = str(cache_dir)
    child = subprocess.run([sys.executable, "-m", "tests.fuzz.run", front, str(count),
                            "--seed", str(seed)], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=timeout)
    where = f"{front} fuzzing, seed {seed}"
    if child.returncode < 0:
        pytest.fail(f"{where}: the child process died of signal {-child.returncode} on this "
                    f"case:\n{case_file.read_text()[:4000]}\n{child.stderr[-3000:]}")
    assert child.returncode == 0, f"{where}: exit {child.returncode}\n{child.stderr[-4000:]}"
    summary = json.loads(child.stdout.strip().splitlines()[-1])
    assert child.stderr == "", f"{where}: the cases wrote to stderr:\n{child.stderr[-3000:]}"
    counts = summary["counts"]
    assert sum(counts.values()) == count, counts
    defects = [d for d in summary["defects"] if d["outcome"] in ("raw", "wrong")]
    shown = "\n\n".join(f"{d['outcome']}: {d['error']}\n{d['case']}\n{d['traceback']}"
                        for d in defects[:3])
    assert counts["raw"] == 0 and counts["wrong"] == 0, f"{where}: {counts}\n\n{shown}"
    return summary


@pytest.mark.parametrize("front", sorted(SLICE))
def test_fuzz_slice(front, tmp_path):
    summary = fuzz(front, SLICE[front], SEED, tmp_path, timeout=600)
    # the slice must reach compiled code, not only the parsers' refusals
    assert summary["counts"]["ok"] >= SLICE[front] // 10, summary["counts"]


@pytest.mark.parametrize("front", sorted(WARM_SHARE))
def test_fuzz_share_cold_then_warm(front, tmp_path):
    """A share of the cases twice, in two processes on one new disk cache: the second
    loads every kernel the first compiled, and every case ends as it did."""
    cold = fuzz(front, WARM_SHARE[front], SEED + 1, tmp_path, timeout=600, cache_dir=tmp_path / "cache")
    warm = fuzz(front, WARM_SHARE[front], SEED + 1, tmp_path, timeout=600, cache_dir=tmp_path / "cache")
    assert cold["kernels"]["compiled"] >= 5 and cold["kernels"]["disk"] == 0, cold["kernels"]
    assert warm["kernels"]["compiled"] == 0, warm["kernels"]
    assert warm["kernels"]["disk"] == cold["kernels"]["compiled"], (cold["kernels"], warm["kernels"])
    assert warm["counts"] == cold["counts"] and warm["refusals"] == cold["refusals"]


@pytest.mark.slow
@pytest.mark.parametrize("front", sorted(SLICE))
def test_fuzz_long(front, tmp_path):
    count = int(os.environ.get("POLYFUSE_FUZZ_CASES", "10000"))
    seed = int(os.environ.get("POLYFUSE_FUZZ_SEED", SEED))
    summary = fuzz(front, count, seed, tmp_path, timeout=6 * 3600)
    print(f"\n{front}: {count} cases, seed {seed}: {summary['counts']}\n"
          f"refusals: {summary['refusals']}\n"
          f"lenient examples: {[d['error'][:200] for d in summary['defects'] if d['outcome'] == 'lenient']}")
