"""Shapes and values that change on every call: a BERT request stream and GPT-2 decoding.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/dynamic_shapes.py \\
        [--repeat 5] [--tokens 64] [--cache ~/.cache/polyfuse-dynamic] [--skip-specialized]

Needs torch, transformers and onnxruntime; nothing is downloaded (random weights).

**BERT stream.** A 4-layer ``BertModel`` (a ``transformers`` config, eager attention)
exported by ``torch.onnx.export(dynamo=False)`` with symbolic ``batch`` and ``seq`` axes on
``input_ids`` and ``attention_mask``. Each runtime (onnxruntime, 2 intra-op threads; polyfuse,
``pf.compile(path, target="host")`` with no input shapes, from an empty disk cache) gets
the same stream: for each (batch, seq) of ``SHAPES`` in turn, a first call, then
``--repeat`` calls, every call with new token ids and a new mask (a random padding tail
per row). Columns per shape: the first call's seconds (polyfuse's includes the planning
and compiling that shape costs), the steady latency (median ms of the new-feed calls),
polyfuse's plans and kernels compiled for the shape, and with a shape-specialized polyfuse
compile of the same model (``input_shapes`` fixed, same process) its steady latency.
"pf planned" counts the shapes the planner planned (0: the plan came from a plan template,
:mod:`polyfuse.runtime.plan_template`; probes a second plan makes are not counted).
"ahead" columns: the same stream for ``pf.compile(path, target="host",
input_shapes={"input_ids": ("batch", "seq"), "attention_mask": ("batch", "seq")})``, which
compiles ahead for every size of the named dimensions (from cold caches of its own; its
load time, in its total, includes that compile).
"total" is the wall time from loading the model to the last result of the stream.
"warm" columns: the same stream as the "pf" columns in a second process with the disk cache
the first filled, as a restarted server meets it: kernels and the programs of the shapes
seen before are loaded, not compiled (:mod:`polyfuse.runtime.saved_programs`).

**GPT-2 decoding.** A 4-layer ``GPT2LMHeadModel`` exported with its past keys and values
as inputs and the grown ones as outputs (symbolic ``seq`` and ``past`` axes): a prompt of 8
tokens with an empty past, then ``--tokens`` greedy steps of one token, the past growing
by one each. tokens/s is over all steps, over the second half, and one over the median
step (which one slow step, a garbage collection or another tenant of the machine, does
not move). A third row
compiles the decoding steps ahead (``input_shapes={"ids": (1, 1)}``, the past's length
left to its name): its load time includes that compile, and the prompt is planned and
compiled at its call.

Every polyfuse output is checked against onnxruntime's on the same feed (err = max|got -
want| / max|want|; MISMATCH above 1e-3). The runtimes are timed in turn, each after a
pause (spinning pools slow whoever runs next on two cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(1, str(ROOT))   # polyfuse from this checkout
# (real_models takes benchmarks/ off sys.path: its kernels.py shadows a package of transformers)
from real_models import ort_session  # noqa: E402

import polyfuse as pf  # noqa: E402
from polyfuse.runtime import cpu, saved_programs  # noqa: E402

SHAPES = ((1, 7), (2, 33), (1, 100), (1, 128), (8, 16), (4, 64), (1, 50), (2, 77), (3, 20), (1, 256))
LAYERS = 4
PROMPT = 8
PAUSE = 1.0   # seconds between runtimes
TOLERANCE = 1e-3
THREADS = 2    # onnxruntime's intra-op threads


def bert_onnx(cache: Path) -> Path:
    path = cache / f"bert{LAYERS}_dynamic.onnx"
    if path.exists():
        return path
    import torch
    from transformers import BertConfig, BertModel

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            config = BertConfig(num_hidden_layers=LAYERS, attn_implementation="eager")
            self.model = BertModel(config, add_pooling_layer=False).eval()

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.zeros((2, 16), dtype=torch.int64)
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
            "hidden": {0: "batch", 1: "seq"}}
    _export(Encoder(), (ids, torch.ones_like(ids)), path, ["input_ids", "attention_mask"], ["hidden"], axes)
    return path


def gpt2_onnx(cache: Path) -> tuple[Path, int, int, int]:
    """The decoder step's file, and its layers, heads and head width."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.cache_utils import DynamicCache
    config = GPT2Config(n_layer=LAYERS, attn_implementation="eager")
    heads, width = config.n_head, config.n_embd // config.n_head
    path = cache / f"gpt2_{LAYERS}_past.onnx"
    if path.exists():
        return path, LAYERS, heads, width

    class Step(torch.nn.Module):
        """(ids, past k/v per layer) -> (the last position's logits, grown k/v per layer)."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.model = GPT2LMHeadModel(config).eval()

        def forward(self, ids: torch.Tensor, *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
            kv = DynamicCache()
            for layer in range(LAYERS):
                kv.update(past[2 * layer].clone(), past[2 * layer + 1].clone(), layer)
            seen = torch.cat([past[0][:, 0, :, 0], torch.ones_like(ids, dtype=past[0].dtype)], dim=1)
            mask = torch.ones_like(seen, dtype=torch.int64)
            positions = (mask.cumsum(1) - 1)[:, past[0].shape[2]:]
            out = self.model(input_ids=ids, past_key_values=kv, attention_mask=mask, position_ids=positions,
                             use_cache=True)
            grown = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
            return (out.logits[:, -1, :], *grown)

    names = ["ids"] + [f"past_{k}_{kv}" for k in range(LAYERS) for kv in "kv"]
    outputs = ["logits"] + [f"present_{k}_{kv}" for k in range(LAYERS) for kv in "kv"]
    axes = {"ids": {1: "seq"}} | {n: {2: "past"} for n in names[1:]} | {n: {2: "total"} for n in outputs[1:]}
    past = [torch.zeros(1, heads, 5, width) for _ in range(2 * LAYERS)]
    _export(Step(), (torch.zeros((1, 1), dtype=torch.int64), *past), path, names, outputs, axes)
    return path, LAYERS, heads, width


def _export(model, args, path: Path, inputs, outputs, axes) -> None:  # noqa: ANN001
    import torch
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.onnx")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(partial), dynamo=False, opset_version=17, input_names=inputs,
                          output_names=outputs, dynamic_axes=axes)
    os.replace(partial, path)


def feeds(shape: tuple[int, int], count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """``count`` feeds of new token ids, each row's mask a random padding tail."""
    rng = np.random.default_rng(seed)
    batch, seq = shape
    out = []
    for _ in range(count):
        ids = rng.integers(0, 30522, size=shape, dtype=np.int64)
        lengths = rng.integers(max(1, seq // 2), seq + 1, size=batch)
        mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-30))


