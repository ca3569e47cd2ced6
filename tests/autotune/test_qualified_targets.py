"""Tuning records of qualified targets (``x86:skylake-avx512``, ``aarch64+sve``, ``host``):
stored with their spec, read back as Targets, and found by define(), compile() and the
command line for that very target, with the documented fallback to the same backend."""

import json
import logging
from dataclasses import replace

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from polyfuse.autotune import records as db
from polyfuse.autotune.records import Record, Records, RecordsWarning
from polyfuse.autotune.task import Task
from polyfuse.cli import main
from polyfuse.scheduler.options import Fusion, MappingOptions
from polyfuse.targets import BACKENDS, Codegen, Device, Target
from polyfuse.targets.cpu import runs_natively

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
SKYLAKE = "x86:skylake-avx512"
TUNED = MappingOptions(fusion=Fusion.MIN, tile_sizes=(16, 16, 0), vector_width=4, unroll=3)
OTHER = MappingOptions(fusion=Fusion.MIN, tile_sizes=(8, 8, 0), vector_width=8, unroll=2)


def _avx512_here() -> bool:
    import llvmlite.binding as llvm
    return runs_natively(Target.parse("x86")) and bool(llvm.get_host_cpu_features().get("avx512f"))


needs_avx512 = pytest.mark.skipif(not _avx512_here(), reason="runs skylake-avx512 code: needs AVX-512")


def task(target, m=48, k=40, n=24):
    return Task(MM, "mm", ((m, k), (k, n)), ("float32", "float32"), target=target)


@pytest.mark.unit
def test_every_backend_is_in_the_registry():
    assert set(BACKENDS) == {"reference", "x86", "aarch64", "cuda"}
    assert Target.parse("host").backend is BACKENDS["x86" if runs_natively(Target.parse("x86")) else "aarch64"]
    assert Target.parse("cuda").backend.device is Device.GPU and not Target.parse("cuda").backend.cpus
    assert Target.parse("aarch64+sve").backend.codegen is Codegen.LLVM
    assert Target.parse("aarch64+sve").backend.bundles and not Target.parse("reference").backend.bundles
    from polyfuse.runtime.kernel import BUILDERS, _build_cpu
    assert BUILDERS["x86"] is BUILDERS["aarch64"] is _build_cpu


@pytest.mark.unit
@pytest.mark.parametrize("spec", [SKYLAKE, "aarch64+sve", "aarch64:cortex-a72", "host", "cuda"])
def test_records_keep_the_qualified_target(spec, tmp_path):
    path = tmp_path / "r.jsonl"
    t = task(spec)
    assert t.target == Target.parse(spec)
    db.append(path, [Record.of(t, TUNED, [1e-4])])
    assert json.loads(path.read_text())["target"] == str(Target.parse(spec))
    [back] = db.load(path)
    assert back.target == Target.parse(spec) and back.options == TUNED
    assert Records([back]).options(t) == TUNED


@pytest.mark.unit
def test_older_records_with_a_bare_name_load_and_unknown_targets_are_skipped(tmp_path):
    line = Record.of(task("x86"), TUNED, [1e-4]).to_json()
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(line) + "\n" + json.dumps({**line, "target": "z80"}) + "\n")
    with pytest.warns(RecordsWarning, match="unknown target 'z80'"):
        [record] = db.load(path)
    assert record.target == Target.parse("x86") == Target.parse("host" if runs_natively(Target.parse("x86")) else "x86")


@pytest.mark.unit
def test_a_qualified_target_matches_its_own_records_first():
    rs = Records([Record.of(task(SKYLAKE), TUNED, [2e-4]), Record.of(task("x86"), OTHER, [1e-4]),
                  Record.of(task("aarch64+sve"), OTHER, [1e-5])])
    assert rs.options(task(SKYLAKE)) == TUNED
    assert rs.options(task("x86")) == OTHER
    assert rs.options(task("aarch64+sve")) == OTHER
    # own records at other shapes come before another CPU's at these shapes
    assert rs.options(task(SKYLAKE, 50, 40, 24)) == TUNED


