"""int8 quantization of an ONNX model as a standard QDQ model, from a profile.

Every Conv, MatMul and Gemm (but those kept float) gets its operands in int8: each
activation it reads or writes passes through a QuantizeLinear -> DequantizeLinear pair
(uint8, per tensor, calibrated from the profile; a product's output through its ReLU or
Clip first, when one alone reads it), its constant weights are stored as int8
(symmetric, per output channel by default) behind a DequantizeLinear, and its constant
bias as int32 at the product's scale. A movement op or max pool between two quantized
activations keeps its input's quantization. All readers of a quantized activation read the
pair's output, as onnxruntime's QDQ quantizer writes it: the graph pass
``fuse_integer_ops`` then finds each product between a dequantization and a
quantization and computes it in integers. Other ops (Softmax, LayerNormalization, ...)
and the model's outputs stay float. The result is an ordinary ONNX model (opset >= 13)
that onnxruntime runs too.

The model's digest is the sha256 of its ONNX bytes (a file's, or the serialized
``ModelProto``): a profile records it, and is refused for another model.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from polyfuse.errors import ArgumentError, ModelError
from polyfuse.frontends.onnx import load_model
from polyfuse.ir.profile import Profile
from polyfuse.lowering.calibration import (QuantizeOptions, Quantization, activation_quantization,
                                           bias_quantization, weight_quantization)
from polyfuse.lowering.integer_ops import MOVEMENT

PRODUCTS = ("Conv", "MatMul", "Gemm")
ACTIVATIONS = ("Relu", "Clip")   # quantized after them: their ranges hold the product's used values
MIN_OPSET = 13   # per-axis DequantizeLinear


def model_digest(model: str | os.PathLike | bytes | onnx.ModelProto) -> str:
    """The sha256 of the model's ONNX bytes."""
    if isinstance(model, onnx.ModelProto):
        data = model.SerializeToString()
    elif isinstance(model, (bytes, bytearray)):
        data = bytes(model)
    else:
        try:
            data = Path(model).read_bytes()
        except OSError as err:
            raise ModelError(f"cannot read the ONNX model: {err}") from None
    return hashlib.sha256(data).hexdigest()


def quantize(model: str | os.PathLike | bytes | onnx.ModelProto, profile: str | os.PathLike | Profile,
             options: QuantizeOptions = QuantizeOptions()) -> onnx.ModelProto:
    """The QDQ model of ``model`` calibrated from ``profile`` (made from this model)."""
    profile = Profile.load(profile)
    profile.check_model(model_digest(model))
    proto = onnx.ModelProto()
    proto.CopyFrom(load_model(model))
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        raise ModelError(f"quantizing needs opset {MIN_OPSET} or later (per-channel "
                         f"DequantizeLinear); the model has opset {opset}: convert it with "
                         "onnx.version_converter.convert_version")
    names = {n.name for n in proto.graph.node}
    unknown = sorted(options.keep_float - names)
    if unknown:
        raise ArgumentError(f"keep_float names no node of the model: {', '.join(unknown)}")
    _Rewrite(proto.graph, profile, options).run()
    return proto


