"""Graph IR passes and the pass manager that runs them.

Each pass is a pure function Graph -> Graph named with a verb. The manager verifies
the graph after every pass (when asked), keeps the text of the graph after each pass
for ``--dump``-style inspection, and times the passes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import ClassVar
from dataclasses import dataclass, replace

import numpy as np

from polyfuse.ir.graph import Constant, Graph, Node, TensorType, Value, consumers, sole_use, verify_graph
from polyfuse.ir.types import DType
from polyfuse.ir.passes import PassManager as IRPassManager
from polyfuse.lowering.bfloat16 import use_bfloat16_products
from polyfuse.lowering.fusion import partition_fusion_groups
from polyfuse.lowering.integer_ops import fuse_integer_ops
from polyfuse.lowering.layout import convert_layout

GraphPass = Callable[[Graph], Graph]


def eliminate_dead_nodes(g: Graph) -> Graph:
    """Drop nodes and constants nothing reaches the outputs through."""
    live = {v.name for v in g.outputs}
    kept: list[Node] = []
    for n in reversed(g.nodes):
        if any(o in live for o in n.outputs if o):
            kept.append(n)
            live.update(i for i in n.inputs if i)
    constants = tuple(c for c in g.constants if c.name in live)
    types = tuple(v for v in g.types if v.name in live)
    return replace(g, nodes=tuple(reversed(kept)), constants=constants, types=types)


def _attr_key(value: object) -> object:
    if isinstance(value, Graph):   # subgraphs: the same object only
        return ("graph", id(value))
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, tuple):
        return tuple(_attr_key(v) for v in value)
    return value


def eliminate_common_subexpressions(g: Graph) -> Graph:
    """Merge nodes with the same op, inputs and attributes (ops here have no side effects)."""
    seen: dict[tuple, Node] = {}
    rename: dict[str, str] = {}
    nodes: list[Node] = []
    outputs = {v.name for v in g.outputs}
    for n in g.nodes:
        n = replace(n, inputs=tuple(rename.get(i, i) for i in n.inputs))
        key = (n.op, n.inputs, tuple((k, _attr_key(v)) for k, v in n.attrs), len(n.outputs))
        twin = seen.get(key)
        if twin is not None and not any(o in outputs for o in n.outputs):
            rename.update({o: t for o, t in zip(n.outputs, twin.outputs) if o})
            continue
        seen.setdefault(key, n)
        nodes.append(n)
    return replace(g, nodes=tuple(nodes))


# --- rewrites ------------------------------------------------------------------------------

def _batch_norm_scale(g: Graph, bn: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """``(s, t)`` with ``BN(y) = y * s + t`` per channel, for an inference BatchNormalization
    whose parameters are constants; None otherwise."""
    if bn.attr("training_mode", 0) or any(bn.outputs[1:]) or len(bn.inputs) != 5:
        return None
    params = [g.constant(i) for i in bn.inputs[1:]]
    if any(p is None or p.array.ndim != 1 or p.array.shape != params[0].array.shape  # type: ignore[union-attr]
           for p in params):
        return None
    scale, bias, mean, var = (p.array.astype(np.float64) for p in params)  # type: ignore[union-attr]
    s = scale / np.sqrt(var + float(bn.attr("epsilon", 1e-5)))
    return s, bias - mean * s


def fold_batch_norms(g: Graph) -> Graph:
    """Fold an inference BatchNormalization into the Conv (or Gemm) before it when the
    weights and the normalization's parameters are constants: ``W' = W * s`` per output
    channel and ``b' = b * s + t``, and the normalization goes."""
    users = consumers(g)
    constants = {c.name: c for c in g.constants}
    drop: set[str] = set()
    rewritten: dict[str, Node] = {}
    for n in g.nodes:
        if n.op not in ("Conv", "Gemm") or len(n.inputs) < 2 or n.inputs[1] not in constants:
            continue
        bn = sole_use(g, users, n.outputs[0])
        if bn is None or bn.op != "BatchNormalization" or bn.inputs[0] != n.outputs[0]:
            continue
        folded = _batch_norm_scale(g, bn)
        w = constants[n.inputs[1]].array
        if folded is None or w.dtype.kind != "f":
            continue
        s, t = folded
        bias_name = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else ""
        if n.op == "Conv":
            if w.ndim < 1 or len(s) != w.shape[0]:
                continue
            new_w = w * s.reshape(-1, *[1] * (w.ndim - 1))
        else:
            if n.attr("transA", 0) or w.ndim != 2 or float(n.attr("alpha", 1.0)) != 1.0 \
                    or len(s) != w.shape[0 if n.attr("transB", 0) else 1]:
                continue
            new_w = w * (s[:, None] if n.attr("transB", 0) else s[None, :])
            if bias_name and float(n.attr("beta", 1.0)) != 1.0:
                continue
        if bias_name and (bias_name not in constants or constants[bias_name].array.ndim > 1):
            continue
        old_b = constants[bias_name].array if bias_name else np.zeros(len(s), w.dtype)
        if old_b.size not in (1, len(s)):
            continue
        new_b = old_b.astype(np.float64) * s + t
        w_name, b_name = f"{n.name}.folded_w", f"{n.name}.folded_b"
        constants[w_name] = Constant(w_name, new_w.astype(w.dtype))
        constants[b_name] = Constant(b_name, new_b.astype(w.dtype))
        rewritten[n.name] = replace(n, inputs=(n.inputs[0], w_name, b_name), outputs=bn.outputs[:1])
        drop.add(bn.name)
    if not rewritten:
        return g
    nodes = tuple(rewritten.get(n.name, n) for n in g.nodes if n.name not in drop)
    return eliminate_dead_nodes(replace(g, nodes=nodes, constants=tuple(constants.values())))


