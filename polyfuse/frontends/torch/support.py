"""Whether one FX node can be lowered: what the torch.compile backend partitions by.

The node's lowering is run on a scratch builder with its arguments described by their
``meta["val"]``, so a lowering that refuses some arguments (a grouped convolution's
backward, pooling indices that are read) refuses them here too.
"""

from __future__ import annotations

from typing import Any

import torch.fx

from polyfuse.frontends.torch.builder import Builder, Size, Tensor, Unsupported
from polyfuse.frontends.torch.convert import Rejection, _described, location, used_outputs
from polyfuse.frontends.torch.registry import LOWERINGS, op_name


def _argument(value: Any) -> Any:
    if isinstance(value, torch.fx.Node):
        described = _described(value.meta.get("val"))
        if isinstance(described, Tensor):
            return Tensor(value.name, described.dtype, described.shape)
        if isinstance(described, Size):
            return Size(value.name)
        if isinstance(described, tuple):   # a multi-output op, read through getitem
            return tuple(Tensor(f"{value.name}.{k}", d.dtype, d.shape) if isinstance(d, Tensor) else d
                         for k, d in enumerate(described))
        return described
    if isinstance(value, (list, tuple)):
        items = [_argument(v) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, dict):
        return {k: _argument(v) for k, v in value.items()}
    return value


def rejection(node: torch.fx.Node) -> Rejection | None:
    """Why ``node`` (a ``call_function``) cannot be lowered, or None if it can."""
    name = op_name(node.target)
    lowering = LOWERINGS.get(name)
    if lowering is None:
        return Rejection(name, node.name, location(node))
    b = Builder()
    b.start(node.name, used_outputs(node))
    try:
        out = _described(node.meta.get("val"))
        lowering(b, out, *_argument(node.args), **_argument(node.kwargs))
    except (Unsupported, TypeError) as err:
        return Rejection(name, node.name, location(node),
                         str(err) if isinstance(err, Unsupported) else str(err))
    return None