@pytest.mark.unit
def test_features_in_any_order_are_one_target():
    assert Target.parse("aarch64+fp16+sve") == Target.parse("aarch64+sve+fp16+sve")
    assert str(Target.parse("aarch64+sve+fp16")) == "aarch64+fp16+sve"
    rs = Records([Record.of(task("x86:skylake+fma+avx2"), TUNED, [1e-4]), Record.of(task("x86"), OTHER, [1e-5])])
    assert rs.options(task("x86:skylake+avx2+fma")) == TUNED


@pytest.mark.unit
def test_another_target_of_the_backend_is_the_fallback(caplog):
    rs = Records([Record.of(task(SKYLAKE), TUNED, [1e-4]), Record.of(task("aarch64+sve"), OTHER, [1e-4])])
    with caplog.at_level(logging.DEBUG, logger="polyfuse.autotune"):
        assert rs.options(task("x86:znver4")) == TUNED
    assert f"none for x86:znver4; using those tuned for {SKYLAKE}" in caplog.text
    assert rs.options(task("x86")) == TUNED
    assert rs.options(task("aarch64")) == OTHER
    # nearest shapes: repaired for the task's target, whose NEON registers hold 4 floats
    assert rs.options(task("aarch64:cortex-a72", 64, 40, 24)) == replace(OTHER, vector_width=4)
    assert rs.options(task("cuda")) is None and rs.options(task("reference")) is None


def _inputs():
    rng = np.random.default_rng(0)
    return rng.standard_normal((48, 40)).astype(np.float32), rng.standard_normal((40, 24)).astype(np.float32)


@pytest.mark.parametrize("spec", [pytest.param(SKYLAKE, marks=needs_avx512), "host"])
def test_define_uses_the_records_of_a_qualified_target(spec, tmp_path):
    path = tmp_path / "r.jsonl"
    db.append(path, [Record.of(task(spec), TUNED, [1e-4]), Record.of(task(spec), OTHER, [2e-4]),
                     Record.of(task("aarch64"), OTHER, [1e-6])])
    mod = pf.define(MM, target=spec, tuning_records=path)
    a, b = _inputs()
    spec_kernel = mod.mm.specialize(a, b)
    assert spec_kernel.stages["options"] == repr(TUNED)
    np.testing.assert_allclose(spec_kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)


def test_define_for_aarch64_sve_uses_its_records(tmp_path):
    path = tmp_path / "r.jsonl"
    db.append(path, [Record.of(task("aarch64+sve"), TUNED, [1e-4]), Record.of(task("aarch64"), OTHER, [1e-5])])
    a, b = _inputs()
    assert pf.define(MM, target="aarch64+sve", tuning_records=path).mm.specialize(a, b) \
        .stages["options"] == repr(TUNED)   # compiles anywhere; runs under qemu off ARM
    assert pf.define(MM, target="aarch64", tuning_records=path).mm.specialize(a, b) \
        .stages["options"] == repr(OTHER)


def _model(tmp_path):
    w = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="fc"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 16])],
                              [numpy_helper.from_array(w, "W")])
    path = tmp_path / "m.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path, w


MODEL_TUNED = MappingOptions(tile_sizes=(4, 8, 0), vector_width=4, unroll=2)


def _model_records(path, tmp_path, spec):
    """A records file with MODEL_TUNED for every kernel of the model on ``spec``."""
    tasks = pf.compile(str(path), target=spec).tasks()
    assert tasks and all(t.target == Target.parse(spec) for t in tasks)
    records = tmp_path / "model.jsonl"
    db.append(records, [Record.of(t, MODEL_TUNED, [1e-4]) for t in tasks])
    return records


