"""The graph pass ``fuse_integer_ops``: quantized products of a QDQ model on integers.

A QDQ model (``polyfuse quantize``'s, onnxruntime's ``quantize_static``) writes an int8
product as floats: ``DequantizeLinear(x_u8), DequantizeLinear(w_s8) -> Conv -> (Relu) ->
QuantizeLinear``. Computed as written, the convolution multiplies dequantized floats.
This pass replaces each such chain by one integer op, whose lowering sums ``(x - zx) *
(w - zw)`` in int32, adds the int32 bias and requantizes to the output's type in the
same kernel: Conv becomes QLinearConv, MatMul QLinearMatMul, Gemm polyfuse's
QLinearGemm; a ReLU between becomes ``Max(y, zy)`` on the quantized output (exact: 0
is a quantized value), a Clip to constant bounds a Clip to the bounds quantized. The integer output feeds the next product directly (its
dequantization goes when nothing else reads it), so activations stay 8-bit between
kernels. A float bias is quantized at the product's scale ``sx * sw``; a dequantized
int32 bias is used as it is when its scale is that product.

A MatMul or Gemm of a dequantized activation and dequantized constant weights whose float
result no quantization reads (a classifier's logits) runs as MatMulInteger too, its
int32 sums (with the int32 bias, as above) dequantized at ``sx * sw`` (per column).

Movement ops between a dequantization and a quantization of the same scale and zero
point (a flatten before a classifier) move the integers themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from polyfuse.ir.graph import Constant, Graph, Node, consumers, sole_use

INTEGER_OPS = {"Conv": "QLinearConv", "MatMul": "QLinearMatMul", "Gemm": "QLinearGemm"}
CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
MOVEMENT = ("Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "MaxPool")
EIGHT_BITS = (np.uint8, np.int8)


@dataclass(frozen=True)
class _Quantized:
    """A DequantizeLinear's operands: the integer value, its scale and zero point."""

    value: str
    scale: Constant
    zero: Constant
    axis: int = 1     # of a scale per slice (as the DequantizeLinear gives it)