def scale_batch_norms(g: Graph) -> Graph:
    """An inference BatchNormalization that no Conv or Gemm took in
    (:func:`fold_batch_norms`: one after a concatenation, a pooling, an activation)
    becomes ``Mul`` and ``Add`` by per-channel constants, ``y = x * s + t``, the scale
    and shift computed once here (in float64) instead of a square root and a division
    per element in the kernel; the ``Mul`` and ``Add`` then fuse with their neighbours
    like any elementwise op. Float32 and float64 inputs of known rank >= 2."""
    constants = {c.name: c for c in g.constants}
    types = list(g.types)
    nodes: list[Node] = []
    for n in g.nodes:
        x = g.type_of(n.inputs[0]) if n.op == "BatchNormalization" and n.inputs else None
        folded = _batch_norm_scale(g, n) if x is not None and x.rank >= 2 \
            and x.dtype.numpy in (np.float32, np.float64) else None
        if folded is None or (isinstance(x.shape[1], int) and x.shape[1] != len(folded[0])):
            nodes.append(n)
            continue
        broadcast = (-1,) + (1,) * (x.rank - 2)   # (C, 1, ...): channels on axis 1
        scale, shift, scaled = f"{n.name}.scale", f"{n.name}.shift", f"{n.name}.scaled"
        constants[scale] = Constant(scale, folded[0].astype(x.dtype.numpy).reshape(broadcast))
        constants[shift] = Constant(shift, folded[1].astype(x.dtype.numpy).reshape(broadcast))
        types.append(Value(scaled, x))
        nodes += [Node("Mul", f"{n.name}.mul", (n.inputs[0], scale), (scaled,)),
                  Node("Add", f"{n.name}.add", (scaled, shift), n.outputs[:1])]
    if len(nodes) == len(g.nodes):
        return g
    return eliminate_dead_nodes(replace(g, nodes=tuple(nodes), constants=tuple(constants.values()),
                                        types=tuple(types)))


LIVE_SHARE = 0.5   # split a convolution whose live taps are under this share of all it computes


