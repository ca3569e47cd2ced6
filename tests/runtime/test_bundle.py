"""Ahead-of-time bundles for x86 and aarch64: the example main.c built with the target's C
compiler, run natively or under qemu, prints what ``polyfuse.compile(...).run`` returns."""

import os
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import polyfuse as pf
from polyfuse.runtime.bundle import write_bundle
from polyfuse.runtime.cross import c_compiler, runner_prefix
from polyfuse.targets.cpu import native_tiles
from tests.arm_tools import AARCH64
from tests.onnx.test_frontend import mlp
from tests.onnx.test_models import cnn, make_model, randn, weights

node = helper.make_node
ELF_MACHINE = {"x86": 0x3E, "aarch64": 0xB7}
TARGETS = ["x86", AARCH64]


def wide_mlp():
    """Two 256-wide layers at batch 64: kernels big enough to run on the thread pool."""
    nodes = [node("Gemm", ["x", "W1", "B1"], ["h"], transB=1), node("Relu", ["h"], ["r"]),
             node("Gemm", ["r", "W2", "B2"], ["y"], transB=1)]
    init = {"W1": weights(256, 128), "B1": randn(256, scale=0.1), "W2": weights(64, 256),
            "B2": randn(64, scale=0.1)}
    return make_model(nodes, {"x": (TensorProto.FLOAT, [64, 128])}, {"y": (TensorProto.FLOAT, [64, 64])}, init)


def odd_outputs():
    """Outputs that are copies (of an input, of another output), a constant, an int64
    gather whose index comes from an input, and a float64 input."""
    table = np.arange(12, dtype=np.int64).reshape(4, 3) * 10
    nodes = [node("Relu", ["x"], ["r"]), node("Identity", ["r"], ["r_again"]),
             node("Identity", ["x"], ["x_copy"]),
             node("Constant", [], ["c"], value=onnx.numpy_helper.from_array(np.float32([1.5, -2]))),
             node("Gather", ["table", "idx"], ["g"], axis=0),
             node("Mul", ["d", "d"], ["d2"])]
    return make_model(nodes, {"x": (TensorProto.FLOAT, [2, 5]), "idx": (TensorProto.INT64, [3]),
                              "d": (TensorProto.DOUBLE, [4])},
                      {"r": (TensorProto.FLOAT, [2, 5]), "r_again": (TensorProto.FLOAT, [2, 5]),
                       "x_copy": (TensorProto.FLOAT, [2, 5]), "c": (TensorProto.FLOAT, [2]),
                       "g": (TensorProto.INT64, [3, 3]), "d2": (TensorProto.DOUBLE, [4])},
                      {"table": table})


def build_and_run(model, feed, target, tmp_path, threads=False, env=None, **options):
    compiled = pf.compile(model, target=target, **options)
    write_bundle(compiled, tmp_path, "net", threads=threads, shapes={k: v.shape for k, v in feed.items()})
    exe = tmp_path / "net_main"
    cc = c_compiler(pf.Target.parse(target))
    subprocess.run([*cc, "-O2", "-std=c11", str(tmp_path / "main.c"), str(tmp_path / "net.o"),
                    "-o", str(exe), "-lm", *(["-pthread"] if threads else [])], check=True)
    files = []
    for name in (v.name for v in compiled.inputs):
        path = tmp_path / f"{name}.bin"
        np.ascontiguousarray(feed[name]).tofile(path)
        files.append(str(path))
    run = subprocess.run([*runner_prefix(pf.Target.parse(target)), str(exe),
                          str(tmp_path / "net.weights.bin"), *files],
                         capture_output=True, text=True, env={**os.environ, **(env or {})})
    return compiled, run


def printed_outputs(stdout):
    """``{name: (dtype, shape, values)}`` from main.c's output."""
    lines = stdout.splitlines()
    out = {}
    for head, values in zip(lines[::2], lines[1::2]):
        name, dtype, shape = head.split(" ", 2)
        dims = [int(d) for d in shape.strip("[]").split(",") if d.strip()]
        out[name] = (dtype, tuple(dims), np.array([float(v) for v in values.split()]).reshape(dims))
    return out


