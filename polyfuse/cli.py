"""The ``polyfuse`` command line: compile, run and tune TC sources, ONNX models and
PyTorch exported programs.

::

    polyfuse tune FILE --target x86 [--entry NAME] [--input-shapes "A:[1024,1024] B:[1024,1024]"]
                  --trials N -o records.jsonl [--tuning-records old.jsonl] [--strategy genetic|random]
                  [--timeout S] [--number N --repeat R] [--seed S] [--jobs J] [--tasks 0,2]
                  [--cluster ADDRESS] [--plot curve.png]
    polyfuse compile FILE --target x86|aarch64|... [--tuning-records R] [-o OUT] [--dump STAGE]
                     [--name NAME] [--threads]      (-o on a model: its AOT bundle too)
    polyfuse run FILE --inputs in.npz [--outputs out.npz] [--repeat N] [--print-time]
    polyfuse records show|best|distill FILE [-o OUT]
    polyfuse profile MODEL.onnx --inputs calib.npz -o profile.json
    polyfuse quantize MODEL.onnx --profile profile.json -o MODEL.int8.onnx
                      [--method minmax|percentile|entropy] [--keep-float NODE ...]

FILE is a ``.tc`` source (one definition, chosen with ``--entry`` when there are several)
or a model, ``.onnx`` or ``.pt2`` (``torch.export.save``), each fused kernel a task.
``--target`` may name a CPU and features (``x86:skylake-avx512``, ``aarch64+sve``):
records are kept and found per target.
Errors are one line on stderr with a non-zero exit code; ``--verbose`` shows the
traceback too.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import polyfuse as pf
from polyfuse.driver import MATMUL_PRECISIONS, SIZES
from polyfuse.autotune import records as db
from polyfuse.autotune.task import Task
from polyfuse.errors import ArgumentError, PolyfuseError
from polyfuse.frontends.tc import parse as parse_tc
from polyfuse.ir.comprehension import Definition, TensorDecl
from polyfuse.runtime.arguments import placeholder
from polyfuse.scheduler.options import MappingOptions


class CliError(PolyfuseError):
    """A command-line usage error."""


# --- inputs -------------------------------------------------------------------------------

def parse_shapes(text: str | None) -> dict[str, tuple[int, ...]]:
    """``"A:[1024,1024] B:[1024, 64]"`` -> ``{"A": (1024, 1024), "B": (1024, 64)}``."""
    if not text:
        return {}
    shapes: dict[str, tuple[int, ...]] = {}
    rest = text.strip()
    pattern = re.compile(r"\s*([^\s:\[\]]+)\s*:\s*\[([^\]]*)\]\s*,?")
    while rest:
        m = pattern.match(rest)
        if m is None:
            raise CliError(f"--input-shapes: cannot read {rest!r}; write NAME:[d0,d1,...] separated "
                           "by spaces, e.g. \"A:[1024,1024] B:[1024,1024]\"")
        dims = [d.strip() for d in m.group(2).split(",") if d.strip()]
        if not all(re.fullmatch(r"\d+", d) for d in dims):
            raise CliError(f"--input-shapes: dimensions of '{m.group(1)}' must be integers, got [{m.group(2)}]")
        shapes[m.group(1)] = tuple(int(d) for d in dims)
        rest = rest[m.end():]
    return shapes


# models pf.compile reads: ONNX, and programs torch.export.save wrote
MODEL_SUFFIXES = (".onnx", ".pt2")


def _kind(path: Path) -> str:
    if not path.exists():
        raise CliError(f"no file '{path}'")
    if path.suffix == ".tc":
        return "tc"
    if path.suffix in MODEL_SUFFIXES:
        return "model"
    raise CliError(f"'{path}' is neither a .tc source nor a model ({', '.join(MODEL_SUFFIXES)})")


def _entry(module: Any, name: str | None, path: Path) -> Any:
    defs = module.definitions
    if name is None:
        if len(defs) != 1:
            raise CliError(f"{path} defines {', '.join(d.name for d in defs)}; choose one with --entry")
        return defs[0]
    for d in defs:
        if d.name == name:
            return d
    raise CliError(f"{path} has no definition '{name}' (it defines {', '.join(d.name for d in defs)})")


def _tc_definition(args: argparse.Namespace) -> tuple[str, Definition]:
    """The source of the .tc FILE and its definition chosen by --entry."""
    path = Path(args.file)
    source = path.read_text()
    return source, _entry(parse_tc(source), args.entry, path)


def _input_placeholders(d: Definition, shapes: dict[str, tuple[int, ...]]) -> list[np.ndarray]:
    """Data-free arrays of the --input-shapes of every input of ``d``."""
    missing = [t.name for t in d.inputs if t.name not in shapes]
    if missing:
        example = " ".join(f"{n}:[...]" for n in missing)
        raise CliError(f"--input-shapes must give the shape of every input of '{d.name}'; "
                       f"missing {missing} (e.g. --input-shapes \"{example}\")")
    return [placeholder(shapes[t.name], t.dtype.numpy) for t in d.inputs]


def load_tasks(args: argparse.Namespace) -> list[Task]:
    """The tuning tasks of FILE: its definition at --input-shapes, or a model's kernels."""
    path = Path(args.file)
    shapes = parse_shapes(args.input_shapes)
    target = pf.Target.parse(args.target)   # with its :CPU and +features: records name them
    if _kind(path) == "tc":
        _, d = _tc_definition(args)
        return [Task.of(d, _input_placeholders(d, shapes), target)]
    model = pf.compile(str(path), target=target, input_shapes=shapes or None)
    try:
        tasks = model.tasks()
    except ArgumentError:
        raise CliError("the model's input shapes are symbolic; give them with --input-shapes "
                       f"\"{' '.join(f'{v.name}:[...]' for v in model.inputs)}\"") from None
    if args.tasks:
        chosen = []
        for key in args.tasks.split(","):
            if key.isdigit() and int(key) < len(tasks):
                chosen.append(tasks[int(key)])
            else:
                match = [t for t in tasks if key in t.name]
                if not match:
                    raise CliError(f"--tasks: no task {key!r}; tasks: "
                                   + "; ".join(f"{k}: {t.name}" for k, t in enumerate(tasks)))
                chosen += match
        tasks = list(dict.fromkeys(chosen))
    return tasks


