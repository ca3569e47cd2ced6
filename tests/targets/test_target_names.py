"""A CPU or feature LLVM does not know is a TargetError when the target is given (LLVM
itself would print a warning, ignore the name, and might abort the process)."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import polyfuse as pf

SQ = "def sq(float(N) X) -> (Y) { Y(i) = X(i) * X(i) }"


@pytest.mark.parametrize("spec, unknown", [("x86:foo", "'foo'"), ("x86+bogus", "'+bogus'"),
                                           ("aarch64:nope+sve", "'nope'"), ("x86:skylake+avx9", "'+avx9'")])
def test_unknown_cpu_or_feature_is_refused_at_define(spec, unknown):
    with pytest.raises(pf.TargetError, match=f"LLVM does not know {re.escape(unknown)}.*'host' for"):
        pf.define(SQ, target=spec)


@pytest.mark.parametrize("spec", ["x86:skylake+avx2", "x86:x86-64"])
def test_known_names_compile_and_run(spec):
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(pf.define(SQ, target=spec).sq(x), x * x)


def test_the_cli_says_one_line_and_nothing_of_llvm(tmp_path):
    path = tmp_path / "sq.tc"
    path.write_text(SQ + "\n")
    out = subprocess.run([sys.executable, "-m", "polyfuse.cli", "compile", str(path), "--input-shapes",
                          "X:[8]", "--target", "x86:foo", "--dump", "asm"],
                         capture_output=True, text=True, timeout=120, env=os.environ)
    assert out.returncode == 1
    assert out.stderr.startswith("polyfuse: error: target 'x86:foo': LLVM does not know 'foo'")
    assert out.stderr.count("\n") == 1 and "not a recognized" not in out.stderr
