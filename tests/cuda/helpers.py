"""What the CUDA tests share: the canonical programs' arguments, ptxas, device presence."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.targets.cuda_driver import available_device
from tests.tc_programs import Program

PTXAS = shutil.which("ptxas")


def arguments(program: Program) -> tuple:
    return program.make_inputs(np.random.default_rng(0))


def kernel(program: Program, target: str = "cuda", options=None) -> pf.Kernel:
    return getattr(pf.define(program.source, target=target, options=options), program.entry)


def assert_ptxas_accepts(ptx: str, tmp_path, arch: str = "sm_90") -> None:
    """ptxas (CUDA 13) assembles the PTX for ``arch``; skipped only where it is missing."""
    if PTXAS is None:
        pytest.skip("ptxas is not installed here (it comes with the CUDA toolkit)")
    path = tmp_path / "kernel.ptx"
    path.write_text(ptx)
    result = subprocess.run([PTXAS, f"-arch={arch}", str(path), "-o", str(tmp_path / "kernel.cubin")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


needs_gpu = pytest.mark.skipif(available_device() is None,
                               reason="no NVIDIA GPU and CUDA driver on this machine")
