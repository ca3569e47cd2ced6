"""Random ONNX graphs for the fuzzer, valid and broken: chains of elementwise, linear
algebra, movement, reduction, normalization, convolution and pooling nodes over tracked
shapes, then now and then one defect (an attribute out of range or of the wrong kind, a
missing or unknown input, another dtype, a huge or symbolic dim, a node out of order).

onnxruntime is the oracle: where it runs the model, polyfuse (on the native target) must
give its answer or raise a polyfuse error; where it refuses, polyfuse must refuse too, or
is counted ``lenient`` (it ran a model onnxruntime would not; reviewed, not a defect by
itself)."""

from __future__ import annotations

import functools
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf

from tests.fuzz.outcomes import Tally, judge, outcome_of

OPSET = 17
UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Neg", "Sqrt", "Log", "Erf", "Floor", "Ceil",
         "Reciprocal", "Softsign", "Softplus", "Sin", "Cos", "Identity", "HardSwish"]
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"]
REDUCE = ["ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceLogSumExp"]


class Builder:
    """A graph under construction: tensors with their shapes, nodes, initializers."""

    def __init__(self, draw) -> None:
        self.draw = draw
        self.nodes: list = []
        self.inits: list = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.count = 0

    def name(self, stem: str = "t") -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def const(self, array: np.ndarray) -> str:
        name = self.name("c")
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def floats(self, *shape: int) -> str:
        seed = self.draw(st.integers(0, 2**16))
        return self.const(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))

    def ints(self, values) -> str:
        return self.const(np.asarray(values, np.int64))

    def add(self, op: str, inputs: list[str], shape: tuple[int, ...], **attrs) -> str:
        out = self.name()
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{op.lower()}_{self.count}",
                                           **attrs))
        self.shapes[out] = tuple(shape)
        return out

    def pick(self, min_rank: int = 0, rank: int | None = None) -> str | None:
        names = [n for n, s in self.shapes.items()
                 if len(s) >= min_rank and (rank is None or len(s) == rank)]
        return self.draw(st.sampled_from(names)) if names else None


def _axis(draw, rank: int) -> int:
    return draw(st.integers(-rank, rank - 1)) if rank else 0


