"""Every file of the disk cache, truncated, emptied or overwritten, is detected when it
is loaded and the kernel is recompiled: right answers, no crash, and a valid entry after.

Each scenario runs in one child process (:func:`scenario`), so a signal (a bad object
handed to the linker) fails the test instead of killing pytest, and every load in it
uses the same cache keys."""

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from polyfuse.ir.loops import Packing
from polyfuse.runtime import cache
from polyfuse.runtime.cuda import CudaLayout
from polyfuse.runtime.program import Layout
from tests.arm_tools import needs_arm_tools
import pytest

ROOT = Path(__file__).resolve().parents[2]
AFFINE = "def affine(float(N,K) X, float(K) W) -> (Y) { Y(n) +=! X(n,k) * W(k) + 1.0 }"


def corruptions(data: bytes, hows: tuple[str, ...] | None = None) -> dict[str, bytes]:
    rng = random.Random(len(data))
    flipped = bytearray(data)
    if flipped:
        flipped[len(data) // 2] ^= 0x40
    found = {
        "truncated": data[: len(data) // 2],
        "empty": b"",
        "random": rng.randbytes(len(data)),            # same size: only a digest tells
        "random-longer": rng.randbytes(len(data) + 4096),
        "one-byte-flipped": bytes(flipped),
        "header-kept": data[:64] + rng.randbytes(max(0, len(data) - 64)),
    }
    return {k: v for k, v in found.items() if hows is None or k in hows}


def _run_affine() -> None:
    import polyfuse as pf
    x = np.arange(35, dtype=np.float32).reshape(7, 5) / 7
    w = np.linspace(-1, 1, 5, dtype=np.float32)
    np.testing.assert_allclose(pf.define(AFFINE, target="host").affine(x, w), x @ w + 5, rtol=1e-5)


def _run_aarch64_model() -> None:
    import polyfuse as pf
    from tests.runtime.test_concurrency import B1, W1, W2, mlp
    x = np.random.default_rng(5).standard_normal((3, 16)).astype(np.float32)
    y = pf.compile(mlp(), target="aarch64").run({"x": x})["y"]
    np.testing.assert_allclose(y, np.maximum(x @ W1 + B1, 0) @ W2, rtol=1e-4, atol=1e-4)


WORKLOADS = {"affine": (_run_affine, None), "aarch64_model": (_run_aarch64_model, ("truncated", "random"))}


def scenario(folder: str, workload: str) -> dict:
    """In a child: fill a cache, then for every file of it and every kind of damage, load
    from a copy with that file damaged, twice (the damaged entry, then what the first load
    left); where each load's kernels came from, and the files that differ after."""
    from polyfuse.runtime import cpu
    run, hows = WORKLOADS[workload]

    def load(where: Path) -> str:
        os.environ["POLYFUSE_CACHE_DIR"] = str(where)
        cpu._COMPILED.clear()
        before = dict(cpu.STATS)
        run()
        return ",".join(sorted(k for k in ("compiled", "disk") if cpu.STATS[k] > before[k]))

    pristine = Path(folder) / "pristine"
    report: dict = {"pristine": [load(pristine), load(pristine)], "damaged": {}, "differ": []}
    files = sorted(str(p.relative_to(pristine)) for p in pristine.rglob("*") if p.is_file())
    report["files"] = files
    for name in files:
        for how, data in corruptions((pristine / name).read_bytes(), hows).items():
            copy = Path(folder) / f"{name.replace('/', '_')}-{how}"
            shutil.copytree(pristine, copy)
            (copy / name).write_bytes(data)
            report["damaged"][f"{name} {how}"] = [load(copy), load(copy)]
            report["differ"] += [f"{copy.name}: {f}" for f in files if not _same(copy, pristine, f)]
    return report


def _same(copy: Path, pristine: Path, name: str) -> bool:
    """The file is as in the pristine cache (a linked program: matches its digest)."""
    if name.startswith("bin/") and not name.endswith(".sha256"):
        digest = (copy / f"{name}.sha256").read_text()
        return digest == hashlib.sha256((copy / name).read_bytes()).hexdigest()
    return (copy / name).read_bytes() == (pristine / name).read_bytes()


def in_child(tmp_path, workload):
    code = ("import json, sys; from tests.runtime.test_cache_corruption import scenario; "
            "print(json.dumps(scenario(sys.argv[1], sys.argv[2])))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path), workload], cwd=ROOT,
                         env={**os.environ, "PYTHONFAULTHANDLER": "1"}, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, f"child died ({out.returncode}):\n{out.stderr[-3000:]}"
    assert out.stderr == "", out.stderr      # compiling and loading stay quiet
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_corrupted_file_is_detected_and_recompiled(tmp_path):
    report = in_child(tmp_path, "affine")
    assert report["pristine"] == ["compiled", "disk"]
    assert {os.path.splitext(f)[1] for f in report["files"]} == {".o", ".json"}
    assert len(report["damaged"]) == 6 * len(report["files"])
    assert all(v == ["compiled", "disk"] for v in report["damaged"].values()), report["damaged"]
    assert report["differ"] == []


@needs_arm_tools
def test_a_damaged_program_linked_for_the_emulator_is_rebuilt(tmp_path):
    """Code for aarch64 runs here as a program under qemu, kept in the cache's bin/."""
    report = in_child(tmp_path, "aarch64_model")
    files = report["files"]
    assert any(f.startswith("bin/") for f in files) and any(f.endswith(".sha256") for f in files)
    assert report["pristine"] == ["compiled", "disk"]
    assert len(report["damaged"]) == 2 * len(files)
    for what, (first, second) in report["damaged"].items():
        # that kernel is recompiled (the others load), a damaged program relinked
        assert first == ("disk" if what.startswith("bin/") else "compiled,disk"), what
        assert second == "disk", what
    assert report["differ"] == []


LAYOUT = Layout("k", ("A", "B"), (("C", (3, 88), "float32", True),), False, (),
                (("B_prepacked", (3, 32), Packing("B", (0,), ((32, 1),), padded=True)),), ("B",))


@pytest.mark.unit
def test_an_entry_with_a_wrong_digest_format_schema_or_record_is_not_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", str(tmp_path))
    cache.store("k", b"object code", LAYOUT, {"llvm": "text"})
    assert cache.load("k", Layout) == (b"object code", LAYOUT, {"llvm": "text"})
    digest, _, text = (tmp_path / "k.json").read_bytes().partition(b"\n")
    meta = json.loads(text)
    packing = meta["layout"]["packed"][0][2]
    unpadded = {k: v for k, v in packing.items() if k != "padded"}   # the field once forgotten
    for bad in ({**meta, "format": cache.FORMAT - 1}, {**meta, "schema": "0" * 16},
                {**meta, "layout": {**meta["layout"], "packed": [["B_prepacked", [3, 32], unpadded]]}},
                {**meta, "layout": {**meta["layout"], "checks_indices": 0}},
                {**meta, "layout": {**meta["layout"], "extra": 1}},
                {**meta, "stages": {"llvm": 1}}, {k: v for k, v in meta.items() if k != "stages"},
                [1, 2], "text"):
        body = json.dumps(bad).encode()   # well-formed, and with the digest it would need
        (tmp_path / "k.json").write_bytes(cache._digest(b"object code", body) + b"\n" + body)
        assert cache.load("k", Layout) is None, bad
    (tmp_path / "k.json").write_bytes(digest + b"\n" + text)
    assert cache.load("k", CudaLayout) is None      # a record of another type
    (tmp_path / "k.o").write_bytes(b"object codf")
    assert cache.load("k", Layout) is None
    (tmp_path / "k.o").unlink()
    assert cache.load("k", Layout) is None


@pytest.mark.unit
def test_a_cache_directory_that_is_a_file_is_skipped(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", str(blocker))
    cache.store("k", b"obj", LAYOUT, {})
    assert cache.load("k", Layout) is None
    assert blocker.read_text() == "x"


@needs_arm_tools
def test_a_program_for_the_emulator_runs_when_the_cache_cannot_be_written(tmp_path, monkeypatch):
    from polyfuse.runtime import cpu
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", str(blocker))
    monkeypatch.setattr(cpu, "_COMPILED", {})
    _run_aarch64_model()
    assert blocker.read_text() == "x"