def assert_prints_the_same(compiled, run, feed):
    assert run.returncode == 0, run.stderr
    want = compiled.run(feed)
    got = printed_outputs(run.stdout)
    assert list(got) == list(want)
    for name, array in want.items():
        dtype, shape, values = got[name]
        assert (dtype, shape) == (str(array.dtype), array.shape), name
        np.testing.assert_allclose(values, array.astype(np.float64), rtol=1e-6, atol=1e-7, err_msg=name)


def elf_header(path):
    data = path.read_bytes()[:20]
    assert data[:4] == b"\x7fELF" and data[4] == 2, "a 64-bit ELF file"
    return int.from_bytes(data[16:18], "little"), int.from_bytes(data[18:20], "little")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("threads", [False, True], ids=["1-thread", "thread-pool"])
def test_cnn_bundle_prints_what_compile_run_returns(target, threads, tmp_path):
    feed = {"x": randn(1, 3, 32, 32)}
    compiled, run = build_and_run(cnn(), feed, target, tmp_path, threads)
    assert_prints_the_same(compiled, run, feed)
    e_type, e_machine = elf_header(tmp_path / "net.o")
    assert (e_type, e_machine) == (1, ELF_MACHINE[target])     # a relocatable object
    if shutil.which("file"):
        described = subprocess.run(["file", str(tmp_path / "net.o")], capture_output=True, text=True).stdout
        assert "relocatable" in described and ("x86-64" if target == "x86" else "aarch64") in described


@pytest.mark.skipif("bfdot2" not in native_tiles(pf.Target.parse("host")),
                    reason="the host has no AMX-BF16 tiles (or Linux does not grant them)")
@pytest.mark.parametrize("threads", [False, True], ids=["1-thread", "thread-pool"])
def test_a_bf16_bundle_asks_linux_for_the_amx_tiles_its_kernels_use(threads, tmp_path):
    """main.c never asks for the tiles; the entry point does (else: SIGILL)."""
    feed = {"x": randn(64, 128)}
    compiled, run = build_and_run(wide_mlp(), feed, "x86", tmp_path, threads, precision="bf16")
    assert "tile bfdot2(" in compiled.dump("loops")
    assert_prints_the_same(compiled, run, feed)


@pytest.mark.parametrize("target", TARGETS)
def test_mlp_bundle_with_symbolic_batch_fixed_at_build(target, tmp_path):
    feed = {"x": randn(3, 16)}
    compiled, run = build_and_run(mlp(batch="batch"), feed, target, tmp_path)
    assert_prints_the_same(compiled, run, feed)
    header = (tmp_path / "net.h").read_text()
    assert '{"x", "float32", 2, {3, 16}, 192u}' in header and "#define NET_INPUT_X_SIZE 192u" in header


@pytest.mark.parametrize("target", TARGETS)
def test_threaded_bundle_runs_its_kernels_on_the_pool(target, tmp_path):
    feed = {"x": randn(64, 128)}
    compiled, run = build_and_run(wide_mlp(), feed, target, tmp_path, threads=True,
                                  env={"POLYFUSE_NUM_THREADS": "3"})
    assert_prints_the_same(compiled, run, feed)
    assert "polyfuse_parallel_for_threads" in compiled.dump("llvm")   # kernels call the pool
    nm = shutil.which("aarch64-linux-gnu-nm" if target == "aarch64" else "nm")
    if nm:
        symbols = subprocess.run([nm, str(tmp_path / "net.o")], capture_output=True, text=True).stdout
        assert "W polyfuse_parallel_for_threads" in symbols and "U pthread_create" in symbols
        assert "T net" in symbols.replace("\n", " \n")