def grow(b: Builder) -> None:
    """Add one node over the tensors built so far."""
    draw = b.draw
    kind = draw(st.sampled_from(["unary", "unary", "binary", "binary", "matmul", "transpose",
                                 "reshape", "softmax", "reduce", "concat", "slice", "conv",
                                 "pool", "unsqueeze", "where", "norm", "gather", "clip", "gemm",
                                 "flatten", "cast"]))
    x = b.pick()
    s = b.shapes[x]
    r = len(s)
    if kind == "unary":
        b.add(draw(st.sampled_from(UNARY)), [x], s)
    elif kind == "binary":
        other = b.pick()
        if b.shapes[other] != s:
            tail = s[draw(st.integers(0, r)):]
            other = b.floats(*tail) if draw(st.booleans()) else b.floats(*([1] * len(tail)))
        op = draw(st.sampled_from(BINARY))
        b.add(op, [x, other] if draw(st.booleans()) else [other, x], s)
    elif kind == "matmul" and r >= 1:
        n = draw(st.integers(1, 4))
        b.add("MatMul", [x, b.floats(s[-1], n)], s[:-1] + (n,))
    elif kind == "gemm" and r == 2:
        n = draw(st.integers(1, 4))
        b.add("Gemm", [x, b.floats(n, s[1]), b.floats(n)], (s[0], n), transB=1,
              alpha=draw(st.sampled_from([1.0, 0.5])))
    elif kind == "transpose" and r >= 2:
        perm = list(draw(st.permutations(range(r))))
        b.add("Transpose", [x], tuple(s[p] for p in perm), perm=perm)
    elif kind == "reshape" and r >= 1:
        total = int(np.prod(s))
        target = [total] if draw(st.booleans()) else [-1, s[-1]]
        b.add("Reshape", [x, b.ints(target)], (total,) if len(target) == 1 else
              (total // s[-1], s[-1]))
    elif kind == "softmax" and r >= 1:
        b.add(draw(st.sampled_from(["Softmax", "LogSoftmax"])), [x], s, axis=_axis(draw, r))
    elif kind == "reduce" and r >= 1:
        axis = _axis(draw, r)
        keep = draw(st.integers(0, 1))
        out = s[:axis % r] + ((1,) if keep else ()) + s[axis % r + 1:]
        if draw(st.booleans()):
            b.add("ReduceSum", [x, b.ints([axis])], out, keepdims=keep)
        else:
            b.add(draw(st.sampled_from(REDUCE)), [x], out, axes=[axis], keepdims=keep)
    elif kind == "concat" and r >= 1:
        axis = _axis(draw, r)
        b.add("Concat", [x, x], s[:axis % r] + (2 * s[axis % r],) + s[axis % r + 1:], axis=axis)
    elif kind == "slice" and r >= 1:
        axis = _axis(draw, r)
        n = s[axis % r]
        start = draw(st.integers(0, max(0, n - 1)))
        b.add("Slice", [x, b.ints([start]), b.ints([n]), b.ints([axis])],
              s[:axis % r] + (n - start,) + s[axis % r + 1:])
    elif kind in ("conv", "pool") and r == 4:
        k = draw(st.integers(1, min(3, s[2], s[3])))
        stride = draw(st.integers(1, 2))
        pad = draw(st.integers(0, k - 1))
        hw = tuple((d + 2 * pad - k) // stride + 1 for d in s[2:])
        attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
        if kind == "conv":
            group = s[1] if draw(st.booleans()) else 1
            m = s[1] if group > 1 else draw(st.integers(1, 4))
            b.add("Conv", [x, b.floats(m, s[1] // group, k, k), b.floats(m)], (s[0], m) + hw,
                  group=group, **attrs)
        else:
            b.add(draw(st.sampled_from(["MaxPool", "AveragePool"])), [x], s[:2] + hw, **attrs)
    elif kind == "unsqueeze" and r <= 3:
        axis = draw(st.integers(-r - 1, r))
        b.add("Unsqueeze", [x, b.ints([axis])], s[:axis % (r + 1)] + (1,) + s[axis % (r + 1):])
    elif kind == "where":
        cond = b.add("Greater", [x, b.floats(*s[-1:])], s)
        del b.shapes[cond]  # the builder's tensors are all float32
        b.add("Where", [cond, x, b.pick()] if b.shapes[b.pick()] == s else [cond, x, x], s)
    elif kind == "norm" and r >= 2:
        if r == 4 and draw(st.booleans()):
            c = s[1]
            var = np.abs(np.random.default_rng(c).standard_normal(c)).astype(np.float32) + 0.5
            b.add("BatchNormalization", [x, b.floats(c), b.floats(c), b.floats(c), b.const(var)], s)
        else:
            b.add("LayerNormalization", [x, b.floats(s[-1]), b.floats(s[-1])], s, axis=-1)
    elif kind == "gather" and r >= 1:
        axis = _axis(draw, r)
        n = s[axis % r]
        idx = draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=3))
        b.add("Gather", [x, b.ints(idx)], s[:axis % r] + (len(idx),) + s[axis % r + 1:], axis=axis)
    elif kind == "clip":
        b.add("Clip", [x, b.const(np.float32(-0.5)), b.const(np.float32(0.5))], s)
    elif kind == "flatten" and r >= 1:
        axis = draw(st.integers(0, r))
        b.add("Flatten", [x], (int(np.prod(s[:axis])), int(np.prod(s[axis:]))), axis=axis)
    elif kind == "cast":
        half = b.add("Cast", [x], s, to=TensorProto.FLOAT16)
        del b.shapes[half]  # the builder's tensors are all float32
        b.add("Cast", [half], s, to=TensorProto.FLOAT)


DEFECTS = ["attribute", "attribute", "attribute", "input", "dtype", "dim", "order", "op",
           "initializer"]


def damage(draw, model: onnx.ModelProto) -> None:
    """One defect, in place."""
    g = model.graph
    what = draw(st.sampled_from(DEFECTS))
    if not g.node:
        return
    n = g.node[draw(st.integers(0, len(g.node) - 1))]
    if what == "attribute" and n.attribute:
        a = n.attribute[draw(st.integers(0, len(n.attribute) - 1))]
        value = draw(st.sampled_from([-7, -1, 0, 5, 2**31, 2**40, 3]))
        if a.type == onnx.AttributeProto.INT:
            a.i = value
        elif a.type == onnx.AttributeProto.INTS:
            a.ints[:] = draw(st.sampled_from([[], [value], list(a.ints) + [value],
                                              [value] * max(1, len(a.ints))]))
        elif a.type == onnx.AttributeProto.FLOAT:
            a.f = draw(st.sampled_from([float("nan"), -1.0, 1e30, 0.0]))
        if draw(st.integers(0, 3)) == 0:  # the wrong kind of value
            n.attribute.remove(a)
            n.attribute.append(helper.make_attribute(a.name, "text"))
    elif what == "attribute":
        n.attribute.append(helper.make_attribute(draw(st.sampled_from(
            ["axis", "perm", "pads", "group", "keepdims", "bogus"])), draw(st.sampled_from([9, -9, [1, 2]]))))
    elif what == "input":
        choice = draw(st.integers(0, 2))
        if choice == 0 and n.input:
            del n.input[-1]
        elif choice == 1 and n.input:
            n.input[0] = "nowhere"
        else:
            n.input.append(g.input[0].name)
    elif what == "dtype":
        t = draw(st.sampled_from([TensorProto.DOUBLE, TensorProto.INT32, TensorProto.FLOAT16,
                                  TensorProto.BOOL, TensorProto.STRING, TensorProto.UINT8]))
        draw(st.sampled_from([g.input[0], g.output[0]])).type.tensor_type.elem_type = t
    elif what == "dim":
        dims = g.input[0].type.tensor_type.shape.dim
        if dims:
            d = dims[draw(st.integers(0, len(dims) - 1))]
            value = draw(st.sampled_from([0, -1, 2**40, "?", "", "N"]))
            if isinstance(value, str):
                d.dim_param = value
            else:
                d.dim_value = value
    elif what == "order" and len(g.node) > 1:
        first = g.node[0]
        copy = onnx.NodeProto()
        copy.CopyFrom(first)
        g.node.remove(first)
        g.node.append(copy)
    elif what == "op":
        n.op_type = draw(st.sampled_from(UNARY + BINARY + ["Concat", "Softmax", "Conv", "Bogus",
                                                           "MatMul", "Expand", "ConstantOfShape"]))
    elif what == "initializer" and g.initializer:
        t = g.initializer[draw(st.integers(0, len(g.initializer) - 1))]
        value = numpy_helper.to_array(t)
        huge = draw(st.sampled_from([[2**20, 2**20], [value.size + 1], [0], [-5]]))
        if value.dtype == np.int64:
            t.CopyFrom(numpy_helper.from_array(np.asarray(huge, np.int64), t.name))
        else:
            t.dims[:] = huge[:1]


@functools.cache
def canonical_models() -> tuple[bytes, ...]:
    """The whole models of the ONNX tests: a CNN, a transformer block, causal attention
    and an MLP."""
    from tests.onnx.test_frontend import mlp
    from tests.onnx.test_models import causal_self_attention, cnn, transformer_block
    models = [cnn(), transformer_block(gelu_op=False), causal_self_attention(), mlp()]
    for m in models:
        m.ir_version = 10
    return tuple(m.SerializeToString() for m in models)


def feeds_for(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    """Random feeds for the model's inputs, symbolic dims 1 to 3 (one size per name)."""
    rng = np.random.default_rng(seed)
    sizes: dict[str, int] = {}
    feeds = {}
    for value in model.graph.input:
        t = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else
                 sizes.setdefault(d.dim_param, int(rng.integers(1, 4))) for d in t.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        a = rng.standard_normal(shape) if dtype.kind == "f" else rng.integers(0, 2, shape)
        feeds[value.name] = a.astype(dtype)
    return feeds


@st.composite
def damaged_canonical(draw) -> tuple[bytes, dict[str, np.ndarray]]:
    model = onnx.load_from_string(draw(st.sampled_from(canonical_models())))
    feeds = feeds_for(model, draw(st.integers(0, 2**31 - 1)))
    if draw(st.integers(0, 3)):
        damage(draw, model)
    return model.SerializeToString(), feeds


def cases():
    """A model (serialized) and feeds for it: mostly small random graphs, one in twenty
    a canonical model."""
    return st.integers(0, 19).flatmap(lambda k: damaged_canonical() if k == 0 else random_graphs())


@st.composite
def random_graphs(draw) -> tuple[bytes, dict[str, np.ndarray]]:
    b = Builder(draw)
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(1, 4)) if i < 2 or rank < 4 else draw(st.integers(3, 6))
                  for i in range(rank))
    b.shapes["x"] = shape
    for _ in range(draw(st.integers(1, 6))):
        grow(b)
    outs = [n for n in b.shapes if n != "x"] or ["x"]
    out = outs[-1]
    if out == "x":
        out = b.add("Identity", ["x"], shape)
    symbolic = draw(st.sampled_from([None, None, "N", "?", -1]))
    in_dims = [symbolic if symbolic is not None and i == 0 else d for i, d in enumerate(shape)]
    graph = helper.make_graph(
        b.nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_dims)],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, b.shapes[out])], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10
    if draw(st.integers(0, 2)) == 0:
        damage(draw, model)
    seed = draw(st.integers(0, 2**31 - 1))
    feeds = {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}
    return model.SerializeToString(), feeds


