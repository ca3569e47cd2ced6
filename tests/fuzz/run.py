"""The fuzzer's child process: ``python -m tests.fuzz.run FRONT COUNT [--seed S]
[--target T]`` runs COUNT generated cases of one front end (``tc``, ``onnx`` or
``feeds``) and prints the tally as JSON on its last line, with where its kernels came
from (``kernels``: compiled, from the disk cache, from memory).

Before each case it writes the case to ``$POLYFUSE_FUZZ_CASE_FILE`` (if set), so that
the parent can show the case that ended the process with a signal.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import warnings

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from tests.fuzz.outcomes import Tally

FRONTS = ("tc", "onnx", "feeds")
MEMORY_LIMIT = 6 << 30  # bytes of address space the child may take


def front(name: str):
    """The strategy of cases and the function that runs one, for front end ``name``."""
    if name == "tc":
        from tests.fuzz import tc_cases
        return tc_cases.cases(), tc_cases.run_case
    if name == "onnx":
        from tests.fuzz import onnx_cases
        return onnx_cases.cases(), onnx_cases.run_case
    from tests.fuzz import feed_cases
    return feed_cases.cases(), feed_cases.run_case


def fuzz(name: str, count: int, start: int, target: str) -> Tally:
    strategy, run_case = front(name)
    tally = Tally()
    case_file = os.environ.get("POLYFUSE_FUZZ_CASE_FILE")

    @seed(start)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), derandomize=False)
    @given(st.data())
    def one(data):
        case = data.draw(strategy)
        if case_file:
            with open(case_file, "w") as f:
                f.write(repr(case)[:200000])
        run_case(case, target, tally)

    one()
    return tally


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("front", choices=FRONTS)
    p.add_argument("count", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", default="host")
    a = p.parse_args(argv)
    warnings.simplefilter("ignore")  # the cases are hostile on purpose
    # a case that asks for terabytes must fail here, not take the machine's memory
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    tally = fuzz(a.front, a.count, a.seed, a.target)
    from polyfuse.runtime import cpu
    sys.stdout.write("\n" + json.dumps(tally.summary() | {"kernels": cpu.STATS}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
