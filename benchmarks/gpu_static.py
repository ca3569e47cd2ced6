"""Static GPU check, no GPU needed: what ptxas and nvdisasm make of each kernel that
``benchmarks/gpu_check.py`` times, compiled by NVRTC for sm_90.

    python benchmarks/gpu_static.py

Per kernel: its launches, the most registers and static shared memory a launch uses,
spilled bytes, and the instructions of the busiest launch's innermost loop: FFMA, LDS
(shared loads; ``.128`` ones counted apart), FFMA per LDS, tensor-core products (HMMA)
and ``ldmatrix`` loads (LDSM), and global loads (LDG) of
which 128 bits wide; over all launches, asynchronous copies to shared memory (LDGSTS,
cp.async) and warp shuffles (SHFL). A register-tiled matmul reads 128-bit words from shared memory and
does eight or more FFMA per LDS; one thread per output element does about one half.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    import ml_dtypes
    from gpu_check import _cases
    from polyfuse.runtime.arguments import placeholder
    from polyfuse.targets.cuda_sass import Mix, instruction_mix, resources

    header = ["kernel", "launches", "registers", "smem B", "spills B", "loop FFMA", "loop HMMA", "loop LDSM", "loop LDS (.128)",
              "FFMA:LDS", "LDG (.128)", "LDGSTS (.128)", "SHFL"]
    rows = []
    for case in _cases():
        dtype = ml_dtypes.bfloat16 if case.dtype == "bfloat16" else np.dtype(case.dtype)
        spec = case.kernel().specialize(*(placeholder(s, dtype) for s in case.shapes), *case.scalars)
        used = resources(spec.stages["ptxas"])
        mixes = instruction_mix(spec.stages["sass"])

        def total(op: str) -> int:
            return sum(Mix.count(m.instructions, op) for m in mixes.values())
        busiest = max(mixes.values(), key=lambda m: Mix.count(m.inner_loop, "FFMA") + sum(m.inner_loop.values()))
        loop, every = busiest.inner_loop, busiest.instructions
        ffma, lds, hmma = Mix.count(loop, "FFMA"), Mix.count(loop, "LDS"), Mix.count(loop, "HMMA")
        rows.append([case.label, str(len(mixes)), str(max(r.registers for r in used.values())),
                     str(max(r.shared_bytes for r in used.values())),
                     str(sum(r.spill_stores + r.spill_loads for r in used.values())),
                     str(ffma), str(hmma), str(Mix.count(loop, "LDSM")), f"{lds} ({loop['LDS.128']})", f"{ffma / lds:.2f}" if lds else "-",
                     f"{Mix.count(every, 'LDG')} ({Mix.count(every, 'LDG.E.128')})",
                     f"{total('LDGSTS')} ({sum(n for m in mixes.values() for op, n in m.instructions.items() if op.startswith('LDGSTS') and '.128' in op)})",
                     str(total("SHFL"))])
        print(" | ".join(rows[-1]), flush=True)
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]
    print()
    for r in [header, ["-" * w for w in widths], *rows]:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")


if __name__ == "__main__":
    main()
