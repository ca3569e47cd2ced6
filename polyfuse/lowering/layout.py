"""Channels-last layout: a graph's convolutions, and what runs between them, on
``(N, H, W, C)`` storage, with conversions only where the graph needs ONNX's layout.

A convolution with constant weights vectorizes over output channels (see
``ops/conv.py``): on ONNX's ``(N, C, H, W)`` tensors it reads its input's channels a
plane apart and writes its result through a transposing pass. :func:`convert_layout`
(the graph pass; TVM's ConvertLayout, onnxruntime's NHWC transformer) gives each such
convolution a channels-last twin of its input and output instead, and carries the twins
through the ops that follow:

* elementwise ops whose tensor inputs all have twins (constants are permuted at compile
  time, broadcasting as before) run on the twins, as do quantizations and
  dequantizations with one scale and zero point;
* pools, batch and instance normalization and LRN on a twin run channels-last;
* Concat of twins joins them along the channel axis's new place, and a Slice of a twin
  (its axes constant) slices the same axes in their new places (a channel split: the
  halves ShuffleNet's blocks take);
* a channel shuffle (Reshape splitting the channels in groups, Transpose swapping the
  two, Reshape joining them: ShuffleNet's) runs on the twin as the same three on its
  last axis; the first Reshape carries the twin's shape it was matched for
  (:data:`INPUT_SHAPE`, checked when planned: a reshape of other dimensions of the same
  count is not a shuffle);
* a Resize of a twin (no region of interest, no axes attribute) resizes the twin, its
  scales or sizes put in the twin's order (an FPN's upsampled maps), but for a graph
  output (the smaller map goes back to ONNX's layout: a segmentation's last upsampling);
* a Reshape of a twin to the shape it has (sizes known; GroupNorm's Reshapes around an
  InstanceNormalization, as torch exports it) is the twin;
* the Shape of a twin is the twin's shape, put back in ONNX's order (a Gather), so a
  value whose shape is read needs no Transpose back for it;
* anything else reads ONNX's layout: the first such reader of a value gets a Transpose
  back, under the value's own name, as do graph outputs.

Grouped convolutions run channels-last too where each group has at least
:data:`GROUPED_VECTOR` output channels (:func:`grouped_channels_last`): a vector of a
group's outputs then takes one broadcast input element; narrower groups stay in ONNX's
layout.

A 3x3 convolution that :func:`~polyfuse.lowering.winograd.winograd_tile` gives a tile
becomes three nodes on the twins instead (Winograd's F(m x m, 3x3): input transform,
batched MatMul, output transform; :mod:`polyfuse.lowering.winograd`).

Nodes computing channels-last carry the attribute :data:`CHANNELS_LAST`. Their
lowerings still see ONNX's layout: the planner shows them input 0 channels-first and
:func:`to_channels_last` then permutes the kernel's input 0 and output 0 (their
declared shapes and every access), which computes the same values on permuted storage.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from polyfuse.ir.comprehension import Definition, Expr, Read, Statement, TensorDecl, map_expr
from polyfuse.ir.graph import Constant, Graph, Node, reshape_target
from polyfuse.lowering.fusion import ELEMENTWISE, QUANTIZERS
from polyfuse.lowering.winograd import winograd_nodes, winograd_tile

CHANNELS_LAST = "polyfuse.channels_last"   # node attribute: input 0 and output 0 are channels-last
INPUT_SHAPE = "polyfuse.input_shape"       # Reshape attribute: the only input shape it takes

# ops whose input 0 and output 0 are (N, C, ...) tensors and that run channels-last on a twin
_WINDOWED = frozenset({"MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool",
                       "GlobalLpPool", "BatchNormalization", "InstanceNormalization", "LRN"})
_POINTWISE = ELEMENTWISE - {"BatchNormalization"}
# convolutions: where their weights are (the integer ones' other inputs are scalars or
# vectors per output channel, read as they are)
_CONVS = {"Conv": 1, "ConvInteger": 1, "QLinearConv": 3, "BFloat16Conv": 1}


GROUPED_VECTOR = 8   # output channels per group from which a grouped Conv runs channels-last


def grouped_channels_last(groups: int, weights: tuple[int, ...]) -> bool:
    """Whether a Conv of ``groups`` groups (not depthwise) with weights of shape ``weights``
    vectorizes over each group's output channels channels-last: at least
    ``GROUPED_VECTOR`` of them (narrower groups would fill too little of a vector)."""
    return 1 < groups and weights[1] > 1 and weights[0] % groups == 0 and weights[0] // groups >= GROUPED_VECTOR


def channels_last(rank: int) -> tuple[int, ...]:
    """The permutation taking ``(N, C, D1, ..., Dk)`` to ``(N, D1, ..., Dk, C)``."""
    return (0, *range(2, rank), 1)


def channels_first(rank: int) -> tuple[int, ...]:
    """The inverse of :func:`channels_last`."""
    return (0, rank - 1, *range(1, rank - 1))


def convert_layout(g: Graph) -> Graph:
    """Run ``g``'s convolutions with constant weights channels-last (module docstring)."""
    return _Converter(g).run()


