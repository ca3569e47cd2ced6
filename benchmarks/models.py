"""Whole models against onnxruntime, in one process.

    python benchmarks/models.py [--repeat 5] [--only resnet18,mobilenet,bert_layer,mlp]

Builds ResNet-18 (224x224, batch 1), a MobileNetV2-style net (depthwise + pointwise) and
a BERT-base-sized encoder layer (seq 128, hidden 768, 12 heads) with onnx.helper and
random weights; prints compile time, the number of kernels after fusion, median latency
(a new input each call, each runtime timed after a pause) of polyfuse (all cores) and of
onnxruntime with 1 and 2 threads, ratio = onnxruntime
(all cores) / polyfuse, and the activation arena against the naive sum of activations;
then the per-call time of a small MLP (``--only mlp``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from timing import median_time


class Builder:
    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def weight(self, shape: tuple[int, ...], scale: float = 0.05) -> str:
        n = self.name("w")
        self.inits.append(numpy_helper.from_array(
            (self.rng.standard_normal(shape) * scale).astype(np.float32), n))
        return n

    def const(self, array: np.ndarray) -> str:
        n = self.name("c")
        self.inits.append(numpy_helper.from_array(array, n))
        return n

    def op(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
                act: str | None = "relu") -> str:
        w = self.weight((cout, cin // group, k, k), scale=(2.0 / (cin // group * k * k)) ** 0.5)
        y = self.op("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride],
                    pads=[k // 2] * 4, group=group)
        bn = [self.const(np.ones(cout, np.float32)), self.const(np.zeros(cout, np.float32)),
              self.const((self.rng.standard_normal(cout) * 0.1).astype(np.float32)),
              self.const(np.ones(cout, np.float32))]
        y = self.op("BatchNormalization", [y, *bn])
        if act == "relu":
            y = self.op("Relu", [y])
        elif act == "relu6":
            y = self.op("Clip", [y, self.const(np.array(0, np.float32)), self.const(np.array(6, np.float32))])
        return y

    def model(self, x: str, shape: list[int], y: str, name: str, out_shape: list[int]):
        graph = helper.make_graph(self.nodes, name, [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
                                  [helper.make_tensor_value_info(y, TensorProto.FLOAT, out_shape)], self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def resnet18():
    b = Builder()
    y = b.conv_bn("input", 3, 64, 7, stride=2)
    y = b.op("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for cout, stride in [(64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)]:
        h = b.conv_bn(y, cin, cout, 3, stride)
        h = b.conv_bn(h, cout, cout, 3, 1, act=None)
        skip = b.conv_bn(y, cin, cout, 1, stride, act=None) if (stride != 1 or cin != cout) else y
        y = b.op("Relu", [b.op("Add", [h, skip])])
        cin = cout
    y = b.op("Flatten", [b.op("GlobalAveragePool", [y])])
    y = b.op("Gemm", [y, b.weight((1000, 512)), b.weight((1000,))], transB=1)
    return b.model("input", [1, 3, 224, 224], y, "resnet18", [1, 1000]), {"input": (1, 3, 224, 224)}


def mobilenet():
    b = Builder()
    y = b.conv_bn("input", 3, 32, 3, stride=2, act="relu6")
    cin = 32
    for cout, stride, expand in [(16, 1, 1), (24, 2, 6), (24, 1, 6), (32, 2, 6), (32, 1, 6),
                                 (64, 2, 6), (64, 1, 6), (96, 1, 6), (160, 2, 6), (320, 1, 6)]:
        hidden = cin * expand
        h = b.conv_bn(y, cin, hidden, 1, act="relu6") if expand != 1 else y
        h = b.conv_bn(h, hidden, hidden, 3, stride, group=hidden, act="relu6")
        h = b.conv_bn(h, hidden, cout, 1, act=None)
        y = b.op("Add", [h, y]) if stride == 1 and cin == cout else h
        cin = cout
    y = b.conv_bn(y, cin, 1280, 1, act="relu6")
    y = b.op("Flatten", [b.op("GlobalAveragePool", [y])])
    y = b.op("Gemm", [y, b.weight((1000, 1280)), b.weight((1000,))], transB=1)
    return b.model("input", [1, 3, 224, 224], y, "mobilenet", [1, 1000]), {"input": (1, 3, 224, 224)}


def bert_layer(seq: int = 128, hidden: int = 768, heads: int = 12):
    b = Builder()
    d = hidden // heads

    def linear(x: str, n_in: int, n_out: int) -> str:
        return b.op("Add", [b.op("MatMul", [x, b.weight((n_in, n_out))]), b.weight((n_out,))])

    def split_heads(x: str) -> str:
        x = b.op("Reshape", [x, b.const(np.array([1, seq, heads, d], np.int64))])
        return b.op("Transpose", [x], perm=[0, 2, 1, 3])

    def layernorm(x: str) -> str:
        return b.op("LayerNormalization", [x, b.const(np.ones(hidden, np.float32)),
                                           b.const(np.zeros(hidden, np.float32))], axis=-1)

    x = "input"
    q, k, v = (split_heads(linear(x, hidden, hidden)) for _ in range(3))
    scores = b.op("Div", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                          b.const(np.array(d ** 0.5, np.float32))])
    ctx = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
    ctx = b.op("Reshape", [b.op("Transpose", [ctx], perm=[0, 2, 1, 3]),
                           b.const(np.array([1, seq, hidden], np.int64))])
    h = layernorm(b.op("Add", [linear(ctx, hidden, hidden), x]))
    f = linear(h, hidden, 4 * hidden)
    gelu = b.op("Mul", [b.op("Mul", [f, b.const(np.array(0.5, np.float32))]),
                        b.op("Add", [b.op("Erf", [b.op("Div", [f, b.const(np.array(2 ** 0.5, np.float32))])]),
                                     b.const(np.array(1.0, np.float32))])])
    y = layernorm(b.op("Add", [linear(gelu, 4 * hidden, hidden), h]))
    return b.model("input", [1, seq, hidden], y, "bert_layer", [1, seq, hidden]), {"input": (1, seq, hidden)}


MODELS = {"resnet18": resnet18, "mobilenet": mobilenet, "bert_layer": bert_layer}


def small_mlp():
    """Batch 1, 16 -> 32 -> 4: what a call costs beyond its arithmetic."""
    b = Builder()
    h = b.op("Relu", [b.op("Add", [b.op("MatMul", ["input", b.weight((16, 32))]), b.weight((32,))])])
    y = b.op("MatMul", [h, b.weight((32, 4))])
    return b.model("input", [1, 16], y, "mlp", [1, 4]), {"input": (1, 16)}


def fresh_median(run, feeds: list[dict]) -> float:
    """Median seconds of ``run`` over ``feeds`` (one warm-up call on the first), after a
    pause that lets the previous runtime's spinning thread pool go to sleep."""
    return statistics.median(fresh_times(run, feeds))


