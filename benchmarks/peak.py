"""This machine's float32 FMA peak, measured: a register-only loop of fused multiply-adds
(independent accumulators of the widest vector the CPU has, as many as its registers hold
beside the two operands, no memory traffic) compiled with LLVM for the host CPU and run
on 1..N threads at once.

    python benchmarks/peak.py [--threads 2]

The benchmarks report kernels' GFLOP/s as a fraction of this number (``fma_peak``),
measured just before each kernel is timed.
"""

from __future__ import annotations

import argparse
import ctypes
import threading
import time
from functools import lru_cache

import llvmlite.binding as llvm

# independent FMA chains: more than latency x pipes on any x86 or ARM core, and no more
# than the vector registers hold beside the two operands (24 of AVX2's 16 spilled: Zen 3
# measured 58 GFLOP/s a core where its two FMA pipes give 90)
ACCUMULATORS_32_REGISTERS = 24
ACCUMULATORS_16_REGISTERS = 12
ITERATIONS = 1 << 22       # per run: long enough to swamp thread start-up


def _vector_lanes(features: str) -> int:
    return 16 if "+avx512f" in features.split(",") else 8 if "+avx" in features.split(",") else 4


def _accumulators(features: str) -> int:
    """FMA chains for a CPU with these LLVM features: x86 without AVX-512 has 16 vector
    registers, AVX-512 and AArch64 32."""
    x86 = llvm.get_process_triple().startswith("x86_64")
    return ACCUMULATORS_16_REGISTERS if x86 and "+avx512f" not in features.split(",") else ACCUMULATORS_32_REGISTERS


_IR = """
define float @fma_loop(i64 %n) {{
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %loop]
{phis}
{fmas}
  %next = add i64 %i, 1
  %done = icmp eq i64 %next, %n
  br i1 %done, label %exit, label %loop
exit:
{sum}
  %r = extractelement <{w} x float> %s{last}, i32 0
  ret float %r
}}
declare <{w} x float> @llvm.fma.v{w}f32(<{w} x float>, <{w} x float>, <{w} x float>)
"""


@lru_cache(maxsize=1)
def _kernel() -> tuple[ctypes.CFUNCTYPE, tuple[int, int], object]:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    features = llvm.get_host_cpu_features().flatten()
    w, n = _vector_lanes(features), _accumulators(features)
    x, y = f"<{w} x float> splat (float 0x3FF0000020000000)", f"<{w} x float> splat (float 0x3E80000000000000)"
    phis = "\n".join(f"  %a{k} = phi <{w} x float> [zeroinitializer, %entry], [%b{k}, %loop]"
                     for k in range(n))
    fmas = "\n".join(f"  %b{k} = call <{w} x float> @llvm.fma.v{w}f32(<{w} x float> %a{k}, {x}, {y})"
                     for k in range(n))
    sums = [f"  %s0 = fadd <{w} x float> %b0, %b1"]
    sums += [f"  %s{k - 1} = fadd <{w} x float> %s{k - 2}, %b{k}" for k in range(2, n)]
    ir = _IR.format(w=w, phis=phis, fmas=fmas, sum="\n".join(sums), last=n - 2)
    target = llvm.Target.from_default_triple()
    machine = target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=features, opt=3)
    module = llvm.parse_assembly(ir)
    module.verify()
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    fn = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64)(engine.get_function_address("fma_loop"))
    return fn, (w, n), engine


def fma_peak(threads: int = 1) -> float:
    """The peak of ``threads`` cores now: the GFLOP/s of that many threads each running the
    FMA loop at once, or that many times one thread's, whichever is higher (a core another
    process is using makes the first too low). Measured afresh on each call (about a
    quarter of a second): a virtual machine's speed drifts by 15-30% over minutes, so the
    benchmarks measure it just before each kernel they divide by it."""
    alone = _measured(1)
    return max(alone * threads, _measured(threads)) if threads > 1 else alone


def _measured(threads: int) -> float:
    """GFLOP/s of ``threads`` threads each running the FMA loop (best of 5 runs)."""
    fn, (lanes, chains), _ = _kernel()
    flops = 2.0 * lanes * chains * ITERATIONS * threads
    best = float("inf")
    for _ in range(5):
        workers = [threading.Thread(target=fn, args=(ITERATIONS,)) for _ in range(threads)]
        start = time.perf_counter()
        for t in workers:
            t.start()   # ctypes releases the GIL for the call
        for t in workers:
            t.join()
        best = min(best, time.perf_counter() - start)
    return flops / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    for n in range(1, args.threads + 1):
        print(f"{n} thread{'s' if n > 1 else ''}: {fma_peak(n):7.1f} GFLOP/s float32 FMA peak")


if __name__ == "__main__":
    main()