class _Converter:
    def __init__(self, g: Graph) -> None:
        self.g = g
        self.nodes: list[Node] = []
        self.constants: dict[str, Constant] = {c.name: c for c in g.constants}
        self.twin: dict[str, tuple[str, int]] = {}   # value -> (its channels-last twin, rank)
        self.pending: set[str] = set()               # values whose only copy is their twin
        self.names = {v.name for v in g.inputs} | set(self.constants) | \
            {o for n in g.nodes for o in n.outputs} | {n.name for n in g.nodes}
        self.readers: dict[str, list[Node]] = {}
        for n in g.nodes:
            for v in set(n.inputs):
                self.readers.setdefault(v, []).append(n)
        self.outputs = {v.name for v in g.outputs}
        self.producer = {o: n for n in g.nodes for o in n.outputs if o}
        self.done: set[int] = set()   # ids of nodes rewritten with an earlier one

    def run(self) -> Graph:
        for n in self.g.nodes:
            if id(n) in self.done:
                continue
            if not self._converted(n):
                for v in n.inputs:
                    self._need(v)
                self.nodes.append(n)
        for v in self.g.outputs:
            self._need(v.name)
        if not self.twin:
            return self.g
        return replace(self.g, nodes=tuple(self.nodes), constants=tuple(self.constants.values()))

    # --- names and conversions ------------------------------------------------------
    def _fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.names:
            name, k = f"{base}.{k}", k + 1
        self.names.add(name)
        return name

    def _need(self, v: str) -> None:
        """Make ONNX's layout of ``v`` available: a Transpose back from its twin."""
        if v not in self.pending:
            return
        self.pending.discard(v)
        twin, rank = self.twin[v]
        self.nodes.append(Node("Transpose", self._fresh(f"{v}:channels_first"), (twin,), (v,),
                               (("perm", channels_first(rank)),)))

    def _to_twin(self, v: str, rank: int) -> str:
        """The channels-last twin of ``v``, transposing it where it has none yet."""
        if v not in self.twin:
            out = self._fresh(f"{v}:channels_last")
            self.nodes.append(Node("Transpose", self._fresh(f"{v}:to_channels_last"), (v,), (out,),
                                   (("perm", channels_last(rank)),)))
            self.twin[v] = (out, rank)
        return self.twin[v][0]

    def _has_rank(self, v: str, rank: int) -> bool:
        if v in self.twin:
            return self.twin[v][1] == rank
        t = self.g.type_of(v)
        return t is not None and t.rank == rank

    def _define(self, n: Node, rank: int) -> tuple[str, ...]:
        """Twins for ``n``'s outputs, which exist only as twins until a reader needs them."""
        outs = []
        for o in n.outputs:
            if not o:
                outs.append(o)
                continue
            twin = self._fresh(f"{o}:channels_last")
            self.twin[o] = (twin, rank)
            self.pending.add(o)
            outs.append(twin)
        return tuple(outs)

    def _permuted_constant(self, name: str, rank: int) -> str | None:
        """A constant read beside twins of ``rank``, broadcast the same way channels-last
        (rank 0 stays); None when it has a higher rank."""
        array = self.constants[name].array
        if array.ndim == 0 or array.size == 1 and array.ndim <= 1:
            return name
        if array.ndim > rank:
            return None
        full = array.reshape((1,) * (rank - array.ndim) + array.shape)
        permuted = self._fresh(f"{name}:channels_last")
        self.constants[permuted] = Constant(permuted, np.ascontiguousarray(full.transpose(channels_last(rank))))
        return permuted

    # --- the rewrites ----------------------------------------------------------------
    def _converted(self, n: Node) -> bool:
        if n.op in _CONVS:
            return self._conv(n)
        if n.op in _WINDOWED:
            return self._windowed(n)
        if n.op in _POINTWISE or n.op in QUANTIZERS and self._one_scale(n):
            return self._pointwise(n)
        if n.op == "Concat":
            return self._concat(n)
        if n.op == "Slice":
            return self._slice(n)
        if n.op == "Reshape":
            return self._same_shape(n) or self._shuffle(n)
        if n.op == "Shape":
            return self._shape(n)
        if n.op == "Resize":
            return self._resize(n)
        return False

    def _conv(self, n: Node) -> bool:
        at = _CONVS[n.op]
        w = self.constants.get(n.inputs[at]) if len(n.inputs) > at else None
        if w is None or w.array.ndim < 3 or len(n.outputs) != 1 or n.attr(CHANNELS_LAST):
            return False
        rank, groups = w.array.ndim, n.attr("group", 1)
        depthwise = w.array.shape[1] == 1 and groups == w.array.shape[0]
        if not (groups == 1 or depthwise or n.op == "Conv" and grouped_channels_last(groups, w.array.shape)):
            return False   # narrow groups stay in ONNX's layout
        if not self._has_rank(n.inputs[0], rank):
            return False   # unknown, or wrong (the lowering names the node)
        source = self._to_twin(n.inputs[0], rank)
        x = self.g.type_of(n.inputs[0])
        bias = self.g.type_of(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else None
        tile = winograd_tile(n, w.array, x, bias)
        if tile and x is not None:   # (a tile implies a known input type)
            nodes, constants = winograd_nodes(n, tile, source, self._define(n, rank)[0], w.array, x,
                                              self._fresh)
            self.nodes += nodes
            self.constants |= {c.name: c for c in constants}
        else:
            self._channels_last(n, source, rank)
        return True

    def _one_scale(self, n: Node) -> bool:
        """Whether a (de)quantization's scale and zero point are constants of one value
        (one per channel would follow an axis, which the twin moves)."""
        return all(v in self.constants and self.constants[v].array.size == 1 for v in n.inputs[1:] if v)

    def _windowed(self, n: Node) -> bool:
        if not n.inputs or n.inputs[0] not in self.twin or not n.outputs[0] or any(n.outputs[1:]):
            return False   # one output: a MaxPool's Indices stay in ONNX's numbering
        self._channels_last(n, *self.twin[n.inputs[0]])
        return True

    def _channels_last(self, n: Node, twin: str, rank: int) -> None:
        """``n`` on the twin of its input 0, marked to lower channels-last."""
        self.nodes.append(replace(n, inputs=(twin, *n.inputs[1:]), outputs=self._define(n, rank),
                                  attrs=n.attrs + ((CHANNELS_LAST, 1),)))

    def _pointwise(self, n: Node) -> bool:
        ranks = {self.twin[v][1] for v in n.inputs if v in self.twin}
        if len(ranks) != 1 or len(n.outputs) != 1:
            return False
        rank = ranks.pop()
        inputs = []
        for v in n.inputs:
            if not v:
                inputs.append(v)
            elif v in self.twin:
                inputs.append(self.twin[v][0])
            elif v in self.constants and (c := self._permuted_constant(v, rank)) is not None:
                inputs.append(c)
            else:
                return False
        self.nodes.append(replace(n, inputs=tuple(inputs), outputs=self._define(n, rank)))
        return True

    def _concat(self, n: Node) -> bool:
        ranks = {self.twin[v][1] for v in n.inputs if v in self.twin}
        if len(ranks) != 1 or not all(v in self.twin for v in n.inputs) or len(n.outputs) != 1:
            return False
        rank = ranks.pop()
        try:
            axis = int(n.attr("axis"))
        except (TypeError, ValueError):
            return False   # the lowering reports it
        if not -rank <= axis < rank:
            return False
        moved = channels_last(rank).index(axis % rank)
        attrs = tuple((k, moved if k == "axis" else v) for k, v in n.attrs)
        self.nodes.append(replace(n, inputs=tuple(self.twin[v][0] for v in n.inputs),
                                  outputs=self._define(n, rank), attrs=attrs))
        return True

    def _same_shape(self, n: Node) -> bool:
        """A Reshape of a twin to the shape it has (known sizes; the target a constant, or
        the Shape of a value of the same known sizes: GroupNorm as torch exports it, a
        Reshape to ``[0, C, -1]`` around an InstanceNormalization and back) is the twin."""
        if len(n.inputs) != 2 or n.inputs[0] not in self.twin or len(n.outputs) != 1:
            return False
        t = self.g.type_of(n.inputs[0])
        if t is None or not t.is_static:
            return False
        shape = tuple(int(d) for d in t.shape)
        target = self.constants.get(n.inputs[1])
        source = self.producer.get(n.inputs[1])
        if target is not None:
            dims = target.array.tolist() if target.array.ndim == 1 else None
            if dims is None or len(dims) != len(shape) or n.attr("allowzero", 0) \
                    or tuple(reshape_target(shape, dims)) != shape:
                return False
        elif source is None or source.op != "Shape" or source.attrs or \
                (u := self.g.type_of(source.inputs[0])) is None or not u.is_static or \
                tuple(int(d) for d in u.shape) != shape:
            return False
        self.twin[n.outputs[0]] = self.twin[n.inputs[0]]
        self.pending.add(n.outputs[0])
        return True

    def _only_reader(self, v: str, op: str) -> Node | None:
        """The one node reading ``v`` (not a graph output), where it is an ``op``."""
        readers = self.readers.get(v, [])
        return readers[0] if len(readers) == 1 and readers[0].op == op and v not in self.outputs else None

    def _shuffle(self, n: Node) -> bool:
        """A channel shuffle of a twin (see the module docstring), on the twin."""
        if len(n.inputs) != 2 or n.inputs[0] not in self.twin or len(n.outputs) != 1:
            return False   # (allowzero does not matter: every size is given)
        twin, rank = self.twin[n.inputs[0]]
        split = self.constants.get(n.inputs[1])
        swap = self._only_reader(n.outputs[0], "Transpose")
        join = self._only_reader(swap.outputs[0], "Reshape") if swap is not None and len(swap.outputs) == 1 \
            else None
        joined = self.constants.get(join.inputs[1]) if join is not None and len(join.inputs) == 2 else None
        if split is None or joined is None or swap is None or join is None:
            return False
        first, last = split.array.tolist(), joined.array.tolist()
        if not (split.array.ndim == joined.array.ndim == 1 and len(first) == rank + 1 and len(last) == rank
                and all(isinstance(d, int) and d > 0 for d in first)
                and tuple(swap.attr("perm") or ()) == (0, 2, 1, *range(3, rank + 1))
                and last[:1] + last[2:] == first[:1] + first[3:] and last[1] in (-1, first[1] * first[2])):
            return False
        batch, groups, width, spatial = first[0], first[1], first[2], first[3:]
        known = self.g.type_of(n.inputs[0])
        if known is not None and known.is_static and tuple(known.shape) != (batch, groups * width, *spatial):
            return False   # (a reshape of other dimensions: ONNX's layout)
        grouped, swapped = self._fresh(f"{n.outputs[0]}:channels_last"), self._fresh(f"{swap.outputs[0]}:channels_last")
        shape_in, shape_out = self._fresh(f"{n.inputs[1]}:channels_last"), self._fresh(f"{join.inputs[1]}:channels_last")
        self.constants[shape_in] = Constant(shape_in, np.array([batch, *spatial, groups, width], np.int64))
        self.constants[shape_out] = Constant(shape_out, np.array([batch, *spatial, groups * width], np.int64))
        self.nodes += [
            Node("Reshape", n.name, (twin, shape_in), (grouped,),
                 (("allowzero", 0), (INPUT_SHAPE, (batch, *spatial, groups * width)))),
            Node("Transpose", swap.name, (grouped,), (swapped,), (("perm", (*range(rank - 1), rank, rank - 1)),)),
            Node("Reshape", join.name, (swapped, shape_out), self._define(join, rank), (("allowzero", 0),))]
        self.done |= {id(swap), id(join)}
        return True

    def _slice(self, n: Node) -> bool:
        """A Slice of a twin along constant axes, on the twin."""
        if not n.inputs or n.inputs[0] not in self.twin or len(n.inputs) < 4 or len(n.outputs) != 1:
            return False
        axes = self.constants.get(n.inputs[3])
        twin, rank = self.twin[n.inputs[0]]
        if axes is None or axes.array.ndim != 1 or axes.array.dtype.kind not in "iu" \
                or not all(-rank <= a < rank for a in axes.array.tolist()):
            return False   # (axes computed, or wrong: the lowering reports them)
        moved = self._fresh(f"{n.inputs[3]}:channels_last")
        perm = channels_last(rank)
        self.constants[moved] = Constant(moved, np.array([perm.index(a % rank) for a in axes.array.tolist()],
                                                         axes.array.dtype))
        self.nodes.append(replace(n, inputs=(twin, *n.inputs[1:3], moved, *n.inputs[4:]),
                                  outputs=self._define(n, rank)))
        return True

    def _resize(self, n: Node) -> bool:
        """A Resize of a twin by its scales or sizes, in the twin's order."""
        if not n.inputs or n.inputs[0] not in self.twin or len(n.outputs) != 1 or n.attr("axes") is not None \
                or n.attr("coordinate_transformation_mode") == "tf_crop_and_resize" or len(n.inputs) < 3:
            return False
        if n.outputs[0] in self.outputs:
            return False   # (a graph output: the map is put back in ONNX's order before it grows)
        twin, rank = self.twin[n.inputs[0]]
        perm = channels_last(rank)
        inputs = [twin, ""]
        if n.inputs[1] and not (n.inputs[1] in self.constants and self.constants[n.inputs[1]].array.size == 0):
            return False   # a region of interest (read in ONNX's order)
        for at, v in enumerate(n.inputs[2:4], start=2):
            if not v or v in self.constants and self.constants[v].array.size == 0:
                inputs.append(v)
            elif v in self.constants:
                array = self.constants[v].array
                if array.shape != (rank,):
                    return False   # (the lowering reports it)
                moved = self._fresh(f"{v}:channels_last")
                self.constants[moved] = Constant(moved, np.ascontiguousarray(array[list(perm)]))
                inputs.append(moved)
            else:   # sizes computed: put in the twin's order when planned
                order = self._fresh(f"{v}:order")
                moved = self._fresh(f"{v}:channels_last")
                self.constants[order] = Constant(order, np.array(perm, np.int64))
                self.nodes.append(Node("Gather", self._fresh(f"{n.name}:{'scales' if at == 2 else 'sizes'}"),
                                       (v, order), (moved,), (("axis", 0),)))
                inputs.append(moved)
        self.nodes.append(replace(n, inputs=tuple(inputs), outputs=self._define(n, rank)))
        return True

    def _shape(self, n: Node) -> bool:
        """The shape of a twin, in ONNX's order."""
        if not n.inputs or n.inputs[0] not in self.twin or n.attrs or len(n.outputs) != 1:
            return False   # (a Shape's start and end count in ONNX's order: left as they are)
        twin, rank = self.twin[n.inputs[0]]
        shape = self._fresh(f"{n.outputs[0]}:channels_last")
        order = self._fresh(f"{n.outputs[0]}:order")
        self.constants[order] = Constant(order, np.array(channels_first(rank), np.int64))
        self.nodes += [replace(n, inputs=(twin,), outputs=(shape,)),
                       Node("Gather", self._fresh(f"{n.name}:channels_first"), (shape, order), n.outputs,
                            (("axis", 0),))]
        return True


# --- kernels on channels-last storage -----------------------------------------------------

def to_channels_last(d: Definition, tensors: set[str]) -> Definition:
    """``d`` with ``tensors`` (parameters or outputs, each of rank >= 3) stored
    channels-last: their declared shapes, every read and every statement writing them
    permuted, so the same values land in the permuted storage."""
    decls = {t.name: t for t in d.inputs + d.outputs if t.name in tensors}

    def permute(t: TensorDecl) -> TensorDecl:
        perm = channels_last(t.rank)
        return replace(t, shape=tuple(t.shape[p] for p in perm)) if t.name in decls else t

    def read(e: Expr) -> Expr:
        if not isinstance(e, Read) or e.tensor not in decls:
            return e
        perm = channels_last(len(e.indices))
        where = [perm.index(k) for k in e.checked]
        return replace(e, indices=tuple(e.indices[p] for p in perm), checked=tuple(sorted(where)))

    def statement(s: Statement) -> Statement:
        s = replace(s, rhs=map_expr(s.rhs, read))
        if s.tensor in decls:
            s = replace(s, indices=tuple(s.indices[p] for p in channels_last(len(s.indices))))
        return s

    return replace(d, params=tuple(permute(p) if isinstance(p, TensorDecl) else p for p in d.params),
                   outputs=tuple(permute(t) for t in d.outputs),
                   statements=tuple(statement(s) for s in d.statements))