class Stream:
    """One runtime's pass over the BERT stream."""

    def __init__(self, repeat: int) -> None:
        self.repeat = repeat
        self.first: dict[tuple, float] = {}
        self.steady: dict[tuple, float] = {}
        self.outputs: dict[tuple, list[np.ndarray]] = {}
        self.plans: dict[tuple, int] = {}
        self.kernels: dict[tuple, int] = {}
        self.total = 0.0

    def run(self, load, call, count=None) -> None:  # noqa: ANN001
        time.sleep(PAUSE)
        start = time.perf_counter()
        model = load()
        for k, shape in enumerate(SHAPES):
            plans, kernels = count(model) if count else (0, 0)
            fed = feeds(shape, self.repeat + 1, seed=k)
            t = time.perf_counter()
            results = [call(model, fed[0])]
            self.first[shape] = time.perf_counter() - t
            times = []
            for feed in fed[1:]:
                t = time.perf_counter()
                results.append(call(model, feed))
                times.append(time.perf_counter() - t)
            self.steady[shape] = statistics.median(times) * 1e3
            self.outputs[shape] = results
            if count:
                after = count(model)
                self.plans[shape], self.kernels[shape] = after[0] - plans, after[1] - kernels
        self.total = time.perf_counter() - start


def warm_child(path: Path, repeat: int, out: Path) -> None:
    """The polyfuse stream in this process (a second one), its results written to ``out``."""
    stream = Stream(repeat)
    stream.run(lambda: pf.compile(str(path), target="host"), lambda m, f: m(**f),
               lambda m: (m.plan_counts["planned"], cpu.STATS["compiled"]))
    np.savez(out, **{f"{shape}-{k}": r for shape, results in stream.outputs.items() for k, r in enumerate(results)})
    out.with_suffix(".json").write_text(json.dumps({
        "first": [stream.first[s] for s in SHAPES], "steady": [stream.steady[s] for s in SHAPES],
        "plans": [stream.plans[s] for s in SHAPES], "kernels": [stream.kernels[s] for s in SHAPES],
        "total": stream.total}))


def warm(path: Path, repeat: int) -> Stream:
    """The polyfuse stream in a second process, from the disk cache the first filled."""
    with tempfile.TemporaryDirectory(prefix="polyfuse-warm-") as folder:
        out = Path(folder) / "warm.npz"
        saved_programs.flush()   # (the first process's saves on the disk)
        time.sleep(PAUSE)
        subprocess.run([sys.executable, __file__, "--warm-child", str(path), str(out), "--repeat", str(repeat)],
                       check=True)
        done = json.loads(out.with_suffix(".json").read_text())
        arrays = np.load(out)
        stream = Stream(repeat)
        for k, shape in enumerate(SHAPES):
            stream.first[shape], stream.steady[shape] = done["first"][k], done["steady"][k]
            stream.plans[shape], stream.kernels[shape] = done["plans"][k], done["kernels"][k]
            stream.outputs[shape] = [arrays[f"{shape}-{j}"] for j in range(repeat + 1)]
        stream.total = done["total"]
    return stream