# --- commands -----------------------------------------------------------------------------

def cmd_tune(args: argparse.Namespace) -> int:
    from polyfuse.autotune.tuner import TuneConfig, tune
    tasks = load_tasks(args)
    config = TuneConfig(trials=args.trials, strategy=args.strategy, seed=args.seed, jobs=args.jobs,
                        number=args.number, repeat=args.repeat, timeout=args.timeout)
    executor, client = None, None
    if args.cluster:
        try:
            from distributed import Client
        except ImportError:
            raise CliError("--cluster needs the 'distributed' package: pip install 'polyfuse[cluster]'") from None
        client = Client(args.cluster)
        executor = client.get_executor()
    old = db.Records.open(args.tuning_records) if args.tuning_records else None
    curves = []
    try:
        for k, task in enumerate(tasks):
            print(f"[{k + 1}/{len(tasks)}] tuning {task}", flush=True)
            result = tune(task, args.output, config, executor=executor, previous=old, progress=True)
            curves.append((task, result))
            if result.best is not None:
                print(f"  best {result.best.cost * 1e3:.4g} ms, default {result.default_cost * 1e3:.4g} ms "
                      f"({result.default_cost / result.best.cost:.2f}x) after {result.trials} trials "
                      f"in {result.seconds:.0f} s", flush=True)
            else:
                print(f"  no valid candidate in {result.trials} trials", flush=True)
            if result.interrupted:
                print("interrupted: every record measured so far is in " + str(args.output))
                return 130
    finally:
        if client is not None:
            client.close()
    if args.plot:
        plot(curves, args.plot)
    return 0