@dataclass
class _Rewrite:
    """The QDQ rewrite of one graph, in place."""

    graph: onnx.GraphProto
    profile: Profile
    options: QuantizeOptions
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)
    activations: dict[str, Quantization] = field(default_factory=dict)   # tensor -> its uint8
    front: list[onnx.NodeProto] = field(default_factory=list)           # weights' DQs

    def run(self) -> None:
        g = self.graph
        self.weights = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        self.used = {v for n in g.node for v in (*n.input, *n.output, n.name)} | set(self.weights) \
            | {v.name for v in g.input}
        outputs = {v.name for v in g.output}
        readers = _readers(g.node)
        chosen = [n for n in g.node if self._quantizable(n)]
        for n in chosen:
            for t in self._activations_of(n, readers, outputs):
                if t not in self.activations and t in self.profile.tensors:
                    self.activations[t] = activation_quantization(
                        self.profile.tensors[t], self.options.method, self.options.percentile)
        self._share_through_movement()
        for n in chosen:
            if all(t in self.activations for t in n.input[:2] if t not in self.weights):
                self._quantize_operands(n)
        self._insert_pairs(outputs)
        read = {t for n in g.node for t in n.input} | outputs
        kept = [t for t in g.initializer if t.name in read]
        del g.initializer[:]
        g.initializer.extend(kept)

    def _share_through_movement(self) -> None:
        """A movement op's output (a max pool's too: its values are some of its input's)
        quantized as its input is, so the op can move the integers themselves."""
        for n in self.graph.node:
            if n.op_type in MOVEMENT and n.input and n.input[0] in self.activations \
                    and n.output[0] in self.activations:
                self.activations[n.output[0]] = self.activations[n.input[0]]

    def _quantizable(self, n: onnx.NodeProto) -> bool:
        if n.op_type not in PRODUCTS or n.name in self.options.keep_float or len(n.input) < 2:
            return False
        if n.op_type == "Gemm" and (_attr(n, "transA", 0) or _attr(n, "alpha", 1.0) != 1.0
                                    or _attr(n, "beta", 1.0) != 1.0):
            return False
        w = self.weights.get(n.input[1])
        if n.op_type != "MatMul" and w is None:
            return False
        a = self.weights.get(n.input[0])
        return (w is None or w.dtype == np.float32) and (a is None and n.input[0] != "")

    def _activations_of(self, n: onnx.NodeProto, readers: dict[str, list[onnx.NodeProto]],
                        outputs: set[str]) -> list[str]:
        """The activations around a product: its non-constant inputs, and its output (after
        a ReLU alone reading it) unless that is a model output."""
        ins = [t for t in n.input[:2] if t not in self.weights]
        out = n.output[0]
        after = readers.get(out, [])
        if len(after) == 1 and after[0].op_type in ACTIVATIONS and out not in outputs:
            out = after[0].output[0]
        return ins + ([] if out in outputs else [out])

    def _quantize_operands(self, n: onnx.NodeProto) -> None:
        """Read the weights (and bias) of ``n`` in int8 (int32) through DequantizeLinear."""
        if n.input[1] not in self.weights:
            return
        w = self.weights[n.input[1]]
        axis = _channel_axis(n, w) if self.options.per_channel else None
        q, wq = weight_quantization(w, axis)
        n.input[1] = self._dequantized_constant(n.input[1], q, wq, axis)
        if len(n.input) > 2 and n.input[2] in self.weights:
            b = self.weights[n.input[2]]
            channels = w.shape[axis] if axis is not None else None
            if b.dtype == np.float32 and b.ndim == 1 and b.size in (1, channels or b.size):
                bq, qb = bias_quantization(b, self.activations[n.input[0]].scale, wq.scale)
                n.input[2] = self._dequantized_constant(n.input[2], bq, qb,
                                                        0 if qb.scale.ndim else None)

    def _dequantized_constant(self, name: str, q: np.ndarray, quant: Quantization,
                              axis: int | None) -> str:
        base = self._fresh(f"{name}_quantized")
        scale, zero, out = (self._fresh(f"{name}_{s}") for s in ("scale", "zero_point", "dequantized"))
        self.graph.initializer.extend([numpy_helper.from_array(q, base),
                                       numpy_helper.from_array(quant.scale, scale),
                                       numpy_helper.from_array(quant.zero_point, zero)])
        attrs = {} if axis is None else {"axis": axis}
        self.front.append(helper.make_node("DequantizeLinear", [base, scale, zero], [out],
                                           name=self._fresh(f"{name}_DequantizeLinear"), **attrs))
        return out

    def _insert_pairs(self, outputs: set[str]) -> None:
        """A QuantizeLinear -> DequantizeLinear pair after each quantized activation, which
        every reader then reads (the nodes stay in topological order)."""
        renamed: dict[str, str] = {}
        pairs: dict[str, list[onnx.NodeProto]] = {}
        for t, quant in self.activations.items():
            scale, zero, q, dq = (self._fresh(f"{t}_{s}") for s in
                                  ("scale", "zero_point", "quantized", "dequantized"))
            self.graph.initializer.extend([numpy_helper.from_array(quant.scale, scale),
                                           numpy_helper.from_array(quant.zero_point, zero)])
            pairs[t] = [helper.make_node("QuantizeLinear", [t, scale, zero], [q],
                                         name=self._fresh(f"{t}_QuantizeLinear")),
                        helper.make_node("DequantizeLinear", [q, scale, zero], [dq],
                                         name=self._fresh(f"{t}_DequantizeLinear"))]
            renamed[t] = dq
        nodes = list(self.front)
        nodes += [p for v in self.graph.input for p in pairs.get(v.name, ())]
        for n in self.graph.node:
            for k, t in enumerate(n.input):
                if t in renamed:
                    n.input[k] = renamed[t]
            nodes.append(n)
            nodes += [p for o in n.output for p in pairs.get(o, ())]
        del self.graph.node[:]
        self.graph.node.extend(nodes)

    def _fresh(self, name: str) -> str:
        k, fresh = 0, name
        while fresh in self.used:
            k += 1
            fresh = f"{name}_{k}"
        self.used.add(fresh)
        return fresh


def _readers(nodes: Iterable[onnx.NodeProto]) -> dict[str, list[onnx.NodeProto]]:
    users: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for t in n.input:
            users.setdefault(t, []).append(n)
    return users


def _attr(n: onnx.NodeProto, name: str, default: float) -> float:
    for a in n.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _channel_axis(n: onnx.NodeProto, w: np.ndarray) -> int | None:
    """The weights' output channel axis: a Conv's first, a matrix's columns (a Gemm's rows
    when it multiplies by their transpose); None for a batch of matrices."""
    if n.op_type == "Conv":
        return 0
    if w.ndim != 2:
        return None
    return 0 if n.op_type == "Gemm" and _attr(n, "transB", 0) else 1
