"""Every kernel layout made while compiling the canonical TC programs and the test
models (for the host and for cuda) is saved to the disk cache and loaded back equal."""

import numpy as np

import polyfuse as pf
from polyfuse.runtime import cache, cpu, cuda
from polyfuse.runtime.cuda import CudaLayout
from polyfuse.runtime.program import Layout
from tests.onnx.test_models import attention_feeds, cnn, randn, transformer_block
from tests.runtime.warm_cases import detection_model
from tests.tc_programs import PROGRAMS


def compile_programs(target):
    for p in PROGRAMS:
        getattr(pf.define(p.source, target=target), p.entry).specialize(*p.make_inputs(np.random.default_rng(0)))


def round_trip(executables, kind, tmp_path, monkeypatch):
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", str(tmp_path))
    layouts = [exe.layout for exe in executables if hasattr(exe, "layout")]
    for k, layout in enumerate(layouts):
        cache.store(f"k{k}", b"code", layout, {"loops": "text"})
        assert cache.load(f"k{k}", kind) == (b"code", layout, {"loops": "text"})
    return layouts


def test_host_layouts_round_trip(tmp_path, monkeypatch):
    compile_programs("host")
    pf.compile(cnn(), target="host").run({"x": randn(1, 3, 32, 32)})
    pf.compile(transformer_block(gelu_op=False), target="host").run(attention_feeds(2, 16))
    model, feed = detection_model()
    pf.compile(model, target="host").run(feed)
    layouts = round_trip(list(cpu._COMPILED.values()), Layout, tmp_path, monkeypatch)
    assert len(layouts) >= 70
    assert any(p.padded for layout in layouts for _, _, p in layout.packed)
    assert any(layout.checks_indices for layout in layouts)


def test_cuda_layouts_round_trip(tmp_path, monkeypatch):
    compile_programs("cuda")
    layouts = round_trip(list(cuda._COMPILED.values()), CudaLayout, tmp_path, monkeypatch)
    assert len(layouts) >= 50
    assert any(len(layout.launches) > 1 for layout in layouts)
