"""Every canonical TC program and every ONNX test model compiles for CUDA, without a GPU:
CUDA C generated, NVRTC compiles it to PTX and a cubin, ptxas accepts the PTX."""

import re

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.runtime.arguments import placeholder
from tests.cuda.helpers import arguments, assert_ptxas_accepts, kernel
from tests.onnx.test_models import causal_self_attention, cnn, mlp, transformer_block
from tests.tc_programs import PROGRAMS, PROGRAMS_BY_NAME


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_canonical_program_compiles_for_cuda(program, tmp_path):
    spec = kernel(program).specialize(*arguments(program))
    launches = re.findall(r'extern "C" __global__ void __launch_bounds__\((\d+)\) (\w+)\(',
                          spec.stages["cuda"])
    assert launches and all(name.startswith(program.entry + "_") for _, name in launches)
    assert all(1 <= int(threads) <= 1024 for threads, _ in launches)
    assert ".target sm_90" in spec.stages["ptx"]
    assert all(f".entry {name}(" in spec.stages["ptx"] for _, name in launches)
    size = int(re.match(r"cubin sm_90 (\d+) bytes", spec.stages["cubin"]).group(1))
    assert size > 1000
    assert_ptxas_accepts(spec.stages["ptx"], tmp_path)


MODELS = {"cnn": (cnn, {"x": (1, 3, 32, 32)}),
          "transformer_block": (lambda: transformer_block(gelu_op=False), {"x": (2, 16, 32), "mask": (2, 16)}),
          "transformer_block_gelu_op": (lambda: transformer_block(gelu_op=True), {"x": (1, 7, 32), "mask": (1, 7)}),
          "causal_self_attention": (causal_self_attention, {"x": (2, 16, 32)}),
          "mlp": (lambda: mlp(batch="batch"), {"x": (7, 16)})}


@pytest.mark.parametrize("name", MODELS)
def test_model_kernels_compile_for_cuda(name, tmp_path):
    build, shapes = MODELS[name]
    compiled = pf.compile(build(), target="cuda", input_shapes=shapes)
    tasks = compiled.tasks()
    assert tasks
    for task in tasks:  # each kernel of the plan; specializing again hits the compiled cache
        k = pf.define(task.source, target="cuda")[task.entry]
        spec = k.specialize(*(placeholder(s, np.dtype(dt)) for s, dt in zip(task.shapes, task.dtypes)))
        assert "__global__" in spec.stages["cuda"] and ".entry" in spec.stages["ptx"]
        assert_ptxas_accepts(spec.stages["ptx"], tmp_path)


def test_running_without_a_gpu_is_a_device_error_but_compiling_works():
    from polyfuse.targets.cuda_driver import available_device
    if available_device() is not None:
        pytest.skip("this machine has a GPU")
    program = PROGRAMS_BY_NAME["matmul"]
    k = kernel(program)
    assert f"functions: {program.entry}_0" in k.specialize(*arguments(program)).stages["cubin"]
    with pytest.raises(pf.DeviceError, match="no CUDA driver|sees no GPU") as err:
        k(*arguments(program))
    assert isinstance(err.value, pf.TargetError)


def test_stages_name_every_level():
    mod = pf.define("def scale(float(N) X, float s) -> (Y) { Y(i) = X(i) * s }", target="cuda")
    spec = mod.scale.specialize(np.ones(1000, np.float32), 2.0)
    assert {"source", "loops", "gpu", "cuda", "ptx", "cubin", "options"} <= set(spec.stages)
    assert "thread.x for" in spec.stages["gpu"]
    assert "float s" in spec.stages["cuda"] and "blockIdx.x" in spec.stages["cuda"]


def test_the_disk_cache_serves_a_second_process(tmp_path, monkeypatch):
    from polyfuse.runtime import cuda
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", str(tmp_path))
    source = "def addone(float(N) X) -> (Y) { Y(i) = X(i) + 1.0 }"
    x = np.ones(777, np.float32)
    first = pf.define(source, target="cuda").addone.specialize(x).stages["ptx"]
    cuda._COMPILED.clear()  # as if in a new process
    before = dict(cuda.STATS)
    again = pf.define(source, target="cuda").addone.specialize(x).stages["ptx"]
    assert again == first
    assert cuda.STATS["disk"] == before["disk"] + 1 and cuda.STATS["compiled"] == before["compiled"]