@pytest.mark.parametrize("spec", [pytest.param(SKYLAKE, marks=needs_avx512), "aarch64+sve"])
def test_compile_uses_the_records_of_a_qualified_target(spec, tmp_path):
    path, w = _model(tmp_path)
    records = _model_records(path, tmp_path, spec)
    tuned = pf.compile(str(path), target=spec, tuning_records=records).dump("loops")
    assert tuned == pf.compile(str(path), target=spec, options=MODEL_TUNED).dump("loops")
    assert tuned != pf.compile(str(path), target=spec).dump("loops")
    if spec == SKYLAKE:
        x = np.random.default_rng(1).standard_normal((32, 32)).astype(np.float32)
        out = pf.compile(str(path), target=spec, tuning_records=records).run({"x": x})["y"]
        np.testing.assert_allclose(out, np.maximum(x @ w, 0), rtol=1e-4, atol=1e-4)


@needs_avx512
def test_the_command_line_keeps_the_qualified_target(tmp_path, capsys, caplog, monkeypatch):
    tc = tmp_path / "mm.tc"
    tc.write_text(MM)
    path, w = _model(tmp_path)
    records = _model_records(path, tmp_path, SKYLAKE)
    db.append(records, [Record.of(task(SKYLAKE), TUNED, [1e-4]), Record.of(task("x86"), OTHER, [1e-5])])
    shapes = ["--input-shapes", "A:[48,40] B:[40,24]"]
    assert main(["compile", str(tc), *shapes, "--target", SKYLAKE, "--tuning-records", str(records),
                 "--dump", "options"]) == 0
    assert capsys.readouterr().out.strip() == repr(TUNED)
    assert main(["compile", str(path), "--target", SKYLAKE, "--tuning-records", str(records),
                 "--dump", "loops"]) == 0
    assert capsys.readouterr().out.strip() == \
        pf.compile(str(path), target=SKYLAKE, options=MODEL_TUNED).dump("loops").strip()
    x = np.random.default_rng(2).standard_normal((32, 32)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    # a new cache: the run plans (it would load the program the compile above saved)
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", str(tmp_path / "cache"))
    with caplog.at_level(logging.DEBUG, logger="polyfuse.autotune"):
        assert main(["run", str(path), "--target", SKYLAKE, "--tuning-records", str(records),
                     "--inputs", str(tmp_path / "in.npz"), "--outputs", str(tmp_path / "o.npz")]) == 0
    assert f"on {SKYLAKE} uses options measured at 0.1 ms" in caplog.text
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["y"], np.maximum(x @ w, 0), rtol=1e-4, atol=1e-4)


@needs_avx512
def test_tune_records_the_qualified_target(tmp_path, capsys):
    path, _ = _model(tmp_path)
    out = tmp_path / "tuned.jsonl"
    assert main(["tune", str(path), "--target", SKYLAKE, "--trials", "2", "-o", str(out),
                 "--number", "1", "--repeat", "1"]) == 0
    assert f"on {SKYLAKE}" in capsys.readouterr().out
    records = db.load(out)
    assert records and {json.loads(line)["target"] for line in out.read_text().splitlines()} == {SKYLAKE}
    [t] = pf.compile(str(path), target=SKYLAKE).tasks()
    best = Records(records).lookup(t)
    assert best is not None and best.target == Target.parse(SKYLAKE)
    assert Records(records).lookup(Task(t.source, t.entry, t.shapes, t.dtypes, "x86:znver4")) == best


@pytest.mark.unit
def test_records_show_and_best_name_each_target(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    db.append(path, [Record.of(task(SKYLAKE), TUNED, [2e-4]), Record.of(task(SKYLAKE), OTHER, [3e-4]),
                     Record.of(task("aarch64+sve"), OTHER, [1e-4])])
    assert main(["records", "show", str(path)]) == 0
    rows = capsys.readouterr().out.splitlines()[1:-1]
    assert [row.split()[1] for row in rows] == [SKYLAKE, SKYLAKE, "aarch64+sve"]
    assert main(["records", "best", str(path)]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert sorted((row.split()[1], *row.split()[-2:]) for row in rows) == \
        [("aarch64+sve", "0.1", "1"), (SKYLAKE, "0.2", "2")]