def plot(curves: list[tuple[Task, Any]], path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CliError("--plot needs matplotlib: pip install 'polyfuse[plot]'") from None
    fig, ax = plt.subplots(figsize=(7, 4))
    for task, result in curves:
        xs = range(1, len(result.curve) + 1)
        ax.plot(xs, [c * 1e3 for c in result.curve], label=task.name or task.entry)
        if np.isfinite(result.default_cost):
            ax.axhline(result.default_cost * 1e3, linestyle=":", color="gray")
    ax.set_xlabel("trial")
    ax.set_ylabel("best time so far (ms)")
    ax.set_yscale("log")
    ax.set_title("polyfuse tuning (dotted: the default schedule)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def _model_precision(args: argparse.Namespace) -> str:
    """compile()'s precision for ``--precision``: float32 products exact, or on TF32."""
    return "tf32" if args.precision == "tf32" else "float32"


def cmd_compile(args: argparse.Namespace) -> int:
    path = Path(args.file)
    shapes = parse_shapes(args.input_shapes)
    if _kind(path) == "tc":
        source, d = _tc_definition(args)
        arrays = _input_placeholders(d, shapes)
        mod = pf.define(source, target=args.target, tuning_records=args.tuning_records, sizes=args.sizes,
                        precision=args.precision)
        spec = mod[d.name].specialize(*arrays)
        stages = spec.stages.printed() if hasattr(spec.stages, "printed") else dict(spec.stages)
        texts = {"kernels": stages.get("specialized", ""), **stages}
        if args.dump:
            if args.dump not in texts:
                raise CliError(f"no stage '{args.dump}'; stages: {', '.join(texts)}")
            print(texts[args.dump])
        if args.output:
            out = Path(args.output)
            out.mkdir(parents=True, exist_ok=True)
            for name, text in stages.items():
                (out / f"{d.name}.{name.replace(':', '.')}.txt").write_text(text)
            obj = getattr(getattr(spec.run, "jit", spec.run), "object", None)
            if obj:
                (out / f"{d.name}.o").write_bytes(obj)
            binary = getattr(spec.run, "binary", None)   # the cuda target's cubin
            if binary is not None:
                (out / f"{d.name}.cubin").write_bytes(binary.cubin)
            print(f"wrote {out}/ ({len(stages)} stages of '{d.name}')")
        return 0
    model = pf.compile(str(path), target=args.target, input_shapes=shapes or None, precision=_model_precision(args),
                       tuning_records=args.tuning_records)
    if args.dump:
        print(model.dump(args.dump))
    if args.output:
        out = Path(args.output)
        out.mkdir(parents=True, exist_ok=True)
        (out / "graph.txt").write_text(model.dump("partition_fusion_groups"))
        (out / "groups.txt").write_text(model.dump("groups") + "\n")
        try:
            for stage in ("plan", "kernels", "loops"):
                (out / f"{stage}.txt").write_text(model.dump(stage))
        except ArgumentError:
            raise CliError("give --input-shapes for the model's symbolic input dimensions to "
                           "write its kernels") from None
        written = "graph, fusion groups, plan, kernels, loops"
        if model.target.backend.bundles:
            from polyfuse.runtime.bundle import write_bundle
            files = write_bundle(model, out, args.name, threads=args.threads)
            written = f"the bundle {' '.join(f.name for f in files)}; {written}"
        print(f"wrote {out}/ ({written})")
    return 0


def _load_npz(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except (OSError, ValueError) as err:
        raise CliError(f"cannot read inputs from '{path}': {err}") from None


def _scalar(feeds: dict[str, np.ndarray], name: str, inputs: str) -> Any:
    if feeds[name].size != 1:
        raise CliError(f"{inputs}: '{name}' is a scalar parameter; give it as a 0-d array "
                       f"(np.savez(..., {name}=np.float32(2))), got shape {list(feeds[name].shape)}")
    return feeds[name].item()


def cmd_run(args: argparse.Namespace) -> int:
    if args.repeat < 0:
        raise CliError(f"--repeat is a number of timed runs (>= 0), got {args.repeat}")
    path = Path(args.file)
    kind = _kind(path)
    feeds = _load_npz(args.inputs)
    if kind == "tc":
        source, d = _tc_definition(args)
        kernel = pf.define(source, target=args.target, tuning_records=args.tuning_records, sizes=args.sizes,
                           precision=args.precision)[d.name]
        missing = [p.name for p in d.params if p.name not in feeds]
        if missing:
            raise CliError(f"{args.inputs} lacks {missing} (it holds {sorted(feeds)})")
        values = [feeds[p.name] if isinstance(p, TensorDecl) else _scalar(feeds, p.name, args.inputs)
                  for p in d.params]

        def call() -> dict[str, np.ndarray]:
            out = kernel(*values)
            out = out if isinstance(out, tuple) else (out,)
            return {t.name: a for t, a in zip(d.outputs, out)}
    else:
        model = pf.compile(str(path), target=args.target, tuning_records=args.tuning_records,
                           precision=_model_precision(args))

        def call() -> dict[str, np.ndarray]:
            return model.run(feeds)
    outputs = call()
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        outputs = call()
        times.append(time.perf_counter() - start)
    if args.print_time and times:
        t = np.array(times) * 1e3
        print(f"{len(t)} runs: median {np.median(t):.4g} ms, min {t.min():.4g} ms, max {t.max():.4g} ms")
    if args.outputs:
        np.savez(args.outputs, **outputs)
        print(f"wrote {args.outputs} ({', '.join(outputs)})")
    else:
        for name, a in outputs.items():
            print(f"{name}: {a.dtype}{list(a.shape)}\n{a}")
    return 0


def calibration_feeds(path: str, model: Any) -> list[dict[str, np.ndarray]]:
    """The samples of a calibration .npz: an array per model input, sample k its ``[k]``."""
    arrays = _load_npz(path)
    missing = [v.name for v in model.inputs if v.name not in arrays]
    if missing:
        raise CliError(f"{path} lacks {missing} (it holds {sorted(arrays)}); give an array per "
                       "model input, the samples along its first axis")
    counts = {v.name: len(arrays[v.name]) if arrays[v.name].ndim else 0 for v in model.inputs}
    if len(set(counts.values())) != 1 or 0 in counts.values():
        raise CliError(f"{path}: every input's array needs the same number of samples along its "
                       f"first axis (one more axis than the input has); got {counts}")
    n = next(iter(counts.values()))
    return [{name: arrays[name][k] for name in counts} for k in range(n)]


def cmd_profile(args: argparse.Namespace) -> int:
    if Path(args.file).suffix != ".onnx" or _kind(Path(args.file)) != "model":
        raise CliError(f"profile takes an .onnx model, got '{args.file}'")
    model = pf.compile(args.file, target=args.target)
    feeds = calibration_feeds(args.inputs, model)
    profile = model.profile_ranges(feeds)
    profile.save(args.output)
    print(f"wrote {args.output} (the ranges of {len(profile.tensors)} tensors over "
          f"{profile.samples} samples)")
    return 0


def cmd_quantize(args: argparse.Namespace) -> int:
    from polyfuse.frontends.onnx_quantize import quantize
    from polyfuse.lowering.calibration import QuantizeOptions
    if Path(args.file).suffix != ".onnx" or _kind(Path(args.file)) != "model":
        raise CliError(f"quantize takes an .onnx model, got '{args.file}'")
    options = QuantizeOptions(args.method, args.percentile, not args.per_tensor,
                              frozenset(args.keep_float or ()))
    proto = quantize(args.file, args.profile, options)
    Path(args.output).write_bytes(proto.SerializeToString())
    print(f"wrote {args.output} (int8 QDQ, {args.method} calibration)")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from polyfuse.runtime import cache, saved_programs
    saved_programs.flush()   # (this process's saves written first)
    root = cache.cache_dir()
    if root is None:
        print("the disk cache is off (POLYFUSE_CACHE_DIR is empty or 0)")
        return 0
    if args.action == "clear":
        print(f"removed {cache.clear()} files from {root}")
        return 0
    files = cache.cache_files()
    kernels = sum(1 for f in files if f.parent == root and f.name.endswith(".o"))
    programs = sum(1 for f in files if f.parent.name == "bin" and not f.name.endswith((".sha256", ".tmp")))
    plans = sum(1 for f in files if f.parent.name == "models" and "-" in f.name and not f.name.startswith("stat-"))
    size = sum(f.stat().st_size for f in files if f.exists())
    print(f"{root}: {kernels} kernels, {plans} plans of compiled models, {programs} programs linked for an "
          f"emulator, {size / 2**20:.1f} MiB")
    return 0


def cmd_records(args: argparse.Namespace) -> int:
    if not Path(args.file).is_file():
        raise CliError(f"no records file '{args.file}'"
                       + (" (it is a directory)" if Path(args.file).is_dir() else ""))
    records = db.load(args.file)
    if args.action == "show":
        print(f"{'workload':<20} {'target':<20} {'task':<40} {'ms':>10} {'error':<14} options")
        for r in records:
            cost = f"{r.cost * 1e3:.4g}" if r.ok else "-"
            print(f"{r.workload_key:<20} {str(r.target):<20.20} {_task_name(r):<40.40} {cost:>10} "
                  f"{r.error:<14} {json.dumps(_short(r.options.to_json()))}")
        print(f"{len(records)} records, {sum(r.ok for r in records)} valid")
    else:
        best = db.best_per_workload(records)
        if args.action == "best":
            print(f"{'workload':<20} {'target':<20} {'task':<40} {'ms':>10} {'trials':>6}")
            for (key, target), r in best.items():
                trials = sum(1 for x in records if x.workload_key == key and x.target == target)
                print(f"{key:<20} {str(target):<20.20} {_task_name(r):<40.40} {r.cost * 1e3:10.4g} "
                      f"{trials:6d}")
        else:   # distill: the best record of each workload into a new file
            if not args.output:
                raise CliError("records distill needs -o OUT")
            Path(args.output).unlink(missing_ok=True)
            db.append(args.output, best.values())
            print(f"wrote {len(best)} records (the best of each of {len(best)} workloads) to {args.output}")
    return 0


def _task_name(r: db.Record) -> str:
    return f"{r.name or r.entry}{[list(s) for s in r.shapes]}"


def _short(options: dict[str, Any]) -> dict[str, Any]:
    """The options that differ from the defaults."""
    default = MappingOptions().to_json()
    return {k: v for k, v in options.items() if default.get(k) != v}


# --- main ---------------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="polyfuse", description="Compile, run and tune TC kernels and ONNX models.")
    p.add_argument("--verbose", "-v", action="store_true", help="tracebacks and debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    def common(s: argparse.ArgumentParser) -> None:
        s.add_argument("file", help="a .tc source, or an .onnx or .pt2 model")
        s.add_argument("--target", default="host", help="x86, aarch64, cuda, reference or host (default), "
                       "x86 and aarch64 optionally with :CPU and +FEATURE (x86:skylake-avx512, aarch64+sve)")
        s.add_argument("--entry", help="the TC definition to use (when the source has several)")
        s.add_argument("--input-shapes", help='shapes of the inputs: "A:[1024,1024] B:[1024,1024]"')
        s.add_argument("--tuning-records", help="records of earlier tuning to compile with")

    def sizes(s: argparse.ArgumentParser) -> None:
        s.add_argument("--sizes", choices=SIZES, default="specialized",
                       help="a TC kernel for these sizes (specialized, the default), or one whose sizes "
                       "are parameters (symbolic: its object code serves every size; CPU targets)")
        s.add_argument("--precision", choices=MATMUL_PRECISIONS, default="ieee",
                       help="float32 products exact (ieee, the default) or on TF32 tensor cores where "
                       "the cuda target has them (tf32)")

    t = sub.add_parser("tune", help="search for fast schedules; append every trial to -o")
    common(t)
    t.add_argument("--trials", type=int, default=64, help="candidates to measure per task (default 64)")
    t.add_argument("-o", "--output", required=True, help="records file (JSON lines, appended to)")
    t.add_argument("--strategy", choices=("genetic", "random"), default="genetic")
    t.add_argument("--timeout", type=float, default=10.0, help="seconds a candidate may run (default 10)")
    t.add_argument("--number", type=int, default=10, help="calls per timed repeat (default 10)")
    t.add_argument("--repeat", type=int, default=3, help="timed repeats per candidate (default 3)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--jobs", type=int, default=0, help="parallel builds (default: all cores)")
    t.add_argument("--tasks", help="a model's tasks to tune: indices or label parts, comma separated")
    t.add_argument("--cluster", help="a Dask scheduler address: measure on its workers")
    t.add_argument("--plot", help="write the tuning curve to this PNG")
    t.set_defaults(run=cmd_tune)

    c = sub.add_parser("compile", help="compile; write the stages to -o, or print one with --dump")
    common(c)
    c.add_argument("-o", "--output", help="a directory for the stages; for a model on x86 or aarch64 "
                   "also its ahead-of-time bundle (NAME.o, NAME.h, NAME.weights.bin, main.c)")
    c.add_argument("--name", default="model", help="the bundle's name and entry point (default: model)")
    c.add_argument("--threads", action="store_true",
                   help="compile polyfuse's pthreads thread pool into the bundle (default: one thread)")
    c.add_argument("--dump", help="print one stage: a graph pass, groups, plan, kernels, loops, llvm, asm")
    sizes(c)
    c.set_defaults(run=cmd_compile)

    r = sub.add_parser("run", help="run on inputs from an .npz file")
    common(r)
    r.add_argument("--inputs", required=True, help=".npz file with an array per input name")
    r.add_argument("--outputs", help=".npz file to write the outputs to (else they are printed)")
    r.add_argument("--repeat", type=int, default=0, help="timed runs after the first")
    r.add_argument("--print-time", action="store_true", help="print the median, min and max time")
    sizes(r)
    r.set_defaults(run=cmd_run)

    pr = sub.add_parser("profile", help="record the range of every float tensor over calibration "
                        "inputs (for quantize)", description="Run an ONNX model on calibration "
                        "samples and write each float tensor's minimum, maximum and histogram as JSON.")
    pr.add_argument("file", help="an .onnx model")
    pr.add_argument("--inputs", required=True, help=".npz with one array per model input, the "
                    "calibration samples along a new first axis: N samples of an input of shape "
                    "(1, 3, 224, 224) are an array of shape (N, 1, 3, 224, 224)")
    pr.add_argument("-o", "--output", required=True, help="the profile to write (JSON)")
    pr.add_argument("--target", default="host", help="where to run the model (default host)")
    pr.set_defaults(run=cmd_profile)

    qu = sub.add_parser("quantize", help="write an int8 QDQ model calibrated from a profile",
                        description="Quantize Conv, MatMul and Gemm to int8 (uint8 activations per "
                        "tensor, int8 weights per output channel) as a standard QDQ ONNX model.")
    qu.add_argument("file", help="the .onnx model the profile was made from")
    qu.add_argument("--profile", required=True, help="a profile `polyfuse profile` wrote")
    qu.add_argument("-o", "--output", required=True, help="the QDQ model to write (.onnx)")
    qu.add_argument("--method", choices=("minmax", "percentile", "entropy"), default="minmax",
                    help="how activation ranges are chosen (default minmax)")
    qu.add_argument("--percentile", type=float, default=99.99,
                    help="for --method percentile: the %% of values kept (default 99.99)")
    qu.add_argument("--per-tensor", action="store_true", help="one weight scale per tensor "
                    "(default: one per output channel)")
    qu.add_argument("--keep-float", nargs="+", metavar="NODE",
                    help="nodes to leave in float (the last layer, say)")
    qu.set_defaults(run=cmd_quantize)

    ca = sub.add_parser("cache", help="where the disk cache of compiled kernels is, its size; clear it",
                        description="The disk cache of compiled kernels: $POLYFUSE_CACHE_DIR (empty or 0 "
                        "turns it off), else $XDG_CACHE_HOME/polyfuse or ~/.cache/polyfuse.")
    ca.add_argument("action", nargs="?", choices=("info", "clear"), default="info",
                    help="info (default): the directory, its kernels and bytes; clear: remove them")
    ca.set_defaults(run=cmd_cache)

    rec = sub.add_parser("records", help="inspect a records file")
    rec.add_argument("action", choices=("show", "best", "distill"))
    rec.add_argument("file")
    rec.add_argument("-o", "--output", help="for distill: the file to write")
    rec.set_defaults(run=cmd_records)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(name)s: %(message)s")
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("polyfuse: interrupted", file=sys.stderr)
        return 130
    except (PolyfuseError, OSError, ValueError) as err:
        if args.verbose:
            traceback.print_exc()
        message = str(err).strip().replace("\n", " | ") if not isinstance(err, pf.FrontendError) else str(err)
        print(f"polyfuse: error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