@dataclass
class _Rewrite:
    graph: Graph
    constants: dict[str, Constant]
    producer: dict[str, Node]
    users: dict[str, list[Node]]

    def dequantized(self, value: str) -> _Quantized | None:
        """What ``value`` dequantizes, if a DequantizeLinear of 8-bit integers with constant
        scale and zero point defines it."""
        d = self.producer.get(value)
        if d is None or d.op != "DequantizeLinear" or len(d.inputs) != 3 or d.attr("block_size", 0):
            return None
        s, z = self.constants.get(d.inputs[1]), self.constants.get(d.inputs[2])
        if s is None or z is None or z.array.dtype.type not in EIGHT_BITS \
                or s.array.dtype != np.float32:
            return None
        return _Quantized(d.inputs[0], s, z, int(d.attr("axis", 1)))

    def per_channel(self, n: Node, w: _Quantized) -> bool:
        """Whether the weights' scale is one, or one per output channel of ``n``."""
        if w.scale.array.size == 1 and w.zero.array.size == 1:
            return True
        t = self.graph.type_of(w.value)
        if t is None:
            return False
        want = 0 if n.op == "Conv" or (n.op == "Gemm" and n.attr("transB", 0)) else t.rank - 1
        return w.axis % max(t.rank, 1) == want

    def quantizing(self, value: str) -> tuple[Node, Node | None] | None:
        """The QuantizeLinear (per tensor, to 8 bits) alone reading ``value``, or reading
        the ReLU (or Clip to constant bounds) alone reading it; and that activation."""
        q = sole_use(self.graph, self.users, value)
        act = None
        if q is not None and (q.op == "Relu" or self.constant_clip(q)):
            act, q = q, sole_use(self.graph, self.users, q.outputs[0])
        if q is None or q.op != "QuantizeLinear" or len(q.inputs) != 3 or q.inputs[0] != \
                (act.outputs[0] if act else value):
            return None
        s, z = self.constants.get(q.inputs[1]), self.constants.get(q.inputs[2])
        if s is None or z is None or s.array.size != 1 or z.array.dtype.type not in EIGHT_BITS \
                or s.array.dtype != np.float32:
            return None
        return q, act

    def constant_clip(self, n: Node) -> bool:
        """Whether ``n`` is a Clip whose bounds are constants (or absent)."""
        return n.op == "Clip" and all(not b or b in self.constants for b in n.inputs[1:3]) \
            and n.attr("min") is None and n.attr("max") is None

    def activation(self, act: Node, before: str, q: Node, out: str) -> Node:
        """A ReLU or Clip after a product, on the product's quantized output: ReLU is
        ``Max(y, zy)``, Clip bounds ``y`` by its bounds quantized (exact, as quantizing
        is monotone)."""
        if act.op == "Relu":
            return replace(act, op="Max", inputs=(before, q.inputs[2]), outputs=(out,), attrs=())
        s, z = self.constants[q.inputs[1]].array, self.constants[q.inputs[2]].array
        info = np.iinfo(z.dtype)
        bounds = []
        for k, b in enumerate(act.inputs[1:3]):
            if not b:
                bounds.append("")
                continue
            v = np.rint(self.constants[b].array.astype(np.float64) / np.float64(s.ravel()[0]))
            name = f"{act.name}.quantized_{('min', 'max')[k]}"
            self.constants[name] = Constant(name, np.clip(v + z.ravel()[0], info.min, info.max)
                                            .astype(z.dtype).reshape(()))
            bounds.append(name)
        return replace(act, inputs=(before, *bounds), outputs=(out,))

    def integer_bias(self, n: Node, x: _Quantized, w: _Quantized) -> str | None:
        """The int32 bias of a Conv or Gemm at scale ``sx * sw``: "" for none, None when it
        cannot be had."""
        if len(n.inputs) < 3 or not n.inputs[2]:
            return ""
        product = (x.scale.array.astype(np.float32) * w.scale.array.astype(np.float32)).ravel()
        b = self.dequantized_bias(n.inputs[2])
        if b is not None:
            scale = b.scale.array.astype(np.float32).ravel()
            same = scale.shape in (product.shape, (1,)) and np.allclose(scale, product, rtol=1e-6, atol=0)
            return b.value if same and not np.any(b.zero.array) else None
        c = self.constants.get(n.inputs[2])
        if c is None or c.array.dtype.kind != "f" or c.array.ndim > 1:
            return None
        info = np.iinfo(np.int32)
        q = np.clip(np.rint(c.array.astype(np.float64) / product.astype(np.float64)),
                    info.min, info.max).astype(np.int32)
        name = f"{n.name}.integer_bias"
        self.constants[name] = Constant(name, q)
        return name

    def dequantized_bias(self, value: str) -> _Quantized | None:
        d = self.producer.get(value)
        if d is None or d.op != "DequantizeLinear" or len(d.inputs) < 2:
            return None
        v, s = self.constants.get(d.inputs[0]), self.constants.get(d.inputs[1])
        z = self.constants.get(d.inputs[2]) if len(d.inputs) > 2 and d.inputs[2] else \
            Constant("", np.zeros((), np.int32))
        if v is None or s is None or z is None or v.array.dtype != np.int32:
            return None
        return _Quantized(v.name, s, z)

    def integer_node(self, n: Node) -> list[Node] | None:
        """The integer op (and the Max of a ReLU) replacing ``n`` and its quantization, or
        (no quantization after it) the integer product dequantized (:meth:`float_product`)."""
        x, w = (self.dequantized(i) for i in n.inputs[:2])
        if x is None or w is None or x.scale.array.size != 1 \
                or x.zero.array.size != 1 or not self.per_channel(n, w):
            return None
        if n.op == "Gemm" and (n.attr("transA", 0) or float(n.attr("alpha", 1.0)) != 1.0
                               or float(n.attr("beta", 1.0)) != 1.0):
            return None
        after = self.quantizing(n.outputs[0])
        if after is None:
            return self.float_product(n, x, w) if n.op != "Conv" else None
        q, act = after
        ys, yz = q.inputs[1], q.inputs[2]
        inputs = [x.value, x.scale.name, x.zero.name, w.value, w.scale.name, w.zero.name]
        if n.op == "MatMul":
            inputs += [ys, yz]
        else:
            bias = self.integer_bias(n, x, w)
            if bias is None:
                return None
            inputs += [bias, ys, yz] if n.op == "Gemm" else [ys, yz] + ([bias] if bias else [])
        attrs = tuple((k, v) for k, v in n.attrs if k in CONV_ATTRS) if n.op == "Conv" else \
            tuple((k, v) for k, v in n.attrs if k == "transB")
        out = q.outputs[0]
        if act is None:
            return [replace(n, op=INTEGER_OPS[n.op], inputs=tuple(inputs), outputs=(out,), attrs=attrs)]
        before = f"{n.outputs[0]}.quantized"
        return [replace(n, op=INTEGER_OPS[n.op], inputs=tuple(inputs), outputs=(before,), attrs=attrs),
                self.activation(act, before, q, out)]

    def float_product(self, n: Node, x: _Quantized, w: _Quantized) -> list[Node] | None:
        """``n`` (MatMul or Gemm, constant weights) as MatMulInteger, the int32 bias (if
        any) added and the sums dequantized at ``sx * sw``: the float result of integers."""
        weights = self.constants.get(w.value)
        bias = self.integer_bias(n, x, w) if n.op == "Gemm" else ""
        if weights is None or bias is None:
            return None
        transposed = n.op == "Gemm" and n.attr("transB", 0)
        b = w.value
        if transposed:
            b = f"{n.name}.integer_weights"
            self.constants[b] = Constant(b, np.ascontiguousarray(weights.array.T))
        scale = f"{n.name}.integer_scale"
        self.constants[scale] = Constant(scale, (x.scale.array.astype(np.float32).ravel()
                                                 * w.scale.array.astype(np.float32).ravel()))
        sums = f"{n.outputs[0]}.integer"
        nodes = [replace(n, op="MatMulInteger", inputs=(x.value, b, x.zero.name, w.zero.name),
                         outputs=(sums,), attrs=())]
        if bias:
            nodes.append(replace(n, name=f"{n.name}.bias", op="Add", inputs=(sums, bias),
                                 outputs=(f"{sums}.biased",), attrs=()))
            sums = f"{sums}.biased"
        return nodes + [replace(n, name=f"{n.name}.dequantize", op="DequantizeLinear",
                                inputs=(sums, scale), outputs=n.outputs, attrs=(("axis", -1),))]

    def integer_movement(self, n: Node) -> Node | None:
        """``n`` (a movement op) on the integers, when a quantization of the same scale and
        zero point as the dequantization before it alone reads it."""
        x = self.dequantized(n.inputs[0]) if n.inputs else None
        after = self.quantizing(n.outputs[0]) if len(n.outputs) == 1 else None
        if x is None or after is None or after[1] is not None:
            return None
        q = after[0]
        s, z = self.constants[q.inputs[1]].array, self.constants[q.inputs[2]].array
        if x.scale.array.size != 1 or s != x.scale.array.ravel()[0] or z.dtype != x.zero.array.dtype \
                or z != x.zero.array.ravel()[0]:
            return None
        return replace(n, inputs=(x.value, *n.inputs[1:]), outputs=q.outputs)


def fuse_integer_ops(g: Graph) -> Graph:
    """Quantized Conv, MatMul and Gemm (and movement between quantizations) on integers
    (see the module's text)."""
    if not any(n.op == "DequantizeLinear" for n in g.nodes):
        return g
    producer = {o: n for n in g.nodes for o in n.outputs if o}
    r = _Rewrite(g, {c.name: c for c in g.constants}, producer, consumers(g))
    replaced: dict[str, list[Node]] = {}   # node name -> what replaces it
    dropped: set[str] = set()              # the quantizations and ReLUs folded in
    for n in g.nodes:
        new = r.integer_node(n) if n.op in INTEGER_OPS else \
            r.integer_movement(n) if n.op in MOVEMENT else None
        if new is None:
            continue
        new = new if isinstance(new, list) else [new]
        replaced[n.name] = new
        dropped.update(m.name for m in r.quantizing(n.outputs[0]) or () if m is not None)
    if not replaced:
        return g
    nodes = [m for n in g.nodes if n.name not in dropped for m in replaced.get(n.name, [n])]
    # (the dequantizations no longer read go with the next eliminate_dead_nodes)
    return replace(g, nodes=tuple(nodes), constants=tuple(r.constants.values()))
