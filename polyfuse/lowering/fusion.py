"""Fusion partitioning: which graph nodes run as one kernel.

A *group* starts at a contraction (Conv, ConvTranspose, Gemm, MatMul, a Winograd
convolution's output transform) or at an elementwise op, and grows, in graph order, by
elementwise ops reading its values (bias, BatchNormalization, activations, residual adds:
a contraction's epilogue).
A group with no contraction may also take one normalization or reduction that reads
it (an elementwise prologue of Softmax or LayerNormalization), after which it closes.
An elementwise op reading two groups without a contraction joins them into one (the
two arms of a diamond: GELU's ``0.5 * x`` and ``1 + tanh(...)``).
The members of a group are then lowered to one TC definition, their statements
composed and elementwise producers inlined into their readers (see
:mod:`polyfuse.lowering.compose`), so an epilogue costs no pass over memory of its own.

Each node's ``group`` field names its group; the printed graph shows the decisions
(``# conv3 @g2``), and :func:`describe_groups` lists them.

A DequantizeLinear read by one elementwise node joins that node's group, not its
producer's: the integers cross memory instead of the floats (a quarter of the bytes for
8-bit values), and the reader widens them as it loads them. Where the reader is its
producer's epilogue (a product's own dequantization), that is the same group.

A group runs where its last member stands. A node may join a group only if nothing
between the group's current end and the node reads a value of the group (that reader
would run before the group): the order stays topological.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from polyfuse.ir.graph import Graph, Node, consumers, sole_use

# (the integer products fuse_integer_ops makes, and the bfloat16 products
# use_bfloat16_products makes, are contractions too)
CONTRACTIONS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "QLinearConv", "QLinearMatMul",
                          "QLinearGemm", "MatMulInteger", "ConvInteger", "BFloat16Conv", "BFloat16MatMul",
                          "BFloat16Gemm", "WinogradOutput"})
ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Log",
    "Erf", "Tanh", "Sigmoid", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu",
    "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Gelu", "Mish", "Clip", "Max",
    "Min", "Sum", "Mean", "Where", "Floor", "Ceil", "Round", "Sign", "Sin", "Cos",
    "BatchNormalization",
})
# elementwise here; channels-last only with one scale (a per-axis scale names an axis)
QUANTIZERS = frozenset({"QuantizeLinear", "DequantizeLinear"})
CLOSING = frozenset({"Softmax", "LogSoftmax", "LayerNormalization", "ReduceMean",
                     "ReduceSum", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL2"})
MAX_MEMBERS = 12


@dataclass
class _Group:
    members: list[int] = field(default_factory=list)   # node positions
    values: set[str] = field(default_factory=set)      # values its members define
    anchored: bool = False                             # holds a contraction
    closed: bool = False

    @property
    def end(self) -> int:
        return self.members[-1]


def partition_fusion_groups(g: Graph) -> Graph:
    """Mark fusion groups on the nodes (``Node.group``) and order each group's members
    together at the position of its last one."""
    group_of: dict[str, _Group] = {}   # value -> group defining it
    groups: list[_Group] = []
    nodes = g.nodes
    claims: dict[int, list[int]] = {}   # reader -> the dequantizations that join its group
    for dequantization, reader in _deferred(g).items():
        claims.setdefault(reader, []).append(dequantization)
    deferred = {d for ds in claims.values() for d in ds}
    for pos, n in enumerate(nodes):
        if pos in deferred:
            continue
        pending = claims.get(pos, [])
        target = _joinable(nodes, pos, group_of, pending) \
            if n.op in ELEMENTWISE | QUANTIZERS | CLOSING else None
        if target is None and n.op in CONTRACTIONS | ELEMENTWISE | QUANTIZERS:
            target = _Group(anchored=n.op in CONTRACTIONS)
            groups.append(target)
        if target is None:
            continue
        for other in _also_joinable(nodes, pos, group_of, target, pending):
            groups.remove(other)
            target.members = sorted(target.members + other.members)
            target.values |= other.values
            for v in other.values:
                group_of[v] = target
        for p in [*pending, pos]:
            target.members.append(p)
            target.values.update(o for o in nodes[p].outputs if o)
            for o in nodes[p].outputs:
                if o:
                    group_of[o] = target
        target.closed = n.op in CLOSING
    fused = [grp for grp in groups if len(grp.members) > 1]
    label = {pos: f"g{k}" for k, grp in enumerate(fused) for pos in grp.members}
    end_of = {pos: grp for grp in fused for pos in grp.members}
    order: list[Node] = []
    for pos, n in enumerate(nodes):
        grp = end_of.get(pos)
        if grp is None:
            order.append(replace(n, group=""))
        elif pos == grp.end:
            order += [replace(nodes[p], group=label[p]) for p in grp.members]
    return replace(g, nodes=tuple(order))


def _deferred(g: Graph) -> dict[int, int]:
    """The DequantizeLinear nodes that join their reader's group (module docstring), by
    position, each with its reader's: the one node reading its output, an elementwise op
    or a QuantizeLinear (which always lands in a group)."""
    users = consumers(g)
    where = {id(n): pos for pos, n in enumerate(g.nodes)}
    out: dict[int, int] = {}
    for pos, n in enumerate(g.nodes):
        reader = sole_use(g, users, n.outputs[0]) if n.op == "DequantizeLinear" else None
        if reader is not None and reader.op in ELEMENTWISE | {"QuantizeLinear"}:
            out[pos] = where[id(reader)]
    return out


def _joinable(nodes: tuple[Node, ...], pos: int, group_of: dict[str, _Group],
              pending: list[int]) -> _Group | None:
    """The group node ``pos`` joins, if any: one defining an input, with nothing between
    its end and the node reading its values. An input a ``pending`` dequantization (one
    joining the node's group) defines counts as that dequantization's input."""
    n = nodes[pos]
    closing = n.op in CLOSING
    through = {nodes[p].outputs[0]: nodes[p].inputs[0] for p in pending}
    for value in n.inputs:
        grp = group_of.get(through.get(value, value))
        if grp is None or grp.closed or len(grp.members) >= MAX_MEMBERS:
            continue
        if closing and (grp.anchored or len(n.outputs) > 1):
            continue
        if _read_before(nodes, grp, pos, pending):
            continue
        return grp
    return None


def _read_before(nodes: tuple[Node, ...], grp: _Group, pos: int, pending: list[int]) -> bool:
    """Whether a node between ``grp``'s end and node ``pos`` (``pending`` dequantizations
    aside) reads a value of ``grp``: the group, run at ``pos``, would come after it."""
    between = [m for p, m in enumerate(nodes[grp.end + 1:pos], grp.end + 1) if p not in pending]
    return any(i in grp.values for m in between for i in m.inputs)


def _also_joinable(nodes: tuple[Node, ...], pos: int, group_of: dict[str, _Group], target: _Group,
                   pending: list[int]) -> list[_Group]:
    """The other groups of elementwise ops (no contraction) defining inputs of node
    ``pos``, an elementwise op joining ``target`` (one too), that merge into it: a
    diamond's two arms (GELU's ``0.5 * x`` and ``1 + tanh(...)``, computed apart from
    ``x``, meet in one product), each with nothing between its end and the node
    reading its values."""
    n = nodes[pos]
    if target.anchored or n.op not in ELEMENTWISE:
        return []
    out: list[_Group] = []
    size = len(target.members) + 1
    for value in n.inputs:
        grp = group_of.get(value)
        if grp is None or grp is target or grp in out or grp.anchored or grp.closed or \
                size + len(grp.members) > MAX_MEMBERS:
            continue
        if _read_before(nodes, grp, pos, pending):
            continue
        out.append(grp)
        size += len(grp.members)
    return out


def describe_groups(g: Graph) -> str:
    """One line per fusion group: its name, then its members' names and ops."""
    groups: dict[str, list[Node]] = {}
    for n in g.nodes:
        if n.group:
            groups.setdefault(n.group, []).append(n)
    return "\n".join(f"{name}: " + " -> ".join(f"{n.name} ({n.op})" for n in members)
                     for name, members in groups.items())
