"""Compiling prints nothing: LLVM's "loop not vectorized" remarks (where a loop's vector
width hint cannot be used) go to the ``polyfuse.llvm`` logger instead of stderr."""

import os
import subprocess
import sys

import pytest

# lgamma's polynomial keeps a value LLVM cannot vectorize as a reduction at N = 2
PROGRAM = '''
import logging, os, tempfile
os.environ["POLYFUSE_CACHE_DIR"] = tempfile.mkdtemp()
if os.environ.get("VERBOSE"):
    logging.basicConfig(level=logging.DEBUG, format="%(name)s %(message)s")
import numpy as np, polyfuse as pf
src = """def f(float(N) M, float(N) K) -> (L) {
  L(i) = lgamma(M(i) + 1.0) - lgamma(K(i) + 1.0) - lgamma(M(i) - K(i) + 1.0)
}"""
m = np.array([3.0, 5.0], np.float32)
got = pf.define(src, target="host").f(m, m / 2)
from scipy.special import gammaln
want = gammaln(m + 1) - gammaln(m / 2 + 1) - gammaln(m / 2 + 1)
assert np.allclose(got, want, rtol=1e-5, atol=1e-5), (got, want)
print("ok")
'''


@pytest.mark.parametrize("verbose", [False, True])
def test_llvm_remarks_go_to_the_logger_not_stderr(verbose):
    env = {"VERBOSE": "1"} if verbose else {}
    child = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                           env={**os.environ, **env}, timeout=300)
    assert child.returncode == 0 and child.stdout.strip() == "ok", child.stderr
    if verbose:  # asked for: the remark is logged (logging writes to stderr)
        assert "polyfuse.llvm remark:" in child.stderr and "loop not vectorized" in child.stderr
    else:
        assert child.stderr == ""
