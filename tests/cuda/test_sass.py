"""The static view of cuda kernels, no GPU needed: ptxas's resource report and the SASS
instruction mix (polyfuse.targets.cuda_sass), on known text and on compiled kernels."""

import os

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.targets.cuda_sass import Mix, Resources, instruction_mix, nvdisasm, resources

# CI installs the dev extra, nvidia-cuda-nvdisasm with it: there these tests must run
needs_nvdisasm = pytest.mark.skipif(nvdisasm() is None and not os.environ.get("CI"),
                                    reason="needs nvdisasm (pip install nvidia-cuda-nvdisasm)")

REPORT = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k_0' for 'sm_90'
ptxas info    : Function properties for k_0
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 8448 bytes smem
ptxas info    : Compiling entry function 'k_1' for 'sm_90'
ptxas info    : Function properties for k_1
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers
ptxas info    : Compiling entry function 'k_2' for 'sm_90'
ptxas info    : Function properties for k_2
ptxas         .     8 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 8 bytes cumulative stack size, 12416 bytes smem"""

SASS = """\
        .section        .text.k_0,"ax",@progbits
.text.k_0:
        /*0000*/                   S2R R0, SR_TID.X ;
.L_x_1:
        /*0010*/                   LDS.128 R4, [R2] ;
        /*0020*/                   FFMA R8, R4, R5, R8 ;
        /*0030*/                   FFMA R9, R6, R7, R9 ;
.L_x_2:
        /*0040*/                   LDS R4, [R3] ;
        /*0050*/                   FFMA R8, R4, R4, R8 ;
        /*0060*/               @P0 BRA `(.L_x_2) ;
        /*0070*/              @!P1 BRA `(.L_x_1) ;
        /*0080*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0090*/                   EXIT ;
