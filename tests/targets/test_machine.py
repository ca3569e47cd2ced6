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
