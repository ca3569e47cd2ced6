"""The polyfuse command line: compile, run, tune and records, and its errors."""

import json
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from polyfuse.autotune import records as db
from polyfuse.autotune.task import Task
import polyfuse as pf
from polyfuse.cli import main, parse_shapes
from polyfuse.runtime import cpu

MM = """
def mm(float(M,K) A, float(K,N) B) -> (C) {
  C(m, n) +=! A(m, k) * B(k, n)
}
def relu(float(N) X) -> (Y) { Y(i) = max(X(i), 0.0) }
"""


@pytest.fixture
def tc_file(tmp_path):
    path = tmp_path / "kernels.tc"
    path.write_text(MM)
    return path


@pytest.fixture
def onnx_file(tmp_path):
    w = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="fc"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
                              [numpy_helper.from_array(w, "W")])
    path = tmp_path / "m.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path, w


@pytest.mark.unit
def test_input_shapes_parse():
    assert parse_shapes("A:[1024,1024] B:[1024, 64]") == {"A": (1024, 1024), "B": (1024, 64)}
    assert parse_shapes("x.1:[1,3,224,224]") == {"x.1": (1, 3, 224, 224)}


def test_compile_dumps_a_stage(tc_file, capsys, tmp_path):
    assert main(["compile", str(tc_file), "--entry", "mm", "--input-shapes", "A:[32,16] B:[16,8]",
                 "--dump", "loops", "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "kernel mm(in float32(32, 16) A" in out and "for " in out
    assert (tmp_path / "out" / "mm.o").stat().st_size > 0
    assert "define" in (tmp_path / "out" / "mm.llvm.txt").read_text()


def test_compile_and_run_a_kernel_for_symbolic_sizes(tc_file, capsys, tmp_path):
    """``--sizes symbolic``: the object code takes the sizes as scalars (``int64 K, M, N``
    in the loop IR) and serves every size."""
    assert main(["compile", str(tc_file), "--entry", "mm", "--input-shapes", "A:[32,16] B:[16,8]",
                 "--sizes", "symbolic", "--dump", "loops", "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "kernel mm(in float32(M, K) A, in float32(K, N) B" in out and "int64 K, int64 M, int64 N" in out
    assert (tmp_path / "out" / "mm.o").stat().st_size > 0
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((7, 5)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
    np.savez(tmp_path / "in.npz", A=a, B=b)
    assert main(["run", str(tc_file), "--entry", "mm", "--inputs", str(tmp_path / "in.npz"), "--sizes", "symbolic",
                 "--outputs", str(tmp_path / "o.npz")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["C"], a @ b, rtol=1e-5, atol=1e-6)


def test_compile_for_the_tensor_cores_with_tf32(tc_file, capsys):
    """``--precision tf32`` on cuda: the matmul's products are warp tile products."""
    assert main(["compile", str(tc_file), "--entry", "mm", "--target", "cuda", "--input-shapes",
                 "A:[128,64] B:[64,128]", "--precision", "tf32", "--dump", "gpu"]) == 0
    assert "tile mma_tf32" in capsys.readouterr().out
    assert main(["compile", str(tc_file), "--entry", "mm", "--target", "cuda", "--input-shapes",
                 "A:[128,64] B:[64,128]", "--dump", "gpu"]) == 0
    assert "mma_" not in capsys.readouterr().out


def test_run_a_tc_definition(tc_file, tmp_path, capsys):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    np.savez(tmp_path / "in.npz", A=a, B=b)
    assert main(["run", str(tc_file), "--entry", "mm", "--inputs", str(tmp_path / "in.npz"),
                 "--outputs", str(tmp_path / "out.npz"), "--repeat", "3", "--print-time"]) == 0
    assert "3 runs: median" in capsys.readouterr().out
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["C"], a @ b, rtol=1e-5)


def test_run_and_compile_an_onnx_model(onnx_file, tmp_path, capsys):
    path, w = onnx_file
    x = np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    assert main(["run", str(path), "--inputs", str(tmp_path / "in.npz"), "--outputs", str(tmp_path / "o.npz")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["y"], np.maximum(x @ w, 0), rtol=1e-5)
    assert main(["compile", str(path), "--input-shapes", "x:[3,8]", "--dump", "groups",
                 "-o", str(tmp_path / "out")]) == 0
    assert "g0: fc (MatMul) -> relu (Relu)" in capsys.readouterr().out
    assert "def fused" in (tmp_path / "out" / "kernels.txt").read_text()


@pytest.mark.unit
def test_records_show_best_distill(tmp_path, capsys):
    from polyfuse.scheduler.options import MappingOptions
    t = Task(MM, "mm", ((8, 8), (8, 8)), ("float32", "float32"))
    path = tmp_path / "r.jsonl"
    db.append(path, [db.Record.of(t, MappingOptions(unroll=u), [u * 1e-3]) for u in (3, 1, 2)]
              + [db.Record.of(t, MappingOptions(unroll=8), [], "timeout")])
    assert main(["records", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "4 records, 3 valid" in out and "timeout" in out and '{"unroll": 8}' in out
    assert main(["records", "best", str(path)]) == 0
    assert "1" in capsys.readouterr().out
    assert main(["records", "distill", str(path), "-o", str(tmp_path / "d.jsonl")]) == 0
    [best] = db.load(tmp_path / "d.jsonl")
    assert best.options == MappingOptions(unroll=1) and best.cost == 1e-3


@pytest.mark.unit
@pytest.mark.parametrize("argv, message", [
    (["run", "missing.tc", "--inputs", "x.npz"], "polyfuse: error: no file 'missing.tc'"),
    (["compile", "{tc}", "--input-shapes", "A:[3,x]"], "dimensions of 'A' must be integers"),
    (["compile", "{tc}", "--input-shapes", "A:[3,3] B:[3,3]"], "defines mm, relu; choose one with --entry"),
    (["compile", "{tc}", "--entry", "mm", "--input-shapes", "A:[3,3]"], "missing ['B']"),
    (["compile", "{tc}", "--entry", "mm", "--input-shapes", "A:[3,4] B:[5,3]"], "size K is 4"),
    (["records", "show", "none.jsonl"], "no records file 'none.jsonl'"),
])
def test_errors_are_one_line_with_a_nonzero_exit(argv, message, tc_file, capsys):
    code = main([a.replace("{tc}", str(tc_file)) for a in argv])
    err = capsys.readouterr().err
    assert code == 1
    assert message in err and "Traceback" not in err
    assert err.count("\n") == 1


@pytest.mark.unit
def test_a_tc_syntax_error_shows_the_caret(tmp_path, capsys):
    bad = tmp_path / "bad.tc"
    bad.write_text("def f(float(N) A) -> (B) {\n  B(i) = A(i) +\n}\n")
    assert main(["compile", str(bad), "--input-shapes", "A:[4]"]) == 1
    err = capsys.readouterr().err
    assert "bad.tc" in err or "<tc>" in err
    assert "^" in err and "Traceback" not in err


@pytest.mark.unit
def test_verbose_shows_the_traceback(capsys):
    assert main(["--verbose", "records", "show", "none.jsonl"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_the_module_entry_point_runs(tmp_path):
    done = subprocess.run([sys.executable, "-m", "polyfuse", "records", "show", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "no records file" in done.stderr


def test_tune_a_tc_kernel_then_compile_with_the_records(tc_file, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    argv = ["tune", str(tc_file), "--entry", "mm", "--input-shapes", "A:[64,64] B:[64,64]",
            "--trials", "6", "-o", str(out), "--number", "2", "--repeat", "2", "--seed", "1",
            "--plot", str(tmp_path / "curve.png")]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "best" in text and "x)" in text
    records = db.load(out)
    finalists = [r for r in records if r.message == "finalist"]   # the best 3 and the default, twice
    assert len(records) - len(finalists) == 6 and 2 <= len(finalists) <= 8
    assert any(r.ok for r in records)
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert {line["entry"] for line in lines} == {"mm"}
    assert main(["compile", str(tc_file), "--entry", "mm", "--input-shapes", "A:[64,64] B:[64,64]",
                 "--tuning-records", str(out), "--dump", "options"]) == 0
    best = db.Records(records).lookup(Task(MM, "mm", ((64, 64), (64, 64)), ("float32", "float32")))
    assert repr(best.options) in capsys.readouterr().out


def test_tune_an_onnx_model_then_run_it_with_the_records(onnx_file, tmp_path, capsys):
    path, w = onnx_file
    out = tmp_path / "r.jsonl"
    assert main(["tune", str(path), "--input-shapes", "x:[16,8]", "--trials", "3", "-o", str(out),
                 "--number", "2", "--repeat", "1"]) == 0
    assert "[1/1] tuning g0[fc relu]" in capsys.readouterr().out
    records = db.load(out)
    assert 3 < len(records) <= 3 + 8 and {r.name for r in records} == {"g0[fc relu]"}
    x = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    assert main(["run", str(path), "--inputs", str(tmp_path / "in.npz"), "--tuning-records", str(out),
                 "--outputs", str(tmp_path / "o.npz")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["y"], np.maximum(x @ w, 0), rtol=1e-5)
    assert main(["tune", str(path), "--trials", "1", "-o", str(out)]) == 1
    assert "--input-shapes \"x:[...]\"" in capsys.readouterr().err


def test_ctrl_c_stops_tuning_and_keeps_every_record(tc_file, tmp_path):
    out = tmp_path / "r.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "polyfuse", "tune", str(tc_file), "--entry", "mm",
                             "--input-shapes", "A:[128,128] B:[128,128]", "--trials", "400",
                             "-o", str(out), "--number", "2", "--repeat", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # a shell's background job ignores SIGINT, and its children would too
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while time.time() < deadline and (not out.exists() or not out.read_text().count("\n")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # every line written is whole
        records = db.load(out)
    assert 1 <= len(records) < 400


def test_cache_info_and_clear(tc_file, tmp_path, capsys, monkeypatch):
    """`polyfuse cache` names the directory and counts its kernels; `clear` removes the
    cache's files and nothing else, and the next compile fills it again."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", str(folder))
    monkeypatch.setattr(cpu, "_COMPILED", {})
    a, b = np.ones((4, 3), np.float32), np.ones((3, 5), np.float32)
    np.testing.assert_array_equal(pf.define(MM, target="host").mm(a, b), a @ b)
    np.testing.assert_array_equal(pf.define(MM, target="host").relu(-a[0]), np.zeros(3, np.float32))
    (folder / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["cache"]) == 0
    assert capsys.readouterr().out.startswith(f"{folder}: 2 kernels, 0 plans of compiled models, 0 programs")
    assert main(["cache", "clear"]) == 0
    assert capsys.readouterr().out.strip() == f"removed 4 files from {folder}"
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    monkeypatch.setattr(cpu, "_COMPILED", {})
    before = cpu.STATS["compiled"]
    pf.define(MM, target="host").mm(a, b)
    assert cpu.STATS["compiled"] == before + 1 and len(list(folder.glob("*.o"))) == 1
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", "0")
    assert main(["cache"]) == 0
    assert "off" in capsys.readouterr().out
