"""Finite-difference oracle for derived gradients: float64 definitions on the reference
interpreter, derivatives along random directions by central differences."""

from __future__ import annotations

import numpy as np

import polyfuse as pf
from polyfuse.frontends.tc import parse
from polyfuse.ir.comprehension import Definition, format_definition
from polyfuse.lowering.autodiff import Gradient, gradients
from polyfuse.lowering.autodiff.widen import widen


def widened(source: str, entry: str) -> Definition:
    """The definition ``entry`` of ``source`` with float types made float64."""
    return widen(parse(source)[entry])


def compiled(d: Definition, target: str = "reference"):
    text = format_definition(d)
    return getattr(pf.define(text, target=target), d.name)


def as_float64(args: tuple) -> list:
    """Float arrays (16-bit ones too) as float64; the rest as they are."""
    return [np.asarray(a, np.float64) if isinstance(a, np.ndarray) and
            (a.dtype.kind == "f" or str(a.dtype) == "bfloat16") else a for a in args]


def outputs(kernel, args) -> tuple[np.ndarray, ...]:
    result = kernel(*args)
    return result if isinstance(result, tuple) else (result,)


def loss(kernel, args, weights) -> float:
    """sum_i <weights_i, output_i>: its gradient is what the derived kernels compute for
    output gradients ``weights``."""
    return float(sum(np.sum(w * o) for w, o in zip(weights, outputs(kernel, args))))


def run_gradient(g: Gradient, d: Definition, args: list, weights: list, target: str = "reference"):
    """The gradient of ``g.wrt`` that ``g``'s definition computes from forward ``args``
    and output gradients ``weights``."""
    names = [p.name for p in d.params]
    fwd_outputs = dict(zip((t.name for t in d.outputs), outputs(compiled(d, target), args)))
    grads = dict(zip((t.name for t in d.outputs), weights))
    values = {"input": dict(zip(names, args)), "output": fwd_outputs, "grad": grads}
    call = [values[p.role][p.of] for p in g.params]
    return outputs(compiled(g.definition, target), call)[0]


def check_gradients(d: Definition, args: list, *, rng: np.random.Generator, eps: float = 1e-6,
                    rtol: float = 1e-6, directions: int = 2, target: str = "reference") -> int:
    """Check every derived gradient of ``d`` at ``args`` against central differences along
    random directions; returns how many inputs were checked."""
    forward = compiled(d, target)
    weights = [rng.standard_normal(o.shape) for o in outputs(forward, args)]
    weights = [w if o.dtype.kind == "f" else np.zeros(o.shape) for w, o in
               zip(weights, outputs(forward, args))]
    names = [p.name for p in d.params]
    checked = 0
    for g in gradients(d):
        k = names.index(g.wrt)
        grad = run_gradient(g, d, args, weights, target)
        assert grad.shape == np.shape(args[k]) and grad.dtype == np.float64
        for _ in range(directions):
            v = rng.standard_normal(np.shape(args[k]))
            plus, minus = list(args), list(args)
            plus[k], minus[k] = args[k] + eps * v, args[k] - eps * v
            numeric = (loss(forward, plus, weights) - loss(forward, minus, weights)) / (2 * eps)
            analytic = float(np.sum(grad * v))
            scale = max(1.0, abs(numeric), float(np.sum(np.abs(grad * v))))
            assert abs(numeric - analytic) <= rtol * scale * 100, \
                f"{d.name}: d/d{g.wrt}: finite differences {numeric}, derived {analytic}\n{g.text}"
        checked += 1
    return checked

