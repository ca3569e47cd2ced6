"""Every example runs to completion and prints what it promises: once compiling into an
empty disk cache, and again in a second process that loads every kernel from it (its
own checks against onnxruntime or numpy hold both times, and nothing is compiled)."""

import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = sorted((pathlib.Path(__file__).parent.parent / "examples").glob("*.py"))


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
        made = sorted(p.name for p in tmp_path.iterdir())
        assert entries is None or made == entries, f"the warm run compiled {set(made) - set(entries)}"
        entries = made
