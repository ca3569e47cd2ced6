"""Where a model's compile time goes: per stage, cold and from the disk cache.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/compile_time.py \\
        [--only resnet50,densenet121] [--cache ~/.cache/polyfuse-zoo]

Models are benchmarks/zoo.py's exports (``python benchmarks/zoo.py --only NAME`` makes
one that is missing; default: ResNet-50, DenseNet-121, MobileNetV3-Small, RegNetY-400MF,
BERT-base). Each is compiled for ``target="host"`` in a process of its own (so nothing
compiled before is in memory), twice: cold, with a new empty ``POLYFUSE_CACHE_DIR``,
and again in a second process from the cache the first one filled.

The columns (seconds):

- **load**: ``pf.compile`` itself: reading the ONNX file, onnx's checker and shape
  inference, the front end and the graph passes.
- **plan**: lowering the graph for the input shapes: fusion, the ops' definitions,
  composition, memory (``Planner.plan``).
- **kernels**: compiling the plan's kernels (wall time, on the compile threads), and the
  program that runs them; split below into thread-seconds, which overlap when
  :data:`polyfuse.runtime.compile_threads.THREADS` > 1:
  - **isl**: dependences, the schedule, the AST and the bounds proofs (``schedule_definition``
    less its loop passes),
  - **passes**: the loop passes (``run_loop_passes``),
  - **emit**: writing the LLVM IR,
  - **opt**: LLVM's optimization pipeline,
  - **codegen**: LLVM's code generation and the rest of ``compile_object``,
  - **load obj**: linking the objects into the process (JIT).
- **run**: the first call less the above (packing weights, the first execution).
- **total**: ``pf.compile`` to the first result; **cached**: the same in the second process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ("resnet50", "densenet121", "mobilenet_v3_small", "regnet_y_400mf", "bert")
COLUMNS = ("load", "plan", "kernels", "isl", "passes", "emit", "opt", "codegen", "load obj", "run", "total")


class Clock:
    """Seconds per stage, summed over threads; a stage inside another is subtracted from it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, owner: object, attribute: str, stage: str, within: str | None = None) -> None:
        original = getattr(owner, attribute)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                self.seconds[stage] += spent
                if within is not None:
                    self.seconds[within] -= spent

        setattr(owner, attribute, timed)


def child(path: str, cache: str) -> None:
    """One compile and first call of ``path`` in this process; prints the stages as JSON."""
    os.environ["POLYFUSE_CACHE_DIR"] = cache
    import numpy as np
    import onnx

    import polyfuse as pf
    from polyfuse.lowering import plan as lowering_plan
    from polyfuse.runtime import cpu as runtime_cpu
    from polyfuse.runtime import model as runtime_model
    from polyfuse.scheduler import pipeline
    from polyfuse.targets import cpu as targets_cpu

    clock = Clock()
    clock.wrap(runtime_cpu, "schedule_definition", "isl")
    clock.wrap(pipeline, "run_loop_passes", "passes", within="isl")
    clock.wrap(runtime_cpu, "emit_llvm", "emit")
    clock.wrap(targets_cpu, "compile_object", "codegen")
    clock.wrap(targets_cpu, "optimize", "opt", within="codegen")
    clock.wrap(runtime_cpu, "load_object", "load obj")
    clock.wrap(targets_cpu, "load_object", "load obj")
    clock.wrap(lowering_plan, "plan_graph", "plan")
    clock.wrap(runtime_model, "_compile_plan", "kernels")

    proto = onnx.load(path, load_external_data=False)
    feed = {}
    rng = np.random.default_rng(0)
    initializers = {t.name for t in proto.graph.initializer}
    for v in proto.graph.input:
        if v.name in initializers:
            continue
        t = v.type.tensor_type
        shape = [d.dim_value or 1 for d in t.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        feed[v.name] = rng.integers(0, 1000, shape).astype(dtype) if np.issubdtype(dtype, np.integer) \
            else rng.standard_normal(shape).astype(dtype)
    del proto
    start = time.perf_counter()
    model = pf.compile(path, target="host")
    loaded = time.perf_counter()
    model.run(feed)
    end = time.perf_counter()
    times = dict(clock.seconds)
    times["load"] = loaded - start
    times["total"] = end - start
    times["run"] = end - loaded - times.get("plan", 0.0) - times.get("kernels", 0.0)
    print(json.dumps(times))


def measure(path: Path, cache: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, __file__, "--child", str(path), cache], capture_output=True,
                          text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed")
    return json.loads(done.stdout.strip().splitlines()[-1])


def machine() -> str:
    """The CPU as lscpu names it, and the commit measured."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    info = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    return (f"machine: {info.get('Model name', '?')}, {os.cpu_count()} CPUs, L2 {info.get('L2 cache', '?')}; "
            f"polyfuse {commit}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(DEFAULT))
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "polyfuse-zoo")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    print(machine())
    header = ["model", *COLUMNS, "cached"]
    rows = []
    for name in args.only.split(","):
        path = args.cache / f"{name}.onnx"
        if not path.exists():
            rows.append([name, f"missing: python benchmarks/zoo.py --only {name}"])
            continue
        with tempfile.TemporaryDirectory(prefix="polyfuse-compile-") as cache:
            try:
                cold = measure(path, cache)
                warm = measure(path, cache)
            except RuntimeError as err:
                rows.append([name, f"failed: {err}"])
                continue
        rows.append([name, *(f"{cold.get(c, 0.0):.2f}" for c in COLUMNS), f"{warm['total']:.2f}"])
        print(" | ".join(rows[-1]), flush=True)
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
