"""TC definitions as PyTorch operators, with derived gradients.

``define(source, target=...)`` makes each ``def`` a ``torch.library.custom_op``: it takes
and returns CPU tensors (the same memory crosses to polyfuse as numpy views: no copies
for contiguous tensors), has a fake implementation for ``torch.compile`` (output shapes
from the definition's sizes), and an autograd formula whose kernels are the definitions
:func:`polyfuse.grad` derives, compiled by polyfuse for the same target (each its own
custom op, so backward graphs trace too; being TC definitions, they are differentiated
the same way, so gradients of gradients work). A ``float`` definition also runs on
float64 tensors (a copy of it with every float type made float64). Integer inputs and
scalar parameters get no gradient.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from polyfuse.driver import define as define_kernels
from polyfuse.errors import ArgumentError, DTypeError
from polyfuse.frontends.tc import parse
from polyfuse.ir.comprehension import Definition, ScalarDecl, TensorDecl, format_definition
from polyfuse.ir.sizes import sizes_of_shapes
from polyfuse.ir.symbolic import evaluate_int
from polyfuse.ir.types import DType
from polyfuse.lowering.autodiff import Gradient, grad, gradients
from polyfuse.lowering.autodiff.widen import widen
from polyfuse.targets import Target
from polyfuse.torch.tensors import operand, tensor

__all__ = ["define", "grad", "TorchDefinitions"]

_TORCH_DTYPES = {DType.FLOAT16: torch.float16, DType.BFLOAT16: torch.bfloat16,
                 DType.FLOAT32: torch.float32, DType.FLOAT64: torch.float64,
                 DType.INT8: torch.int8, DType.INT16: torch.int16, DType.INT32: torch.int32,
                 DType.INT64: torch.int64, DType.UINT8: torch.uint8, DType.UINT16: torch.uint16,
                 DType.UINT32: torch.uint32, DType.UINT64: torch.uint64, DType.BOOL: torch.bool}
_SCALAR_TYPES = {True: "float", False: "int"}
_OPS: dict[str, Any] = {}       # qualified name -> op, so a source defined twice reuses its ops


class TorchDefinitions:
    """The torch operators of one TC source, as attributes named after its definitions."""

    def __init__(self, ops: dict[str, Any]) -> None:
        self._ops = ops

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_ops"][name]
        except KeyError:
            raise AttributeError(f"no definition '{name}' (there are: {', '.join(self._ops)})") from None

    def __getitem__(self, name: str) -> Any:
        return self._ops[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._ops)

    def __dir__(self) -> list[str]:
        return list(self._ops)


def define(tc_source: str, target: str | Target = "reference", name: str | None = None) -> Any:
    """The TC definitions of ``tc_source`` as differentiable torch operators for
    ``target``: the one called ``name``, or all of them (attributes of the result)."""
    if not isinstance(tc_source, str):
        raise ArgumentError(f"define() takes TC source text, got {type(tc_source).__name__}")
    module = parse(tc_source)
    tgt = Target.parse(target)
    names = [d.name for d in module.definitions]
    if name is not None and name not in names:
        raise ArgumentError(f"define(): no definition '{name}' (there are: {', '.join(names)})")
    key = hashlib.sha1(f"{tgt}\n{tc_source}".encode()).hexdigest()[:12]
    ops = {d.name: _op(_Variants(d, tgt, tc_source), key)
           for d in module.definitions if name is None or d.name == name}
    return ops[name] if name is not None else TorchDefinitions(ops)


class _Variants:
    """A definition as declared and, for ``float`` ones, widened to float64; each
    compiled (and differentiated) the first time a call needs it."""

    def __init__(self, d: Definition, target: Target, source: str) -> None:
        self.definition, self.target, self.source = d, target, source
        self._kernels: dict[bool, tuple[Definition, Any]] = {}
        self._gradients: dict[str, Gradient] | None = None

    def widens(self, args: Sequence[Any]) -> bool:
        """Whether these arguments call for the float64 copy."""
        for p, a in zip(self.definition.params, args):
            if isinstance(p, TensorDecl) and p.dtype is DType.FLOAT32 and isinstance(a, torch.Tensor):
                return a.dtype == torch.float64
        return False

    def kernel(self, wide: bool) -> tuple[Definition, Any]:
        """The definition in the float type asked for, and its kernel."""
        if wide not in self._kernels:
            d = widen(self.definition) if wide else self.definition
            self._kernels[wide] = d, getattr(define_kernels(format_definition(d), target=self.target), d.name)
        return self._kernels[wide]

    def gradients(self) -> dict[str, Gradient]:
        """The derived gradient definition of each float input (derived once)."""
        if self._gradients is None:
            self._gradients = {g.wrt: g for g in gradients(self.definition, source=self.source)}
        return self._gradients


def _schema(d: Definition) -> str:
    params = []
    for p in d.params:
        kind = "Tensor" if isinstance(p, TensorDecl) else _SCALAR_TYPES.get(p.dtype.is_float, "int")
        params.append(f"{kind} {p.name}")
    result = "Tensor" if len(d.outputs) == 1 else f"({', '.join('Tensor' for _ in d.outputs)})"
    return f"({', '.join(params)}) -> {result}"


def _arrays(d: Definition, args: Sequence[Any], target: Target) -> list[Any]:
    """The arguments as the kernel takes them: CPU tensors as numpy views, CUDA tensors
    as they are for the ``cuda`` target (its runtime works on them in place)."""
    out = []
    for p, a in zip(d.params, args):
        if isinstance(a, torch.Tensor):
            out.append(operand(a, target, f"{d.name}: '{p.name}'"))
        else:
            out.append(a)
    return out


def _tensors(result: Any) -> tuple[torch.Tensor, ...]:
    arrays = result if isinstance(result, tuple) else (result,)
    return tuple(tensor(a) for a in arrays)


def _op(variants: _Variants, key: str, *, gradient_ops: bool = True) -> Any:
    """The custom op of ``variants``' definition; with ``gradient_ops``, those of its
    gradients are made now (for torch.compile to trace them), else at the first backward
    that needs them (a gradient of a gradient, in eager mode)."""
    d = variants.definition
    qualname = f"polyfuse::{d.name}_{key}"
    if qualname in _OPS:
        return _OPS[qualname]
    tensors = [k for k, p in enumerate(d.params) if isinstance(p, TensorDecl)]

    def forward(*args: Any) -> Any:
        definition, kernel = variants.kernel(variants.widens(args))
        out = _tensors(kernel(*_arrays(definition, args, variants.target)))
        return out[0] if len(out) == 1 else out

    op = torch.library.custom_op(qualname, forward, mutates_args=(), schema=_schema(d))

    @op.register_fake
    def _(*args: Any) -> Any:
        wide = variants.widens(args)
        shapes = [tuple(int(s) for s in a.shape) if isinstance(a, torch.Tensor) else None for a in args]
        sizes = sizes_of_shapes(d, shapes)
        device = args[tensors[0]].device if tensors else torch.device("cpu")
        out = tuple(torch.empty(tuple(evaluate_int(s, sizes) for s in t.shape), device=device,
                                dtype=_torch_dtype(t.dtype, wide)) for t in d.outputs)
        return out[0] if len(out) == 1 else out

    grad_ops: dict[str, Any] = {}

    def grad_op(wrt: str) -> Any:
        if wrt not in grad_ops:
            g = variants.gradients()[wrt]
            grad_ops[wrt] = _op(_Variants(g.definition, variants.target, g.text), key,
                                gradient_ops=False)
        return grad_ops[wrt]

    if gradient_ops:
        for x in d.inputs:
            if x.dtype.is_float:
                grad_op(x.name)

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        outs = output if isinstance(output, tuple) else (output,)
        ctx.scalars = {p.name: a for p, a in zip(d.params, inputs) if isinstance(p, ScalarDecl)}
        ctx.save_for_backward(*(inputs[k] for k in tensors), *outs)

    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        saved = ctx.saved_tensors
        values = {"input": {**ctx.scalars, **{d.params[k].name: saved[n] for n, k in enumerate(tensors)}},
                  "output": {t.name: saved[len(tensors) + n] for n, t in enumerate(d.outputs)}}
        values["grad"] = {t.name: g if g is not None else torch.zeros_like(values["output"][t.name])
                          for t, g in zip(d.outputs, grads)}
        result: list[Any] = [None] * len(d.params)
        for k, p in enumerate(d.params):
            if isinstance(p, TensorDecl) and p.dtype.is_float and ctx.needs_input_grad[k]:
                g = variants.gradients()[p.name]
                out = grad_op(p.name)(*(values[q.role][q.of] for q in g.params))
                result[k] = out[0] if isinstance(out, tuple) else out   # the rest: its temporaries
        return tuple(result)

    op.register_autograd(backward, setup_context=setup_context)
    _OPS[qualname] = op
    return op


def _torch_dtype(dtype: DType, wide: bool) -> torch.dtype:
    if wide and dtype is DType.FLOAT32:
        return torch.float64
    if dtype not in _TORCH_DTYPES:
        raise DTypeError(f"no torch dtype for {dtype}")
    return _TORCH_DTYPES[dtype]
