"""Which convolutions run as Winograd's minimal filtering F(m x m, 3x3), and the nodes
they become.

A tile of m x m outputs is ``Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A`` for the (m + 2) x (m + 2)
input tile ``d`` under it and the 3x3 filter ``g`` (Lavin and Gray, "Fast Algorithms
for Convolutional Neural Networks"). Summed over input channels, the elementwise product
becomes (m + 2)² matrix products, one per position in the tile, of the transformed input
tiles by the transformed filters ``U = G g Gᵀ`` (computed at compile time):
F(4x4, 3x3) takes 36 products per 16 outputs and channel pair, F(2x2, 3x3) 16 per 4,
where the direct convolution takes 9 per output.

The layout pass (:mod:`polyfuse.lowering.layout`) asks :func:`winograd_tile` of each
convolution it runs channels-last; one that gets a tile becomes three nodes on the
channels-last twins (:func:`winograd_nodes`): the input transform, a batched MatMul by
the transformed filters (a constant the planner prepacks like any weights) and the
output transform with the bias, which the convolution's epilogue then fuses into. The
kernels are in :mod:`polyfuse.lowering.ops.winograd`.

The transformed filters are (m + 2)² / 9 times the filters' size (4x for m = 4), and
each is read by one matrix product whose rows are the tiles: with few tiles (a small
map) the products wait on memory for the filters. So the tile is the larger one that
leaves each product :data:`MIN_TILES` rows, and a map too small for either keeps the
direct convolution (as do strided, dilated and grouped ones).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from polyfuse.ir.graph import Constant, Node, TensorType
from polyfuse.ir.types import DType

# (Bᵀ, G, Aᵀ) of F(m, 3) by m: F(4, 3) over the points 0, 1, -1, 2, -2 and infinity,
# F(2, 3) over 0, 1, -1 and infinity
TRANSFORMS: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {
    4: (np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                  [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float32),
        np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                  [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]),
        np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                  [0, 1, -1, 8, -8, 1]], np.float32)),
    2: (np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float32),
        np.array([[1, 0, 0], [1 / 2, 1 / 2, 1 / 2], [1 / 2, -1 / 2, 1 / 2], [0, 0, 1]]),
        np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float32)),
}
MIN_TILES = 32        # rows of each matrix product (tiles of the map), at least
MIN_CHANNELS = 32     # input and output channels, at least


def transformed_filters(w: np.ndarray, tile: int) -> np.ndarray:
    """``U(x, y, c, m) = (G w(m, c) Gᵀ)(x, y)`` for ONNX's filters ``w(m, c, 3, 3)``,
    computed in float64 and rounded once."""
    g = TRANSFORMS[tile][1]
    return np.einsum("xi,mcij,yj->xycm", g, w.astype(np.float64), g).astype(np.float32)


def winograd_tile(n: Node, w: np.ndarray, x: TensorType | None, bias: TensorType | None) -> int:
    """The tile (outputs along each axis) Conv node ``n`` of filters ``w`` on an input of
    type ``x`` with a bias of type ``bias`` (None: none, or unknown) runs in, or 0 for the
    direct convolution. Winograd takes well-formed 2-D 3x3 float32 convolutions of stride
    and dilation 1, one group, explicit padding of at most 1, a known map size and at
    least :data:`MIN_CHANNELS` input and output channels (a multiple of 16 of the
    latter); the direct convolution's lowering names what is wrong with the others."""
    if n.op != "Conv" or w.ndim != 4 or w.shape[2:] != (3, 3) or w.dtype != np.float32:
        return 0
    if (len(n.inputs) > 2 and n.inputs[2]) and bias != TensorType(DType.FLOAT32, (w.shape[0],)):
        return 0
    if x is None or x.dtype is not DType.FLOAT32 or x.rank != 4 or \
            not all(isinstance(d, int) for d in x.shape[1:]) or x.shape[1] != w.shape[1]:
        return 0
    kernel, strides, dilations, pads = (_ints(n, k, d) for k, d in (
        ("kernel_shape", (3, 3)), ("strides", (1, 1)), ("dilations", (1, 1)), ("pads", (0,) * 4)))
    if kernel != (3, 3) or strides != (1, 1) or dilations != (1, 1) or pads is None or \
            len(pads) != 4 or any(p < 0 or p > 1 for p in pads) or _ints(n, "group", (1,)) != (1,) or \
            str(n.attr("auto_pad", "NOTSET")) != "NOTSET" or min(w.shape[:2]) < MIN_CHANNELS or \
            w.shape[0] % 16:
        return 0
    sizes = _output_sizes(x, pads)
    batch = x.shape[0] if isinstance(x.shape[0], int) else 1   # (a symbolic batch: at least 1)
    return next((t for t in sorted(TRANSFORMS, reverse=True)
                 if batch * math.prod(_tiles(sizes, t)) >= MIN_TILES), 0)


def _ints(n: Node, key: str, default: tuple[int, ...]) -> tuple[int, ...] | None:
    """Attribute ``key`` of ``n`` as a tuple of integers (one for a scalar), None when it
    holds something else (the direct lowering reports a malformed node)."""
    value = n.attr(key, default)
    try:
        return tuple(int(v) for v in np.asarray(value).reshape(-1))
    except (TypeError, ValueError):
        return None


def _output_sizes(x: TensorType, pads: tuple[int, ...]) -> tuple[int, int]:
    return (int(x.shape[2]) + pads[0] + pads[2] - 2, int(x.shape[3]) + pads[1] + pads[3] - 2)


def _tiles(sizes: tuple[int, int], tile: int) -> tuple[int, int]:
    return (-(-sizes[0] // tile), -(-sizes[1] // tile))


def winograd_nodes(n: Node, tile: int, source: str, result: str, w: np.ndarray, x: TensorType,
                   fresh: Callable[[str], str]) -> tuple[list[Node], list[Constant]]:
    """The nodes computing Conv ``n`` in tiles of ``tile`` (:func:`winograd_tile`) from
    the channels-last twin ``source`` of its input into the channels-last ``result``, and
    the constant they add (the transformed filters). ``fresh`` makes unused names."""
    pads = _ints(n, "pads", (0,) * 4)
    assert isinstance(pads, tuple)   # (winograd_tile checked it)
    sizes = _output_sizes(x, pads)
    tiles = _tiles(sizes, tile)
    filters = Constant(fresh(f"{n.name}:winograd_filters"), transformed_filters(w, tile))
    v, s = fresh(f"{n.name}:winograd_tiles"), fresh(f"{n.name}:winograd_products")
    bias = n.inputs[2:3] if len(n.inputs) > 2 and n.inputs[2] else ()
    shape = (("tile", tile), ("tiles", tiles))
    nodes = [
        Node("WinogradInput", fresh(f"{n.name}/winograd_input"), (source,), (v,),
             (("pads", tuple(pads[:2])), *shape)),
        Node("MatMul", fresh(f"{n.name}/winograd_products"), (v, filters.name), (s,)),
        Node("WinogradOutput", n.name, (s, *bias), (result,), (("sizes", sizes), *shape)),
    ]
    return nodes, [filters]
