"""Tune a matmul's schedule, then compile with the records: the autotuner's round trip.

The same as ``polyfuse tune mm.tc --input-shapes "A:[256,256] B:[256,256]" --trials 12
-o records.jsonl`` followed by ``polyfuse.define(..., tuning_records="records.jsonl")``.
"""

import tempfile
from pathlib import Path

import numpy as np

import polyfuse as pf
from polyfuse.autotune.records import load
from polyfuse.autotune.task import Task
from polyfuse.autotune.tuner import TuneConfig, tune
from polyfuse.frontends.tc import parse

SOURCE = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
rng = np.random.default_rng(0)
a = rng.standard_normal((256, 256)).astype(np.float32)
b = rng.standard_normal((256, 256)).astype(np.float32)

records = Path(tempfile.mkdtemp()) / "records.jsonl"
task = Task.of(parse(SOURCE)["mm"], [a, b], target="x86")
result = tune(task, records, TuneConfig(trials=12, number=3, repeat=3, seed=0))
print(f"{result.trials} trials in {result.seconds:.1f} s: best {result.best.cost * 1e3:.3f} ms, "
      f"default {result.default_cost * 1e3:.3f} ms")
for r in sorted(load(records), key=lambda r: r.cost)[:3]:
    print(f"  {r.cost * 1e3:8.3f} ms  {r.error:<12} tiles {r.options.tile_sizes} "
          f"registers {r.options.register_tile} vector {r.options.vector_width}")

tuned = pf.define(SOURCE, target="host", tuning_records=records)
np.testing.assert_allclose(tuned.mm(a, b), a @ b, rtol=1e-3, atol=1e-3)
print("compiled with the best record:", tuned.mm.specialize(a, b).stages["options"])