class ReferenceCrashed(RuntimeError):
    """onnxruntime ended its process with a signal on this model."""


def _onnxruntime(model: bytes, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 4
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]).run(None, feeds)


_pool: list[ProcessPoolExecutor] = []


def onnxruntime_run(model: bytes, feeds: dict) -> list[np.ndarray]:
    """onnxruntime's outputs, computed in a worker process: onnxruntime aborts on some
    malformed models, and that must not end the fuzzer (it raises ReferenceCrashed)."""
    if not _pool:
        _pool.append(ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")))
    try:
        return _pool[0].submit(_onnxruntime, model, feeds).result()
    except BrokenProcessPool:
        _pool.pop().shutdown(wait=False)
        raise ReferenceCrashed("onnxruntime died on this model") from None


def describe(model: bytes) -> str:
    try:
        return onnx.printer.to_text(onnx.load_from_string(model))
    except Exception:  # noqa: BLE001 - a model the printer cannot show is shown as bytes
        return repr(model[:2000])


def run_case(case: tuple[bytes, dict], target: str, tally: Tally) -> None:
    model, feeds = case
    want = outcome_of(lambda: onnxruntime_run(model, feeds))
    got = outcome_of(lambda: list(pf.compile(model, target=target).run(feeds).values()))
    judge(tally, want, got, lambda: describe(model), reference_refused="lenient",
          rtol=1e-3, atol=1e-4)