def split_sparse_windows(g: Graph) -> Graph:
    """A convolution dilated past its input's edges on part of the map computes, per
    output region, only the taps that read inside: the output is cut at every position
    where a tap starts or stops reading inside the input (per axis), each region a
    convolution of its live taps on the slice of the input they read (no padding), and
    the regions are concatenated back. DeepLab's ASPP at rate 12 on a 14 x 14 map read
    padding with 8 of its 9 taps at most positions (2.4 ms of a 6.8 ms model): live,
    they are about 1.65 taps per position. Applies to ungrouped convolutions with
    constant weights, unit strides and known input sizes, where the live taps are under
    :data:`LIVE_SHARE` of the taps computed (``live_taps`` in ops/conv.py already cuts
    taps that read padding everywhere)."""
    constants = {c.name: c for c in g.constants}
    types = list(g.types)
    nodes: list[Node] = []
    changed = False
    for n in g.nodes:
        regions = _sparse_regions(g, n)
        if regions is None:
            nodes.append(n)
            continue
        changed = True
        x, t = n.inputs[0], g.type_of(n.inputs[0])
        assert t is not None
        w = constants[n.inputs[1]].array
        spatial = len(regions[0])
        pieces: dict[tuple[int, ...], str] = {}
        for index, region in enumerate(itertools.product(*[range(len(bands)) for bands in regions[1]])):
            bands = [regions[1][a][b] for a, b in enumerate(region)]   # (out_lo, out_hi, k_lo, k_hi) per axis
            starts = [lo + d * klo - p for (lo, _, klo, _), (d, p) in zip(bands, regions[0])]
            ends = [hi - 1 + d * khi - p + 1 for (_, hi, _, khi), (d, p) in zip(bands, regions[0])]
            tag = f"{n.name}.region{index}"
            cut = f"{tag}.input"
            names = [f"{tag}.{what}" for what in ("starts", "ends", "axes", "weights")]
            constants[names[0]] = Constant(names[0], np.array(starts, np.int64))
            constants[names[1]] = Constant(names[1], np.array(ends, np.int64))
            constants[names[2]] = Constant(names[2], np.arange(2, 2 + spatial, dtype=np.int64))
            live = (slice(None), slice(None), *(slice(klo, khi + 1) for _, _, klo, khi in bands))
            constants[names[3]] = Constant(names[3], np.ascontiguousarray(w[live]))
            shape = (*t.shape[:2], *(e - b for b, e in zip(starts, ends)))
            out_shape = (t.shape[0], w.shape[0], *(hi - lo for lo, hi, _, _ in bands))
            types += [Value(cut, TensorType(t.dtype, shape)), Value(f"{tag}.out", TensorType(t.dtype, out_shape))]
            attrs = (("dilations", tuple(d for d, _ in regions[0])), ("group", 1),
                     ("kernel_shape", tuple(khi - klo + 1 for _, _, klo, khi in bands)),
                     ("pads", (0,) * (2 * spatial)), ("strides", (1,) * spatial))
            nodes += [Node("Slice", f"{tag}.slice", (x, *names[:3]), (cut,)),
                      Node("Conv", tag, (cut, names[3], *n.inputs[2:3]), (f"{tag}.out",), attrs)]
            pieces[region] = f"{tag}.out"
        nodes += _joined(n, pieces, [len(bands) for bands in regions[1]], types, t.dtype)
    if not changed:
        return g
    return replace(g, nodes=tuple(nodes), constants=tuple(constants.values()), types=tuple(types))