def fresh_times(run, feeds: list[dict]) -> list[float]:
    """Seconds of each call of ``run`` on ``feeds[1:]``, after a pause and one warm-up call
    on ``feeds[0]``."""
    time.sleep(PAUSE)
    run(feeds[0])
    times = []
    for feed in feeds[1:]:
        t = time.perf_counter()
        run(feed)
        times.append(time.perf_counter() - t)
    return times


PAUSE = 0.5   # seconds between one runtime's block of calls and the next's


def call_overhead(repeat: int) -> None:
    """Median time of one call of the small MLP, polyfuse against onnxruntime."""
    model, shapes = small_mlp()
    x = {"input": np.random.default_rng(1).standard_normal(shapes["input"]).astype(np.float32)}
    compiled = pf.compile(model, target="host", input_shapes=shapes)
    sess = ort.InferenceSession(model.SerializeToString())
    np.testing.assert_allclose(list(compiled.run(x).values())[0], sess.run(None, x)[0], rtol=1e-4, atol=1e-5)
    n = 2000
    ours = median_time(lambda: [compiled.run(x) for _ in range(n)], repeat) / n
    theirs = median_time(lambda: [sess.run(None, x) for _ in range(n)], repeat) / n
    print(f"\nsmall MLP call: polyfuse {ours * 1e6:.1f} us, onnxruntime {theirs * 1e6:.1f} us, "
          f"ratio ort/pf {theirs / ours:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    wanted = set(filter(None, args.only.split(",")))
    print(f"{'model':<11} {'compile s':>9} {'kernels':>7} {'polyfuse ms':>11} {'ort-1 ms':>9} "
          f"{'ort-2 ms':>9} {'ort/pf':>7} {'arena MB':>9} {'naive MB':>9}")
    for name, build in MODELS.items():
        if wanted and name not in wanted:
            continue
        model, shapes = build()
        rng = np.random.default_rng(1)
        # a new input on every call (a repeated feed could hide re-planning or folding)
        feeds = [{k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
                 for _ in range(args.repeat + 1)]
        feed = feeds[0]
        t = time.perf_counter()
        compiled = pf.compile(model, target="host", input_shapes=shapes)
        compile_s = time.perf_counter() - t
        ours = fresh_median(compiled.run, feeds)
        ort_times = []
        for threads in (1, 2):
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            sess = ort.InferenceSession(model.SerializeToString(), so)
            ort_times.append(fresh_median(lambda f: sess.run(None, f), feeds))
        want = sess.run(None, feed)[0]
        got = list(compiled.run(feed).values())[0]
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
        plan = compiled.memory_plan(**shapes)
        kernels = len(compiled.profile(feed, repeat=1))
        print(f"{name:<11} {compile_s:9.1f} {kernels:7d} {ours * 1e3:11.2f} {ort_times[0] * 1e3:9.2f} "
              f"{ort_times[1] * 1e3:9.2f} {ort_times[1] / ours:7.2f} "
              f"{plan.arena_bytes / 2**20:9.1f} {plan.naive_bytes / 2**20:9.1f}", flush=True)
    if not wanted or "mlp" in wanted:
        call_overhead(args.repeat)


if __name__ == "__main__":
    main()