def bert(path: Path, repeat: int, specialized: bool) -> None:
    ort_stream, pf_stream = Stream(repeat), Stream(repeat)
    ort_stream.run(lambda: ort_session(str(path), THREADS), lambda s, f: s.run(None, f)[0])
    pf_stream.run(lambda: pf.compile(str(path), target="host"), lambda m, f: m(**f),
                  lambda m: (m.plan_counts["planned"], cpu.STATS["compiled"]))
    warm_stream = warm(path, repeat)
    ahead_stream = Stream(repeat)   # compiled ahead for the model's named dimensions, from cold caches
    named = {"input_ids": ("batch", "seq"), "attention_mask": ("batch", "seq")}
    with tempfile.TemporaryDirectory(prefix="polyfuse-ahead-") as kernels:
        before = os.environ.get("POLYFUSE_CACHE_DIR")
        os.environ["POLYFUSE_CACHE_DIR"] = kernels
        cpu._COMPILED.clear()
        try:
            ahead_stream.run(lambda: pf.compile(str(path), target="host", input_shapes=named), lambda m, f: m(**f),
                             lambda m: (m.plan_counts["planned"], cpu.STATS["compiled"]))
        finally:   # (the cold cache goes with this block, after the saves into it)
            saved_programs.flush()
            if before is None:
                os.environ.pop("POLYFUSE_CACHE_DIR", None)
            else:
                os.environ["POLYFUSE_CACHE_DIR"] = before
    fixed: dict[tuple, float | str] = {}
    if specialized:
        for k, shape in enumerate(SHAPES):
            try:
                model = pf.compile(str(path), target="host",
                                   input_shapes={"input_ids": shape, "attention_mask": shape})
                fed = feeds(shape, repeat + 1, seed=k)
                model.run(fed[0])
                times = []
                for feed in fed[1:]:
                    t = time.perf_counter()
                    model.run(feed)
                    times.append(time.perf_counter() - t)
                fixed[shape] = statistics.median(times) * 1e3
            except Exception as e:  # noqa: BLE001  (a row of the table, not the end of the run)
                fixed[shape] = type(e).__name__
    print(f"\nBERT ({LAYERS} layers) stream, {len(SHAPES)} shapes, {repeat} new-feed calls each; "
          "first call s, steady ms (median)")
    header = ["batch x seq", "ort first", "pf first", "pf planned", "pf kernels", "ort ms", "pf ms",
              "pf fixed-shape ms", "ort/pf", "fixed/pf", "ahead first", "ahead ms", "ort/ahead",
              "warm first", "warm ms", "err"]
    rows = []
    for shape in SHAPES:
        err = max(error(g, w) for stream in (pf_stream, ahead_stream, warm_stream)
                  for g, w in zip(stream.outputs[shape], ort_stream.outputs[shape]))
        f = fixed.get(shape, "-")
        rows.append([f"{shape[0]} x {shape[1]}", f"{ort_stream.first[shape]:.3f}", f"{pf_stream.first[shape]:.3f}",
                     str(pf_stream.plans[shape]), str(pf_stream.kernels[shape]),
                     f"{ort_stream.steady[shape]:.2f}", f"{pf_stream.steady[shape]:.2f}",
                     f"{f:.2f}" if isinstance(f, float) else f,
                     f"{ort_stream.steady[shape] / pf_stream.steady[shape]:.2f}",
                     f"{f / pf_stream.steady[shape]:.2f}" if isinstance(f, float) else "-",
                     f"{ahead_stream.first[shape]:.3f}", f"{ahead_stream.steady[shape]:.2f}",
                     f"{ort_stream.steady[shape] / ahead_stream.steady[shape]:.2f}",
                     f"{warm_stream.first[shape]:.3f}", f"{warm_stream.steady[shape]:.2f}",
                     f"{err:.1e}" + (" MISMATCH" if err > TOLERANCE else "")])
    rows.append(["total s (load to last result)", f"{ort_stream.total:.2f}", f"{pf_stream.total:.2f}",
                 str(sum(pf_stream.plans.values())), str(sum(pf_stream.kernels.values())), "", "", "", "", "",
                 f"{ahead_stream.total:.2f} ({sum(ahead_stream.plans.values())} planned)", "", "",
                 f"{warm_stream.total:.2f} ({sum(warm_stream.plans.values())} planned, "
                 f"{sum(warm_stream.kernels.values())} compiled)", "", ""])
    table(header, rows)


