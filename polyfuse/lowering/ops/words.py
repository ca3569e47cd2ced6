"""int32 words of narrow values: the operands of the dot-product builtins (``dot4``: 4
bytes, ``bfdot2``: 2 bfloat16), element j of a word in its bits ``j * 32 / count`` up
(memory order on a little-endian machine)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from polyfuse.lowering.ops.conv import affine, guarded


def packed_word(values: Sequence[str], index: str, count: int, inside: Sequence[str],
                fill: str) -> str:
    """``as_int32`` of the uint32 ``values`` (each fitting its share of the bits), value
    j that at ``len(values) * index + j`` along an axis of ``count`` where that is
    inside it and ``inside`` holds, else ``fill``."""
    lanes = len(values)
    last = -(-count // lanes) - 1
    parts = []
    for j, value in enumerate(values):
        past = [f"{affine([(index, lanes)], j)} < {count}"] if lanes * last + j >= count else []
        part = guarded([*inside, *past], value, fill)
        parts.append(f"(({part}) << {32 // lanes * j})" if j else f"({part})")
    return f"as_int32({' | '.join(parts)})"


def weight_words(weights: np.ndarray) -> np.ndarray:
    """Weights ``(M, C, K...)`` of a type of 1 or 2 bytes as int32 words ``(C', K..., M)``:
    a word holds 4 (or 2) consecutive channels of one output (channels past C are 0),
    the operand a dot product reads 16 outputs of in one vector."""
    m, c, rest = weights.shape[0], weights.shape[1], weights.shape[2:]
    lanes = 4 // weights.dtype.itemsize
    words = -(-c // lanes)
    spread = np.zeros((m, lanes * words, *rest), weights.dtype)
    spread[:, :c] = weights
    packed = np.moveaxis(spread.reshape(m, words, lanes, *rest), (0, 2), (-2, -1))
    return np.ascontiguousarray(packed).view(np.int32)[..., 0]
