"""aarch64 code run under qemu-user (or natively on an ARM machine) against the reference
interpreter, with NEON and SVE, and the errors when the tools to run it are missing."""

import os

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.runtime import cross
from polyfuse.scheduler.options import MappingOptions
from tests.arm_tools import needs_arm_tools
from tests.tc_programs import PROGRAMS
from tests.targets.test_x86 import as_tuple, assert_close


SVE_PROGRAMS = ("matmul", "softmax", "fp16_matmul", "conv2d_stride2", "gelu_tanh", "math_builtins",
                "int32_sum")


def _compare(program, target, options=None):
    args = program.make_inputs(np.random.default_rng(0))
    want = as_tuple(getattr(pf.define(program.source), program.entry)(*args))
    mod = pf.define(program.source, target=target, options=options)
    got = as_tuple(getattr(mod, program.entry)(*args))
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, f"{program.name} output {k} on {target}")


@needs_arm_tools
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_canonical_program_on_aarch64(program):
    _compare(program, "aarch64")


@needs_arm_tools
@pytest.mark.parametrize("name", SVE_PROGRAMS)
def test_canonical_program_with_sve(name):
    program = next(p for p in PROGRAMS if p.name == name)
    spec_args = program.make_inputs(np.random.default_rng(0))
    spec = getattr(pf.define(program.source, target="aarch64+sve"), program.entry).specialize(*spec_args)
    if name in ("gelu_tanh", "math_builtins"):   # vector loops became scalable SVE code
        assert "vscale" in spec.stages["llvm_opt"] and "z0." in spec.stages["asm"], name
    _compare(program, "aarch64+sve")


@needs_arm_tools
def test_tiled_unrolled_threaded_schedule_on_aarch64():
    program = next(p for p in PROGRAMS if p.name == "matmul")
    _compare(program, "aarch64:cortex-a72",
             MappingOptions(tile_sizes=(3, 5, 2), vector_width=4, unroll=4, num_threads=2))


@needs_arm_tools
def test_an_index_out_of_bounds_under_qemu_is_a_bounds_error():
    mod = pf.define("def gather(float(N) X, int32(M) I) -> (Y) { Y(m) = X(I(m)) }", target="aarch64")
    X = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(mod.gather(X, np.array([4, 0, 2], np.int32)), [4, 0, 2])
    with pytest.raises(pf.BoundsError, match="out of bounds"):
        mod.gather(X, np.array([1, 5], np.int32))


def test_without_the_tools_compiling_works_and_running_says_what_to_install(monkeypatch):
    if os.uname().machine == "aarch64":
        pytest.skip("aarch64 code runs natively here")
    monkeypatch.setattr(cross, "_tool", lambda name: None)
    mod = pf.define("def scale(float(N) X) -> (Y) { Y(n) = 2 * X(n) }", target="aarch64")
    X = np.ones(7, np.float32)
    spec = mod.scale.specialize(X)
    assert "ret" in spec.stages["asm"] and 'triple = "aarch64' in spec.stages["llvm"]
    assert spec.run.object[:4] == b"\x7fELF" and spec.run.object[18] == 0xB7   # EM_AARCH64
    with pytest.raises(pf.TargetError, match="apt-get install -y qemu-user"):
        mod.scale(X)


@pytest.mark.unit
def test_target_specs_parse_and_print_back():
    for spec, cpu, features in [("aarch64", "neoverse-n1", ("neon",)),
                                ("aarch64+sve", "a64fx", ("neon", "sve")),
                                ("aarch64:cortex-a72", "cortex-a72", ("neon",)),
                                ("x86:skylake-avx512", "skylake-avx512", ())]:
        t = pf.Target.parse(spec)
        assert (t.cpu, t.features, str(t)) == (cpu, features, spec)
    host = pf.Target.parse("host")     # this machine's own CPU and features
    assert host.cpu == "" and host.features == () and pf.Target.parse(str(host)) == host
    from polyfuse.targets.target import TRIPLES
    assert str(pf.Target("aarch64", TRIPLES["aarch64"])) == "host"   # "host" on an ARM machine
    for bad in ("cuda+sve", "arm", "aarch64+", "reference:x"):
        with pytest.raises(pf.TargetError, match="unknown target"):
            pf.Target.parse(bad)


def test_a_model_compiles_for_aarch64_without_the_tools_and_running_says_so(monkeypatch):
    if os.uname().machine == "aarch64":
        pytest.skip("aarch64 code runs natively here")
    from tests.onnx.test_frontend import mlp
    monkeypatch.setattr(cross, "_tool", lambda name: None)
    compiled = pf.compile(mlp(), target="aarch64", input_shapes={"x": (2, 16)})
    assert 'triple = "aarch64' in compiled.dump("llvm") and "%xmm" not in compiled.dump("asm")
    with pytest.raises(pf.TargetError, match="qemu-user"):
        compiled.run({"x": np.ones((2, 16), np.float32)})


@pytest.mark.unit
def test_tuning_refuses_code_that_runs_here_only_under_an_emulator(tmp_path):
    if os.uname().machine == "aarch64":
        pytest.skip("aarch64 code runs natively here")
    from polyfuse.autotune.task import Task
    from polyfuse.autotune.tuner import tune
    d = next(iter(pf.define("def f(float(N) X) -> (Y) { Y(n) = X(n) * 2 }"))).definition
    task = Task.of(d, [np.ones(64, np.float32)], "aarch64")
    with pytest.raises(pf.OptionError, match="only under an emulator"):
        tune(task, tmp_path / "records.jsonl")
    assert not (tmp_path / "records.jsonl").exists()