def gpt2(path: Path, layers: int, heads: int, width: int, tokens: int) -> None:
    names = ["ids"] + [f"past_{k}_{kv}" for k in range(layers) for kv in "kv"]
    prompt = np.random.default_rng(0).integers(0, 50257, size=(1, PROMPT), dtype=np.int64)

    def decode(call, forced=None):  # noqa: ANN001, ANN202
        """Greedy steps (``forced``: the tokens to feed instead); logits and seconds per step."""
        past = [np.zeros((1, heads, 0, width), np.float32) for _ in range(2 * layers)]
        ids, logits, seconds = prompt, [], []
        for step in range(tokens + 1):
            t = time.perf_counter()
            out = call(dict(zip(names, [ids, *past])))
            seconds.append(time.perf_counter() - t)
            logits.append(out[0])
            past = list(out[1:])
            token = forced[step] if forced is not None else int(np.argmax(out[0][0]))
            ids = np.array([[token]], np.int64)
        return logits, seconds

    time.sleep(PAUSE)
    t = time.perf_counter()
    session = ort_session(str(path), THREADS)
    ort_load = time.perf_counter() - t
    want, ort_seconds = decode(lambda f: session.run(None, f))
    chosen = [int(np.argmax(w[0])) for w in want]
    time.sleep(PAUSE)
    t = time.perf_counter()
    model = pf.compile(str(path), target="host")
    pf_load = time.perf_counter() - t
    before = cpu.STATS["compiled"]
    got, pf_seconds = decode(lambda f: model(**f), chosen)
    err = max(error(g, w) for g, w in zip(got, want))
    same = sum(int(np.argmax(g[0])) == c for g, c in zip(got, chosen))
    compiled = cpu.STATS["compiled"] - before
    time.sleep(PAUSE)   # the decoding kind compiled ahead: one token, the past's length named
    with tempfile.TemporaryDirectory(prefix="polyfuse-ahead-") as kernels:
        os.environ["POLYFUSE_CACHE_DIR"] = kernels   # cold caches: nothing of the row above
        cpu._COMPILED.clear()
        t = time.perf_counter()
        ahead = pf.compile(str(path), target="host", input_shapes={"ids": (1, 1)})
        ahead_load = time.perf_counter() - t
        before_ahead = cpu.STATS["compiled"]
        got_ahead, ahead_seconds = decode(lambda f: ahead(**f), chosen)
        saved_programs.flush()
    err_ahead = max(error(g, w) for g, w in zip(got_ahead, want))
    same_ahead = sum(int(np.argmax(g[0])) == c for g, c in zip(got_ahead, chosen))
    print(f"\nGPT-2 ({layers} layers) greedy decoding: a prompt of {PROMPT}, then {tokens} steps of one token")
    header = ["runtime", "load s", "prompt s", "tokens/s (all steps)", "tokens/s (second half)",
              "tokens/s (median step)", "plans (planned + templated)",
              "kernels compiled", "err", "same tokens"]
    rows = []
    runs = (("onnxruntime", ort_load, ort_seconds, "-", "-", 0.0, 0),
            ("polyfuse", pf_load, pf_seconds, f"{model.plan_counts['planned']} + {model.plan_counts['templated']}",
             str(compiled), err, same),
            ("polyfuse, decoding compiled ahead", ahead_load, ahead_seconds,
             f"{ahead.plan_counts['planned']} + {ahead.plan_counts['templated']}",
             f"{cpu.STATS['compiled'] - before_ahead} (+ ahead)", err_ahead, same_ahead))
    for name, load, seconds, plans, kernels, err, same in runs:
        steps = seconds[1:]
        rows.append([name, f"{load:.2f}", f"{seconds[0]:.3f}", f"{len(steps) / sum(steps):.1f}",
                     f"{len(steps[len(steps) // 2:]) / sum(steps[len(steps) // 2:]):.1f}",
                     f"{1 / float(np.median(steps)):.1f}", plans, kernels,
                     "" if name == "onnxruntime" else f"{err:.1e}" + (" MISMATCH" if err > TOLERANCE else ""),
                     "" if name == "onnxruntime" else f"{same}/{len(chosen)}"])
    table(header, rows)


def table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "polyfuse-dynamic")
    parser.add_argument("--skip-specialized", action="store_true")
    parser.add_argument("--only", choices=("bert", "gpt2"))
    parser.add_argument("--warm-child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.warm_child:
        warm_child(args.warm_child[0], args.repeat, args.warm_child[1])
        return
    with tempfile.TemporaryDirectory(prefix="polyfuse-dynamic-") as kernels:
        os.environ["POLYFUSE_CACHE_DIR"] = kernels   # cold: no kernel on disk
        if args.only in (None, "bert"):
            bert(bert_onnx(args.cache), args.repeat, not args.skip_specialized)
        if args.only in (None, "gpt2"):
            gpt2(*gpt2_onnx(args.cache), args.tokens)
        saved_programs.flush()


if __name__ == "__main__":
    main()
