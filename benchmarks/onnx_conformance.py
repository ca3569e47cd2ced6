"""The official ONNX node tests through polyfuse.backend: pass counts per op.

    python benchmarks/onnx_conformance.py [--target host|reference] [--failures]

Every case runs (none is skipped for unsupported ops here), so the counts are of the
whole suite the installed onnx wheel builds.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
import unittest

import onnx.backend.test


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="host")
    parser.add_argument("--failures", action="store_true", help="list failing cases")
    args = parser.parse_args()
    os.environ["POLYFUSE_BACKEND_TARGET"] = args.target
    import polyfuse.backend

    suite_builder = onnx.backend.test.BackendTest(polyfuse.backend, "conformance")
    suite_builder.include(r"^test_.*_cpu$")
    cases = suite_builder.test_cases["OnnxBackendNodeModelTest"]
    names = sorted(n for n in dir(cases) if n.startswith("test_") and n.endswith("_cpu"))
    per_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    failures = []
    start = time.perf_counter()
    for name in names:
        result = unittest.TestResult()
        cases(name).run(result)
        op = _op_of(suite_builder, name)
        if result.skipped:
            outcome = "skipped"
        elif result.failures or result.errors:
            outcome = "failed"
            failures.append((name, (result.failures or result.errors)[0][1].strip().splitlines()[-1]))
        else:
            outcome = "passed"
        per_op[op][outcome] += 1
    total = collections.Counter()
    print(f"{'op':<28} {'passed':>6} {'failed':>6} {'skipped':>7}")
    for op in sorted(per_op):
        c = per_op[op]
        total.update(c)
        print(f"{op:<28} {c['passed']:>6} {c['failed']:>6} {c['skipped']:>7}")
    print(f"{'TOTAL':<28} {total['passed']:>6} {total['failed']:>6} {total['skipped']:>7}"
          f"   ({len(names)} cases, {time.perf_counter() - start:.0f} s)")
    if args.failures:
        for name, why in failures:
            print(f"{name}: {why[:200]}", file=sys.stderr)


def _op_of(builder: onnx.backend.test.BackendTest, name: str) -> str:
    """The op of a case's model (known once it ran), else a guess from the name."""
    for items in builder._test_items.values():  # the runner keeps the model it loaded
        item = items.get(name)
        if item is not None and item.proto and item.proto[0] is not None:
            nodes = getattr(getattr(item.proto[0], "graph", None), "node", None)
            if nodes:
                return nodes[0].op_type
    return name[len("test_"):].split("_")[0]


if __name__ == "__main__":
    main()
