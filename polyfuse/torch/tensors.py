"""Tensors across the boundary: torch tensors as kernel operands and results as tensors,
without copies where the memory allows."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from polyfuse.errors import ArgumentError
from polyfuse.frontends.torch import to_numpy
from polyfuse.targets import Target


def operand(t: torch.Tensor, target: Target, what: str) -> Any:
    """``t`` as a kernel operand for ``target``: a numpy view of a CPU tensor, or a CUDA
    tensor itself for the ``cuda`` target; contiguous either way."""
    if t.device.type == "cpu":
        return to_numpy(t)
    if t.device.type == "cuda" and target.name == "cuda":
        return t.detach().contiguous()
    raise ArgumentError(f"{what} is on {t.device}; polyfuse's '{target}' target takes CPU "
                        "tensors (CUDA tensors go to target 'cuda')")


def tensor(a: Any) -> torch.Tensor:
    """A kernel's result as a tensor: numpy arrays become tensors sharing their memory
    (copied when read-only, as weights and folded values are), tensors stay."""
    if isinstance(a, torch.Tensor):
        return a
    a = np.asarray(a)
    a = a if a.flags.writeable else a.copy()
    if a.dtype.name == "bfloat16":   # ml_dtypes' bfloat16: torch reads its bits
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)
