"""Recording the ranges of a model's float tensors (a :class:`~polyfuse.ir.profile.Profile`).

Fusion keeps a kernel's intermediates in registers, and the graph passes rename or
drop values (a batch normalization folded into its convolution), so the ranges are
read from a variant of the model as the front end made it: the same graph with every
float value it names made an output, compiled for the same target. Graph passes
respect outputs, so each such value is computed and returned as the model defines it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from polyfuse.errors import ArgumentError
from polyfuse.ir.graph import Graph, Value
from polyfuse.ir.profile import BINS, Profile

T = TypeVar("T")


@dataclass(frozen=True)
class ModelSource:
    """What a model was compiled from: the front end's graph (before the graph passes)
    and the sha256 of the model's ONNX bytes (hashed :func:`beside` the front end's
    reading of the model, the bytes then let go)."""

    graph: Graph
    hashed: Future[str] = field(repr=False)

    @property
    def digest(self) -> str:
        return self.hashed.result()


def beside(fn: Callable[..., T], *args: Any) -> Future[T]:
    """``fn(*args)`` computed on a thread of its own, its result (or error) for whoever
    asks (a model's sha256: hashlib lets other threads run while it hashes a large
    buffer, 0.2 s for a 435 MB BERT-base, which the front end's work then hides)."""
    done: Future[T] = Future()

    def run() -> None:
        try:
            done.set_result(fn(*args))
        except BaseException as err:  # noqa: BLE001 - handed to whoever asks for the result
            done.set_exception(err)
    threading.Thread(target=run, name="polyfuse-beside", daemon=True).start()
    return done


def observed(graph: Graph) -> Graph:
    """``graph`` with every float value of known type that a node defines as an output
    too (the model's own outputs first)."""
    outputs = list(graph.outputs)
    named = {v.name for v in outputs}
    defined = {o for n in graph.nodes for o in n.outputs if o}
    for v in graph.types:
        if v.name in defined and v.name not in named and v.type.dtype.is_float \
                and not v.type.dtype.is_narrow:
            outputs.append(Value(v.name, v.type))
            named.add(v.name)
    return replace(graph, outputs=tuple(outputs))


def feeds_of(feeds: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The calibration feeds, checked to be a non-empty iterable of dicts."""
    if isinstance(feeds, Mapping):
        raise ArgumentError("profile_ranges takes an iterable of feeds (dicts of input arrays), "
                            "got one dict: wrap it in a list")
    listed = list(feeds)
    if not listed or not all(isinstance(f, Mapping) for f in listed):
        raise ArgumentError("profile_ranges takes a non-empty iterable of feeds, each a dict "
                            "{input name: array}")
    return listed


def record(run: Any, inputs: tuple[Value, ...], feeds: Iterable[Mapping[str, Any]],
           digest: str, bins: int = BINS) -> Profile:
    """The profile of the values ``run(feed)`` returns, and of the float inputs, over
    ``feeds``."""
    profile = Profile(digest, {}, bins=bins)
    floats = [v.name for v in inputs if v.type.dtype.is_float]
    for feed in feeds_of(feeds):
        values = dict(run(feed))
        values.update({n: feed[n] for n in floats if n in feed})
        profile = profile.recorded(values)
    return profile
