"""The machine model of a target (polyfuse.ir.machine): this processor's read from Linux,
a named CPU's from the table, and what the heuristics derive from it."""

from __future__ import annotations

import shutil
import subprocess
import pytest

from polyfuse.targets import Target
from polyfuse.targets.cpu import _bytes, machine, vector_bits, vector_registers

@pytest.mark.skipif(shutil.which("getconf") is None, reason="no getconf")
def test_the_host_model_holds_the_caches_the_c_library_reports():
    report = subprocess.run(["getconf", "-a"], capture_output=True, text=True, check=True).stdout
    said = dict(line.split(None, 1) for line in report.splitlines() if len(line.split(None, 1)) == 2)
    host = machine(Target.parse("host"))

    def conf(name: str) -> int:
        value = said.get(name, "").strip()
        return int(value) if value.isdigit() else 0

    if not conf("LEVEL1_DCACHE_SIZE"):
        pytest.skip("the C library does not report this machine's caches")
    assert host.l1d_bytes == conf("LEVEL1_DCACHE_SIZE")
    assert host.line_bytes == conf("LEVEL1_DCACHE_LINESIZE")
    assert host.l2_bytes == conf("LEVEL2_CACHE_SIZE")
    assert host.l1d_ways == conf("LEVEL1_DCACHE_ASSOC")
    t = Target.parse("host")
    assert (host.vector_bits, host.vector_registers) == (vector_bits(t), vector_registers(t))
    assert host.cores >= 1 and host.name.startswith("host ")


@pytest.mark.unit
@pytest.mark.parametrize("spec, bits, registers, l2", [
    ("x86:skylake-avx512", 512, 32, 1 << 20), ("x86:znver3", 256, 16, 512 << 10),
    ("x86:haswell", 256, 16, 256 << 10), ("x86:haswell+avx512f", 512, 32, 256 << 10),
    ("aarch64", 128, 32, 1 << 20), ("aarch64:cortex-a72", 128, 32, 512 << 10)])
def test_named_cpus_take_the_table_with_the_vectors_their_features_give(spec, bits, registers, l2):
    m = machine(Target.parse(spec))
    assert (m.vector_bits, m.vector_registers, m.l2_bytes) == (bits, registers, l2)


@pytest.mark.unit
def test_sysfs_sizes_read_as_bytes():
    assert [_bytes(s) for s in ("32K", "1024K", "32M", "512")] == [32 << 10, 1 << 20, 32 << 20, 512]


MATMUL_AND_CONV = """
def mm(float32(M, K) A, float32(K, N) B) -> (C) {
  C(m, n) +=! A(m, k) * B(k, n)
}
def conv(float32(1, 58, 58, 64) X, float32(3, 3, 64, 64) W) -> (Y) {
  Y(n, h, w, f) +=! X(n, h + kh, w + kw, c) * W(kh, kw, c, f) where h in 0:56, w in 0:56
}
"""


def _hot_loop_spills(asm: str) -> tuple[int, int]:
    """The FMAs of the basic block with the most of them (a micro-kernel's reduction
    step) and its vector registers stored to the stack there: spills, as each step
    stores an accumulator that the registers cannot hold."""
    import re
    blocks = re.split(r"\n(?=\.LBB\d+_\d+:)", asm)
    hot = max(blocks, key=lambda b: b.count("vfmadd"))
    return hot.count("vfmadd"), len(re.findall(r"vmov\w+\s+%[xyz]mm\d+, -?\d*\(%rsp", hot))


@pytest.mark.parametrize("spec", ["x86:haswell", "x86:znver3", "x86:skylake-avx512"])
def test_matmul_and_convolution_micro_kernels_keep_their_accumulators_in_registers(spec):
    """Issue 38's AVX2 check: the matmul's and a 3x3 convolution's register blocks on a
    machine of 16 vector registers (and of 32) fit them: the micro-kernel's loop stores
    no vector register to the stack. The code runs here (where the host has the
    features) against numpy. A block of 6 x 4 vectors forced on AVX2 does spill, which
    the same check sees."""
    import dataclasses

    import numpy as np

    import polyfuse as pf
    from polyfuse.frontends.tc import parse
    from polyfuse.ir.machine import MACHINES
    from polyfuse.scheduler.heuristics import default_options
    target = Target.parse(spec)
    module = pf.define(MATMUL_AND_CONV, target=target)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((512, 512), dtype=np.float32), rng.standard_normal((512, 512), dtype=np.float32)
    x = rng.standard_normal((1, 58, 58, 64), dtype=np.float32)
    w = rng.standard_normal((3, 3, 64, 64), dtype=np.float32)
    for kernel, args in ((module.mm, (a, b)), (module.conv, (x, w))):
        fmas, spills = _hot_loop_spills(kernel.specialize(*args).stages["asm"])
        assert fmas >= 8 and spills == 0, (spec, args[0].shape, fmas, spills)
    host = Target.parse("host")
    if vector_bits(target) <= vector_bits(host):   # the host runs this machine's code
        np.testing.assert_allclose(module.mm(a, b), a @ b, rtol=1e-3, atol=1e-2)
        want = sum(np.einsum("nhwc,cf->nhwf", x[:, i:i + 56, j:j + 56], w[i, j]) for i in range(3) for j in range(3))
        np.testing.assert_allclose(module.conv(x, w), want, rtol=1e-3, atol=1e-2)
    if vector_registers(target) == 16:
        wide = default_options(parse(MATMUL_AND_CONV).definitions[0], {"M": 512, "K": 512, "N": 512},
                               MACHINES["sapphirerapids"])
        wide = dataclasses.replace(wide, vector_width=8,
                                   register_tile=tuple(32 if r == 64 else r for r in wide.register_tile))
        forced = pf.define(MATMUL_AND_CONV, target=target, options=wide).mm.specialize(a, b)
        assert _hot_loop_spills(forced.stages["asm"])[1] > 0
