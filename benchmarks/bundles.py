"""Ahead-of-time bundles against the same model in Python and onnxruntime.

    python benchmarks/bundles.py [--repeat 15] [--only resnet18,mobilenet,bert_layer]
                                 [--aarch64]

For each model of ``benchmarks/models.py``: an x86 bundle with polyfuse's thread pool,
linked by the C compiler into a small timing program (the entry point run ``repeat``
times after a warm-up, median), against ``polyfuse.compile(...).run`` in this process
and onnxruntime with 2 threads; outputs checked against ``run``. ``--aarch64`` also
builds each bundle for aarch64 and runs it once under qemu (a check of its output, not
a timing: qemu's speed says nothing of an ARM CPU).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

import polyfuse as pf
from models import MODELS
from polyfuse.runtime.cross import c_compiler, runner_prefix
from timing import interleaved_times

# Runs the bundle NAME (`bench`) REPEAT times on inputs read from files; prints the median
# milliseconds on stderr and the first output's bytes on stdout.
TIMER = r"""
#define _POSIX_C_SOURCE 200112L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "bench.h"

static void *aligned(uint64_t n) { void *p; if (posix_memalign(&p, 64, n ? n : 64)) exit(1); return p; }
static void load(const char *path, void *dst, uint64_t n) {
    FILE *f = fopen(path, "rb"); if (!f || fread(dst, 1, n, f) != n) exit(2); fclose(f); }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static int less(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

int main(int argc, char **argv) {
    int repeat = atoi(argv[1]);
    uint8_t *weights = aligned(BENCH_WEIGHTS_SIZE), *activations = aligned(BENCH_ACTIVATIONS_SIZE);
    void *inputs[BENCH_NUM_INPUTS], *outputs[BENCH_NUM_OUTPUTS];
    load(argv[2], weights, BENCH_WEIGHTS_SIZE);
    for (int k = 0; k < BENCH_NUM_INPUTS; ++k) {
        inputs[k] = aligned(bench_inputs[k].bytes);
        load(argv[3 + k], inputs[k], bench_inputs[k].bytes);
    }
    for (int k = 0; k < BENCH_NUM_OUTPUTS; ++k) outputs[k] = aligned(bench_outputs[k].bytes);
    double *times = malloc(sizeof(double) * (repeat + 1));
    for (int r = 0; r <= repeat; ++r) {
        double t = now();
        if (bench(weights, activations, (const void *const *)inputs, outputs)) return 3;
        times[r] = now() - t;
    }
    qsort(times + 1, repeat, sizeof(double), less);
    fprintf(stderr, "%.6f\n", 1e3 * times[1 + repeat / 2]);
    fwrite(outputs[0], 1, bench_outputs[0].bytes, stdout);
    return 0;
}
"""


def build(compiled: pf.CompiledModel, folder: Path, target: str, threads: bool) -> Path:
    compiled.save_bundle(folder, "bench", threads=threads)
    (folder / "timer.c").write_text(TIMER)
    exe = folder / "timer"
    subprocess.run([*c_compiler(pf.Target.parse(target)), "-O2", "-std=c11", str(folder / "timer.c"),
                    str(folder / "bench.o"), "-o", str(exe), "-lm", "-pthread"], check=True)
    return exe


def run_bundle(exe: Path, folder: Path, feed: dict[str, np.ndarray], repeat: int,
               target: str = "x86") -> tuple[float, bytes]:
    files = []
    for name, array in feed.items():
        path = folder / f"{name}.bin"
        array.tofile(path)
        files.append(str(path))
    done = subprocess.run([*runner_prefix(pf.Target.parse(target)), str(exe), str(repeat),
                           str(folder / "bench.weights.bin"), *files], capture_output=True, check=True)
    return float(done.stderr.decode().split()[-1]) / 1e3, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--only", default="resnet18,mobilenet,bert_layer")
    parser.add_argument("--aarch64", action="store_true", help="also check aarch64 bundles under qemu")
    args = parser.parse_args()
    print(f"{'model':<11} {'build s':>7} {'object MB':>9} {'weights MB':>10} {'bundle ms':>9} "
          f"{'run() ms':>9} {'ort-2 ms':>9} {'ort/bundle':>10} {'max |diff|':>10}")
    for name in filter(None, args.only.split(",")):
        model, shapes = MODELS[name]()
        feed = {k: np.random.default_rng(1).standard_normal(s).astype(np.float32) for k, s in shapes.items()}
        compiled = pf.compile(model, target="x86", input_shapes=shapes)
        want = list(compiled.run(feed).values())[0]
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            t = time.perf_counter()
            exe = build(compiled, folder, "x86", threads=True)
            build_s = time.perf_counter() - t
            so = ort.SessionOptions()
            so.intra_op_num_threads = 2
            sess = ort.InferenceSession(model.SerializeToString(), so)
            samples = [run_bundle(exe, folder, feed, args.repeat)[0] for _ in range(3)]
            times = interleaved_times({"run": lambda: compiled.run(feed),
                                       "ort": lambda: sess.run(None, feed)}, args.repeat)
            bundle_s = statistics.median(samples)
            out = np.frombuffer(run_bundle(exe, folder, feed, 1)[1], want.dtype).reshape(want.shape)
            print(f"{name:<11} {build_s:7.1f} {(folder / 'bench.o').stat().st_size / 2**20:9.2f} "
                  f"{(folder / 'bench.weights.bin').stat().st_size / 2**20:10.1f} {bundle_s * 1e3:9.2f} "
                  f"{times['run'] * 1e3:9.2f} {times['ort'] * 1e3:9.2f} {times['ort'] / bundle_s:10.2f} "
                  f"{float(np.abs(out - want).max()):10.2e}", flush=True)
        if args.aarch64:
            arm = pf.compile(model, target="aarch64", input_shapes=shapes)
            with tempfile.TemporaryDirectory() as tmp:
                exe = build(arm, Path(tmp), "aarch64", threads=True)
                seconds, data = run_bundle(exe, Path(tmp), feed, 1, "aarch64")
                out = np.frombuffer(data, want.dtype).reshape(want.shape)
                print(f"  aarch64 bundle under qemu: max |aarch64 - x86 run()| = "
                      f"{float(np.abs(out - want).max()):.2e} ({seconds * 1e3:.0f} ms emulated)", flush=True)


if __name__ == "__main__":
    main()