def _sparse_regions(g: Graph, n: Node) -> tuple[list[tuple[int, int]], list[list[tuple[int, int, int, int]]]] | None:
    """For a Conv :func:`split_sparse_windows` splits: per spatial axis its (dilation,
    begin pad), and its bands (output start, end, first and last live tap); else None."""
    w = g.constant(n.inputs[1]) if n.op == "Conv" and len(n.inputs) >= 2 else None
    t = g.type_of(n.inputs[0]) if n.inputs else None
    if w is None or t is None or not t.is_static or w.array.ndim != t.rank or t.rank < 3 or len(n.outputs) != 1 \
            or n.attr("group", 1) != 1 or str(n.attr("auto_pad", "NOTSET")) != "NOTSET":
        return None
    spatial = t.rank - 2
    kernel = w.array.shape[2:]
    dilations = tuple(n.attr("dilations") or (1,) * spatial)
    pads = tuple(n.attr("pads") or (0,) * (2 * spatial))
    strides = tuple(n.attr("strides") or (1,) * spatial)
    if len(dilations) != spatial or len(pads) != 2 * spatial or any(s != 1 for s in strides) \
            or w.array.shape[1] != t.shape[1]:
        return None
    axes, bands_per_axis = [], []
    live_taps, taps = 1, 1
    for a in range(spatial):
        size, k, d, p, q = int(t.shape[2 + a]), kernel[a], int(dilations[a]), int(pads[a]), int(pads[spatial + a])
        out = size + p + q - d * (k - 1)
        if out <= 0:
            return None
        ranges = [(max(0, p - d * j), min(out, size + p - d * j)) for j in range(k)]   # outputs where tap j reads inside
        cuts = sorted({0, out, *(c for lo, hi in ranges if lo < hi for c in (lo, hi))})
        bands = []
        for lo, hi in zip(cuts, cuts[1:]):
            live = [j for j, (a0, a1) in enumerate(ranges) if a0 <= lo and hi <= a1]
            if not live:
                return None   # (outputs reading only padding: left to the lowering)
            bands.append((lo, hi, live[0], live[-1]))
        axes.append((d, p))
        bands_per_axis.append(bands)
        live_taps *= sum((hi - lo) * (khi - klo + 1) for lo, hi, klo, khi in bands)
        taps *= out * k
    if live_taps >= LIVE_SHARE * taps or all(len(b) == 1 for b in bands_per_axis):
        return None
    return axes, bands_per_axis


def _joined(n: Node, pieces: dict[tuple[int, ...], str], counts: list[int], types: list[Value],
            dtype: DType) -> list[Node]:
    """Concats putting the regions' outputs back together as ``n``'s output (the last
    axis's bands first)."""
    nodes: list[Node] = []
    types_of = {v.name: v.type for v in types}

    def join(prefix: tuple[int, ...]) -> str:
        axis = len(prefix)
        if axis == len(counts):
            return pieces[prefix]
        parts = [join((*prefix, b)) for b in range(counts[axis])]
        out = n.outputs[0] if not prefix else f"{n.name}.join{''.join(map(str, prefix))}"
        shapes = [types_of[v].shape for v in parts]
        joined = (*shapes[0][:2 + axis], sum(s[2 + axis] for s in shapes), *shapes[0][3 + axis:])
        if prefix:
            types.append(Value(out, TensorType(dtype, joined)))
            types_of[out] = TensorType(dtype, joined)
        nodes.append(Node("Concat", f"{n.name}.concat{''.join(map(str, prefix))}", tuple(parts), (out,),
                          (("axis", 2 + axis),)))
        return out
    join(())
    return nodes


def extend_concatenations(g: Graph) -> Graph:
    """A Concat whose first inputs are, in order and along the same axis, all the inputs
    of an earlier Concat reads that one's result instead: ``Concat(a, b, c, d)`` after
    ``x = Concat(a, b, c)`` becomes ``Concat(x, d)``. A DenseNet concatenates every
    earlier layer's features again at each layer (2 to 25 inputs, a kernel of its own
    per count); each now appends one piece to the last concatenation: the same bytes
    copied, in kernels of one text but for sizes."""
    made: dict[tuple[object, tuple[str, ...]], str] = {}   # (axis, inputs) -> the output
    nodes: list[Node] = []
    changed = False
    for n in g.nodes:
        if n.op == "Concat" and len(n.outputs) == 1 and all(n.inputs):
            axis = n.attr("axis")
            prefix = next((k for k in range(len(n.inputs) - 1, 1, -1) if (axis, n.inputs[:k]) in made), None)
            made.setdefault((axis, n.inputs), n.outputs[0])
            if prefix is not None:
                n = replace(n, inputs=(made[(axis, n.inputs[:prefix])], *n.inputs[prefix:]))
                changed = True
        nodes.append(n)
    return replace(g, nodes=tuple(nodes)) if changed else g


