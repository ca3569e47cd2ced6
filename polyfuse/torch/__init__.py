"""polyfuse for PyTorch users: the ``torch.compile`` backend, and TC definitions as
differentiable torch functions.

``torch.compile(model, backend="polyfuse", options={"target": "host"})`` runs the parts
of a model polyfuse supports as compiled polyfuse programs and the rest in eager
PyTorch (see :mod:`polyfuse.torch.dynamo`); :func:`backend` is the same backend as a
callable. ``define`` and ``grad`` come from :mod:`polyfuse.torch.define`, loaded on
first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from polyfuse.torch.dynamo import BackendOptions, backend

__all__ = ["BackendOptions", "backend", "define", "grad"]

_LAZY = ("define", "grad")


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'polyfuse.torch' has no attribute '{name}'")
    module = importlib.import_module("polyfuse.torch.define")
    # importing the submodule bound its name here; the functions take the names back
    for n in _LAZY:
        if hasattr(module, n):
            globals()[n] = getattr(module, n)
    if name not in globals() or globals()[name] is module:
        raise AttributeError(f"polyfuse.torch.define has no '{name}'")
    return globals()[name]