.L_x_3:
        /*00a0*/                   BRA `(.L_x_3);
"""


@pytest.mark.unit
def test_the_resource_report_is_read_per_function():
    assert resources(REPORT) == {"k_0": Resources(255, 8448, 1, 16, 8, 4), "k_1": Resources(12),
                                 "k_2": Resources(255, 12416, 1, 8, 8, 8)}


@pytest.mark.unit
def test_the_innermost_loop_that_works_is_found():
    mix = instruction_mix(SASS)["k_0"]
    assert mix.inner_loop == {"LDS": 1, "FFMA": 1, "BRA": 1}    # not the last BRA to itself
    assert Mix.count(mix.instructions, "LDS") == 2 and mix.instructions["LDS.128"] == 1
    assert Mix.count(mix.instructions, "FFMA") == 3 and Mix.count(mix.instructions, "LDG") == 1
    assert Mix.count(mix.instructions, "BRA") == 3


@needs_nvdisasm
def test_a_cuda_matmul_shows_its_resources_and_inner_loop():
    mm = pf.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
                   target="cuda").mm
    spec = mm.specialize(np.zeros((256, 128), np.float32), np.zeros((128, 64), np.float32))
    (used,) = resources(spec.stages["ptxas"]).values()
    assert used.registers > 8 and used.shared_bytes >= 2 * 32 * 32 * 4 and used.spill_stores == 0
    (mix,) = instruction_mix(spec.stages["sass"]).values()
    # the k loop multiplies shared tiles: its products fuse into FFMA, its operands come
    # from shared memory (LDS), and none from global memory (they are copied there, and
    # the accumulators start at zero, not from C's zeros)
    assert Mix.count(mix.inner_loop, "FFMA") >= 4 and Mix.count(mix.inner_loop, "LDS") >= 2
    assert Mix.count(mix.inner_loop, "LDG") == 0 and Mix.count(mix.instructions, "LDGSTS") >= 2
    assert Mix.count(mix.instructions, "LDG") == 0


@needs_nvdisasm
def test_an_elementwise_kernel_loads_and_stores_without_products():
    add = pf.define("def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }", target="cuda").add
    spec = add.specialize(np.zeros(4096, np.float32), np.zeros(4096, np.float32))
    (mix,) = instruction_mix(spec.stages["sass"]).values()
    assert Mix.count(mix.instructions, "FADD") >= 1 and Mix.count(mix.instructions, "FFMA") == 0
    assert Mix.count(mix.instructions, "LDG") >= 2 and Mix.count(mix.instructions, "STG") >= 1
    assert Mix.count(mix.instructions, "LDS") == 0


@pytest.fixture(scope="module")
def float32_matmul_4096():
    mm = pf.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
                   target="cuda").mm
    big = np.zeros((4096, 4096), np.float32)
    spec = mm.specialize(big, big)
    (used,) = resources(spec.stages["ptxas"]).values()
    (mix,) = instruction_mix(spec.stages["sass"]).values()
    return used, mix


@needs_nvdisasm
def test_a_float32_matmul_does_many_ffma_per_shared_load(float32_matmul_4096):
    """Issue 37: each thread keeps an 8 x 8 tile of accumulators in registers through the
    whole reduction, so one shared load (128 bits: four floats of a row) serves a row or
    column of it. One thread per output did 4 FFMA to 8 LDS."""
    _, mix = float32_matmul_4096
    ffma, lds = Mix.count(mix.inner_loop, "FFMA"), Mix.count(mix.inner_loop, "LDS")
    assert lds and ffma / lds >= 8, mix.inner_loop
    assert mix.inner_loop["LDS.128"] >= lds // 2


@needs_nvdisasm
def test_a_float32_matmul_copies_its_tiles_asynchronously(float32_matmul_4096):
    """Issue 37: two stages of shared tiles, the next step's filled by cp.async (LDGSTS)
    during this step's products."""
    _, mix = float32_matmul_4096
    assert Mix.count(mix.instructions, "LDGSTS") >= 8
    assert Mix.count(mix.inner_loop, "LDGSTS") == 0   # not among the products
    # whole rows of 16-byte words: 128-bit copies (the 32-bit ones: where the buffer's
    # address or the box's offset is not on a word, tested at run time)
    assert sum(n for op, n in mix.instructions.items() if op.startswith("LDGSTS") and ".128" in op) >= 4


@needs_nvdisasm
def test_a_float32_matmul_keeps_its_accumulators_without_spills(float32_matmul_4096):
    used, mix = float32_matmul_4096
    assert used.spill_stores == used.spill_loads == 0 and used.stack_bytes == 0
    assert Mix.count(mix.instructions, "LDL") == Mix.count(mix.instructions, "STL") == 0
    assert 64 < used.registers <= 255 and used.registers * 256 <= 65536   # 64 accumulators, 256 threads


ROW_PIPELINES = {
    "softmax": """def softmax(float(N,D) X) -> (Y, mx, sm) {
        mx(n) max=! X(n,d)
        Y(n,d) = exp(X(n,d) - mx(n))
        sm(n) +=! Y(n,d)
        Y(n,d) = Y(n,d) / sm(n)
    }""",
    "log_softmax": """def log_softmax(float(N,D) X) -> (Y, mx, sm) {
        mx(n) max=! X(n,d)
        sm(n) +=! exp(X(n,d) - mx(n))
        Y(n,d) = X(n,d) - mx(n) - log(sm(n))
    }""",
    "layernorm": """def layernorm(float(N,D) X, float(D) g, float(D) b) -> (Y, mean, var) {
        mean(n) +=! X(n,d) / float(D)
        var(n) +=! (X(n,d) - mean(n)) * (X(n,d) - mean(n)) / float(D)
        Y(n,d) = (X(n,d) - mean(n)) * rsqrt(var(n) + 1e-5) * g(d) + b(d)
    }""",
    "rmsnorm": """def rmsnorm(float(N,D) X, float(D) g) -> (Y, ms) {
        ms(n) +=! X(n,d) * X(n,d) / float(D)
        Y(n,d) = X(n,d) * rsqrt(ms(n) + 1e-6) * g(d)
    }""",
}


@needs_nvdisasm
@pytest.mark.parametrize("name", ROW_PIPELINES)
def test_a_row_pipeline_is_one_launch_that_shuffles(name):
    """Issue 37: softmax, log-softmax, layernorm and RMSNorm over 16384 rows of 1024 run
    as one launch, a row per block, its reductions combined by warp shuffles (SHFL)
    where it took five launches and trees in shared memory."""
    kernel = getattr(pf.define(ROW_PIPELINES[name], target="cuda"), name)
    x = np.zeros((16384, 1024), np.float32)
    spec = kernel.specialize(x, *[np.zeros(1024, np.float32)] * (len(kernel.definition.inputs) - 1))
    (mix,) = instruction_mix(spec.stages["sass"]).values()
    assert Mix.count(mix.instructions, "SHFL") >= 5 * (name != "rmsnorm" and 2 or 1)
    assert Mix.count(mix.instructions, "LDL") == Mix.count(mix.instructions, "STL") == 0