def _permutation(perm: object) -> bool:
    """Whether a perm attribute is a permutation of 0..n-1 (what the rewrites assume; the
    op's lowering reports any other)."""
    try:
        return sorted(int(p) for p in perm) == list(range(len(perm)))  # type: ignore[union-attr, arg-type]
    except (TypeError, ValueError):
        return False


def simplify_movement(g: Graph) -> Graph:
    """Transposes and reshapes: ``Transpose(Transpose(x))`` becomes one transpose (none if
    the permutations cancel), ``Reshape(Reshape(x))`` one reshape to the last shape (when
    that shape copies no dimension with 0), and Identity goes."""
    outputs = {v.name for v in g.outputs}
    rename: dict[str, str] = {}
    producer: dict[str, Node] = {}   # value -> the (rewritten) node defining it
    nodes: list[Node] = []
    for n in g.nodes:
        n = replace(n, inputs=tuple(rename.get(i, i) for i in n.inputs))
        src = producer.get(n.inputs[0]) if n.inputs and n.inputs[0] else None
        if n.op == "Identity" and n.inputs and n.outputs and n.outputs[0] not in outputs:
            rename[n.outputs[0]] = n.inputs[0]
            continue
        if n.op == "Transpose" and _permutation(n.attr("perm")):
            perm = tuple(int(p) for p in n.attr("perm"))
            if src is not None and src.op == "Transpose" and _permutation(src.attr("perm")) \
                    and len(src.attr("perm")) == len(perm):
                inner = tuple(int(p) for p in src.attr("perm"))
                perm = tuple(inner[p] for p in perm)
                n = replace(n, inputs=src.inputs, attrs=tuple((k, perm if k == "perm" else v)
                                                              for k, v in n.attrs))
            if perm == tuple(range(len(perm))) and n.outputs[0] not in outputs:
                rename[n.outputs[0]] = n.inputs[0]
                continue
        if n.op == "Reshape" and src is not None and src.op == "Reshape" and len(n.inputs) > 1:
            shape = g.constant(n.inputs[1])
            if shape is not None and not (shape.array == 0).any():
                n = replace(n, inputs=(src.inputs[0], n.inputs[1]))
        nodes.append(n)
        producer.update({o: n for o in n.outputs if o})
    return eliminate_dead_nodes(replace(g, nodes=tuple(nodes)))


DEFAULT_PASSES: tuple[GraphPass, ...] = (
    eliminate_dead_nodes, eliminate_common_subexpressions, extend_concatenations, fuse_integer_ops,
    eliminate_dead_nodes,
    fold_batch_norms, scale_batch_norms, split_sparse_windows, convert_layout, simplify_movement,
    eliminate_dead_nodes, partition_fusion_groups)


def graph_passes(precision: str = "float32") -> tuple[GraphPass, ...]:
    """The passes ``compile`` runs at ``precision``: for ``"bf16"`` the default ones with
    :func:`use_bfloat16_products` after batch normalizations fold into weights (which it
    then rounds) and before the layout pass (which runs its convolutions channels-last)."""
    if precision != "bf16":
        return DEFAULT_PASSES
    at = DEFAULT_PASSES.index(convert_layout)
    return DEFAULT_PASSES[:at] + (use_bfloat16_products,) + DEFAULT_PASSES[at:]


@dataclass
class PassManager(IRPassManager[Graph]):
    """Runs graph passes in order (:mod:`polyfuse.ir.passes` for what it keeps and
    times); ``verify`` checks each graph with ``verify_graph``."""

    passes: Sequence[GraphPass] = DEFAULT_PASSES

    level: ClassVar[str] = "graph"
    unit: ClassVar[str] = "graph"

    def check(self, g: Graph) -> None:
        verify_graph(g)

    @property
    def graphs(self) -> list[tuple[str, Graph]]:
        """``(pass name, graph after it)``, the input first (with ``keep``)."""
        return self.kept
