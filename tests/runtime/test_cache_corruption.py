"""Every file of the disk cache, truncated, emptied or overwritten, is detected when it
is loaded and the kernel is recompiled: right answers, no crash, and a valid entry after.

The corrupted caches are loaded in a child process, so a signal (a bad object handed
to the linker) fails the test instead of killing pytest."""

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap

import numpy as np

from polyfuse.runtime import cache
from tests.arm_tools import needs_arm_tools

# For each cache directory given: load the kernel with nothing in memory (the disk entry
# as it is), check the answer, then again with nothing in memory (what the first load left).
CHILD = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import polyfuse as pf
    from polyfuse.runtime import cpu
    SRC = "def affine(float(N,K) X, float(K) W) -> (Y) { Y(n) +=! X(n,k) * W(k) + 1.0 }"
    x = np.arange(35, dtype=np.float32).reshape(7, 5) / 7
    w = np.linspace(-1, 1, 5, dtype=np.float32)
    report = {}
    for folder in sys.argv[1:]:
        os.environ["POLYFUSE_CACHE_DIR"] = folder
        sources = []
        for _ in range(2):
            cpu._COMPILED.clear()
            before = dict(cpu.STATS)
            got = pf.define(SRC, target="host").affine(x, w)
            np.testing.assert_allclose(got, x @ w + 5, rtol=1e-5)
            sources.append(next(k for k in ("compiled", "disk") if cpu.STATS[k] > before[k]))
        report[folder] = sources
    print(json.dumps(report))
""")


def child(*folders):
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD, *map(str, folders)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"child died ({out.returncode}):\n{out.stderr[-3000:]}"
    assert out.stderr == "", out.stderr      # compiling and loading stay quiet
    return json.loads(out.stdout.strip().splitlines()[-1])


def corruptions(data: bytes) -> dict[str, bytes]:
    rng = random.Random(len(data))
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x40
    return {
        "truncated": data[: len(data) // 2],
        "empty": b"",
        "random": rng.randbytes(len(data)),            # same size: only a digest tells
        "random-longer": rng.randbytes(len(data) + 4096),
        "one-byte-flipped": bytes(flipped),
        "elf-header-kept": data[:64] + rng.randbytes(len(data) - 64),
    }


def test_every_corrupted_file_is_detected_and_recompiled(tmp_path):
    pristine = tmp_path / "pristine"
    assert child(pristine) == {str(pristine): ["compiled", "disk"]}
    files = sorted(p.name for p in pristine.iterdir())
    assert {os.path.splitext(f)[1] for f in files} == {".o", ".json"}
    folders = []
    for name in files:
        for how, data in corruptions((pristine / name).read_bytes()).items():
            folder = tmp_path / f"{name}-{how}"
            folder.mkdir()
            for f in files:
                (folder / f).write_bytes(data if f == name else (pristine / f).read_bytes())
            folders.append(folder)
    report = child(*folders)
    assert report == {str(f): ["compiled", "disk"] for f in folders}
    for folder in folders:   # the rebuilt entry is the pristine one again, and it is valid
        assert sorted(p.name for p in folder.iterdir()) == files
        for f in files:
            assert (folder / f).read_bytes() == (pristine / f).read_bytes(), (folder, f)


def test_an_entry_with_a_wrong_digest_or_format_is_not_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", str(tmp_path))
    cache.store("k", b"object code", {"layout": {"name": "x"}})
    assert cache.load("k") == (b"object code", {"layout": {"name": "x"}, "format": cache.FORMAT})
    digest, _, text = (tmp_path / "k.json").read_bytes().partition(b"\n")
    meta = json.loads(text)
    for bad in ({**meta, "format": cache.FORMAT - 1}, [1, 2], "text"):
        body = json.dumps(bad).encode()   # well-formed, and with the digest it would need
        (tmp_path / "k.json").write_bytes(cache._digest(b"object code", body) + b"\n" + body)
        assert cache.load("k") is None
    (tmp_path / "k.json").write_bytes(digest + b"\n" + text)
    (tmp_path / "k.o").write_bytes(b"object codf")
    assert cache.load("k") is None
    (tmp_path / "k.o").unlink()
    assert cache.load("k") is None


def test_a_cache_directory_that_is_a_file_is_skipped(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", str(blocker))
    cache.store("k", b"obj", {})
    assert cache.load("k") is None
    assert blocker.read_text() == "x"


CROSS_CHILD = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import polyfuse as pf
    from polyfuse.runtime import cpu
    sys.path.insert(0, os.path.dirname(sys.argv[1]))
    from test_concurrency import mlp, W1, B1, W2
    x = np.random.default_rng(5).standard_normal((3, 16)).astype(np.float32)
    for folder in sys.argv[2:]:
        os.environ["POLYFUSE_CACHE_DIR"] = folder
        cpu._COMPILED.clear()
        y = pf.compile(mlp(), target="aarch64").run({"x": x})["y"]
        np.testing.assert_allclose(y, np.maximum(x @ W1 + B1, 0) @ W2, rtol=1e-4, atol=1e-4)
    print("ok")
""")


@needs_arm_tools
def test_a_damaged_program_linked_for_the_emulator_is_rebuilt(tmp_path):
    """Code for aarch64 runs here as a program under qemu, kept in the cache's bin/."""
    def run(*folders):
        out = subprocess.run([sys.executable, "-c", CROSS_CHILD, __file__, *map(str, folders)],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
    pristine = tmp_path / "pristine"
    run(pristine)
    files = sorted(str(p.relative_to(pristine)) for p in pristine.rglob("*") if p.is_file())
    assert any(f.startswith("bin/") for f in files) and any(f.endswith(".sha256") for f in files)
    folders = []
    for name in files:
        data = (pristine / name).read_bytes()
        for how in ("truncated", "random"):
            folder = tmp_path / f"{name.replace('/', '_')}-{how}"
            shutil.copytree(pristine, folder)
            (folder / name).write_bytes(corruptions(data)[how])
            folders.append(folder)
    run(*folders)
    for folder in folders:   # valid again: kernel entries as before, programs with their digest
        for f in files:
            if f.startswith("bin/") and not f.endswith(".sha256"):
                digest = (folder / f"{f}.sha256").read_text()
                assert digest == hashlib.sha256((folder / f).read_bytes()).hexdigest(), (folder, f)
            elif not f.startswith("bin/"):
                assert (folder / f).read_bytes() == (pristine / f).read_bytes(), (folder, f)
