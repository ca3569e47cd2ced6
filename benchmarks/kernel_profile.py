"""Where a model's time goes: each polyfuse kernel against onnxruntime's nodes it covers.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/kernel_profile.py \\
        MODEL.onnx [--threads 2] [--top 25] [--all]

The zoo (``benchmarks/zoo.py``) says which models run slower than onnxruntime; this
says which kernels. polyfuse's times are ``CompiledModel.profile`` (each kernel's best
median over three rounds of 20 runs); onnxruntime's come from its own profiler
(``enable_profiling``), each node's median ``kernel_time`` over 30 runs. A kernel's
label names the ONNX nodes it computes (a fusion group names them all), and
onnxruntime names a node it fused into another layout (its NCHWc convolutions) after
the value the node writes; both are matched to the nodes of the model. Kernels of
polyfuse's own (layout transposes, Winograd transforms) match no node and show
onnxruntime's time as 0, as do onnxruntime's reorders, listed apart. Profiled times
run above a plain run's (the profilers' own costs), so read the difference per
kernel, not the totals against the zoo's. Inputs are random: floats in [0, 1),
integers in [0, 100), every dimension the model leaves free taken as 1.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

import polyfuse as pf
from polyfuse.runtime import native

ROUNDS, REPEAT, ORT_RUNS, ORT_WARMUP = 3, 20, 30, 10


def random_feed(model: pf.CompiledModel, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feed = {}
    for value in model.inputs:
        shape = [d if isinstance(d, int) else 1 for d in value.type.shape]
        dtype = value.type.dtype.numpy
        feed[value.name] = (rng.integers(0, 100, shape).astype(dtype) if np.issubdtype(dtype, np.integer)
                            else rng.random(shape).astype(dtype))
    return feed


def polyfuse_kernels(model: pf.CompiledModel, feed: dict[str, np.ndarray], threads: int) -> list[tuple[str, float]]:
    native.set_num_threads(threads)
    model.run(feed)
    rounds = [model.profile(feed, repeat=REPEAT) for _ in range(ROUNDS)]
    return [(label, min(r[k][1] for r in rounds)) for k, (label, _) in enumerate(rounds[0])]


def onnxruntime_nodes(path: Path, feed: dict[str, np.ndarray], threads: int,
                      graph: onnx.GraphProto) -> dict[str, float]:
    """Each node's median kernel time (s), by the name of the model's node."""
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as folder:
        options.profile_file_prefix = str(Path(folder) / "ort")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        for _ in range(ORT_WARMUP + ORT_RUNS):
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
    times: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            times[e["name"][:-len("_kernel_time")]].append(e["dur"] * 1e-6)
    writer = {out: node.name for node in graph.node for out in node.output}
    by_node: dict[str, float] = defaultdict(float)
    for name, runs in times.items():
        base = name.removesuffix("_nchwc")
        by_node[writer.get(base, name)] += float(np.median(runs[-ORT_RUNS:]))
    return by_node


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=25, help="kernels listed, largest gap first")
    parser.add_argument("--all", action="store_true", help="every kernel, in the order they run")
    args = parser.parse_args()
    graph = onnx.load(str(args.model), load_external_data=False).graph
    names = {node.name for node in graph.node}
    model = pf.compile(str(args.model), target="host")
    feed = random_feed(model, np.random.default_rng(0))
    ours = polyfuse_kernels(model, feed, args.threads)
    theirs = onnxruntime_nodes(args.model, feed, args.threads, graph)
    rows, matched = [], set()
    for label, seconds in ours:
        nodes = {token for token in re.split(r"[\[\] ]", label) if token in names}
        matched |= nodes
        rows.append((seconds, sum(theirs.get(n, 0.0) for n in nodes), label))
    print(f"{args.model.name}, {args.threads} thread(s): polyfuse kernels {sum(r[0] for r in rows) * 1e3:.3f} ms "
          f"({len(rows)}), onnxruntime nodes {sum(theirs.values()) * 1e3:.3f} ms")
    apart = sorted(((n, t) for n, t in theirs.items() if n not in matched), key=lambda x: -x[1])
    print(f"onnxruntime time in nodes no kernel names: {sum(t for _, t in apart) * 1e3:.3f} ms "
          + ", ".join(f"{n} {t * 1e6:.0f} us" for n, t in apart[:5]))
    print("| polyfuse us | onnxruntime us | difference | kernel |\n|---:|---:|---:|---|")
    listed = rows if args.all else sorted(rows, key=lambda r: r[1] - r[0])[:args.top]
    for ours_s, theirs_s, label in listed:
        print(f"| {ours_s * 1e6:.1f} | {theirs_s * 1e6:.1f} | {(ours_s - theirs_s) * 1e6:+.1f} | {label[:110]} |")


if __name__ == "__main__":
    main()
