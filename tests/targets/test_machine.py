"""The machine model of a target (polyfuse.ir.machine): this processor's read from Linux,
a named CPU's from the table, and what the heuristics derive from it."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace

import pytest

from polyfuse.frontends.tc import parse
from polyfuse.ir.machine import MACHINES
from polyfuse.scheduler.heuristics import default_options, whole_bytes
from polyfuse.targets import Target
from polyfuse.targets.cpu import _bytes, machine, vector_bits, vector_registers

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


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


@pytest.mark.unit
def test_the_l2_decides_how_much_of_a_product_stays_untiled():
    """197 x 768 x 3072 (a transformer's product): with a 2 MiB L2 a whole 768-deep
    reduction's box of 256 columns (768 KiB, three eighths of L2) stays untiled; with
    512 KiB the reduction is tiled in panels whose box fits."""
    d = parse(MM).definitions[0]
    sizes = {"M": 197, "K": 768, "N": 3072}
    big = MACHINES["sapphirerapids"]
    small = replace(big, l2_bytes=512 << 10)
    assert (whole_bytes(big), whole_bytes(small)) == (768 << 10, 192 << 10)

    def tiles(m):
        return dict(zip("mnk", default_options(d, sizes, m).tile_sizes))

    assert tiles(big)["n"] == 256 and tiles(big)["k"] == 0
    depth = tiles(small)["k"]
    assert 0 < depth < 768 and tiles(small)["n"] * depth * 4 <= whole_bytes(small)
