"""Every example runs to completion and prints what it promises: once compiling into an
empty disk cache, and again in a second process that loads every kernel from it (its
own checks against onnxruntime, torch, numpy or the reference evaluator hold both times,
and nothing is compiled). Each example asserts what it compares; here every difference
it prints (``max |polyfuse - onnxruntime| = 1.2e-07``) is checked too."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLES = sorted((pathlib.Path(__file__).parent.parent / "examples").glob("*.py"))
# a difference an example prints: "max |polyfuse - onnxruntime| = 1.2e-07"
DIFFERENCE = re.compile(r"max \|([^|]+)\| = (-?[0-9.]+(?:e[-+]?[0-9]+)?)")


@pytest.mark.unit
def test_there_are_examples():
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(path, tmp_path):
    env = {**os.environ, "POLYFUSE_CACHE_DIR": str(tmp_path)}
    entries = None
    for run in ("cold", "warm"):
        result = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                                timeout=300, cwd=path.parent.parent, env=env)
        assert result.returncode == 0, f"{run} cache:\n{result.stderr}"
        assert result.stdout.strip()
        assert "Traceback" not in result.stdout
        for what, value in DIFFERENCE.findall(result.stdout):
            assert float(value) <= 1e-3, f"{path.name} ({run} cache) printed max |{what}| = {value}"
        made = sorted(p.name for p in tmp_path.iterdir())
        assert entries is None or made == entries, f"the warm run compiled {set(made) - set(entries)}"
        entries = made
