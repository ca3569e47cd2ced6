"""Graph IR passes and the pass manager that runs them.

Each pass is a pure function Graph -> Graph named with a verb. The manager verifies
the graph after every pass (when asked), keeps the text of the graph after each pass
for ``--dump``-style inspection, and times the passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from polyfuse.errors import PolyfuseError
from polyfuse.ir.graph import Graph, Node, verify_graph

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
    return replace(g, nodes=tuple(reversed(kept)), constants=constants)


def _attr_key(value: object) -> object:
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


DEFAULT_PASSES: tuple[GraphPass, ...] = (eliminate_dead_nodes, eliminate_common_subexpressions,
                                         eliminate_dead_nodes)


@dataclass
class PassManager:
    passes: Sequence[GraphPass] = DEFAULT_PASSES
    verify: bool = False
    dumps: list[tuple[str, str]] = field(default_factory=list)   # (pass name, graph text)
    times: list[tuple[str, float]] = field(default_factory=list)
    keep_dumps: bool = False

    def run(self, g: Graph) -> Graph:
        if self.keep_dumps:
            self.dumps.append(("input", str(g)))
        for p in self.passes:
            start = time.perf_counter()
            try:
                g = p(g)
                if self.verify:
                    verify_graph(g)
            except PolyfuseError as err:
                raise type(err)(f"in graph pass '{p.__name__}' on graph '{g.name}': {err}") from None
            self.times.append((p.__name__, time.perf_counter() - start))
            if self.keep_dumps:
                self.dumps.append((p.__name__, str(g)))
        return g