@pytest.mark.parametrize("target", TARGETS)
def test_outputs_that_are_copies_constants_and_gathers(target, tmp_path):
    feed = {"x": randn(2, 5), "idx": np.array([3, 0, -1], np.int64), "d": np.arange(4.0)}
    compiled, run = build_and_run(odd_outputs(), feed, target, tmp_path)
    assert_prints_the_same(compiled, run, feed)
    np.testing.assert_array_equal(compiled.run(feed)["g"], np.array([[90, 100, 110], [0, 10, 20], [90, 100, 110]]))


@pytest.mark.parametrize("target", TARGETS)
def test_an_out_of_bounds_index_makes_the_entry_point_fail(target, tmp_path):
    feed = {"x": randn(2, 5), "idx": np.array([0, 7, 1], np.int64), "d": np.arange(4.0)}
    compiled, run = build_and_run(odd_outputs(), feed, target, tmp_path)
    assert run.returncode == 1 and "read a tensor out of bounds" in run.stderr
    with pytest.raises(pf.BoundsError):
        compiled.run(feed)


@pytest.mark.parametrize("target", TARGETS)
def test_lstm_bundle_reads_time_steps_as_views_at_offsets(target, tmp_path):
    """The steps read their rows of the projection (in the arena) and each direction's
    initial state (an input) at an offset."""
    from tests.onnx.ort_compare import onnxruntime_outputs
    from tests.onnx.test_ops_recurrent_nets import _model
    model, feed = _model("LSTM", steps=4, batch=2, size=3, hidden=5, direction="bidirectional",
                         initial=True, lens=[4, 3])
    compiled, run = build_and_run(model, feed, target, tmp_path)
    assert_prints_the_same(compiled, run, feed)
    for got, want in zip(compiled.run(feed).values(), onnxruntime_outputs(model, feed)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_cli_writes_an_aarch64_bundle(tmp_path, capsys):
    from polyfuse.cli import main
    path = tmp_path / "cnn.onnx"
    onnx.save(cnn(), path)
    assert main(["compile", str(path), "--target", "aarch64", "-o", str(tmp_path / "out")]) == 0
    assert "model.o model.h model.weights.bin main.c" in capsys.readouterr().out
    assert elf_header(tmp_path / "out" / "model.o") == (1, 0xB7)
    header = (tmp_path / "out" / "model.h").read_text()
    assert "int model(const uint8_t *weights" in header and "#define MODEL_THREADS 0" in header
    assert (tmp_path / "out" / "model.weights.bin").stat().st_size == int(
        header.split("MODEL_WEIGHTS_SIZE ")[1].split("u")[0])


def test_bundles_refuse_other_targets_and_bad_names(tmp_path):
    with pytest.raises(pf.TargetError, match="x86 or aarch64"):
        write_bundle(pf.compile(cnn(), target="reference"), tmp_path)
    for bad in ("my-net", "main", "int", "polyfuse_entry"):
        with pytest.raises(pf.ArgumentError, match="C identifier"):
            write_bundle(pf.compile(cnn(), target="x86"), tmp_path, bad)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(pf.ArgumentError, match="cannot write the bundle into .*a-file: File exists"):
        write_bundle(pf.compile(cnn(), target="x86"), tmp_path / "a-file")
    with pytest.raises(pf.ArgumentError, match="input shapes"):
        write_bundle(pf.compile(mlp(batch="batch"), target="x86"), tmp_path)


@pytest.mark.unit
@pytest.mark.skipif(os.uname().machine == "aarch64" or not shutil.which("qemu-aarch64"),
                    reason="aarch64 programs run under qemu-aarch64 only on other machines")
@pytest.mark.parametrize("target, cpu", [("aarch64", "neoverse-n1"), ("aarch64+sve", "a64fx"),
                                         ("aarch64:cortex-a72", "cortex-a72"),
                                         ("aarch64+i8mm", "max"), ("aarch64:cortex-a72+dotprod", "max")])
def test_qemu_emulates_the_named_cpu_unless_the_spec_adds_features(target, cpu):
    prefix = runner_prefix(pf.Target.parse(target))
    assert prefix[1:3] == ["-cpu", cpu]
