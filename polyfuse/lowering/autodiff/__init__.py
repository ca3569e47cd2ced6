"""Reverse-mode gradients of TC definitions, as TC definitions.

:func:`gradients` turns one definition into one definition per float input, computing
that input's gradient from the gradients of every output (temporaries included, as TC
returns them); :func:`grad` gives their text. The derived definitions go through the same
parser, scheduler and targets as any other. Integer inputs and scalar parameters get no
gradient. ``max=``/``min=`` share the gradient evenly between tied elements (as
``torch.amax``); ``*=`` multiplies the other factors (exact where one is 0); an indirect
read ``E(Idx(b), d)`` becomes a sum guarded by ``Idx(b) == a``, which TC can express.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from polyfuse.errors import ArgumentError
from polyfuse.frontends.tc import parse, parse_definition
from polyfuse.ir.comprehension import Definition, format_definition
from polyfuse.lowering.autodiff.forward import Forward, GradientError
from polyfuse.lowering.autodiff.reverse import Backward, Param


@dataclass(frozen=True)
class Gradient:
    """The definition computing the gradient of forward input ``wrt``; its first output
    is that gradient, the others are its temporaries. ``params`` says what each of its
    parameters holds (see :class:`Param`)."""

    wrt: str
    definition: Definition
    params: tuple[Param, ...]

    @property
    def text(self) -> str:
        return format_definition(self.definition)


def differentiable_inputs(d: Definition) -> tuple[str, ...]:
    """The inputs that get a gradient: the float tensors."""
    return tuple(t.name for t in d.inputs if t.dtype.is_float)


def gradients(d: Definition, wrt: Sequence[str] | None = None, *,
              source: str | None = None) -> tuple[Gradient, ...]:
    """The gradient definitions of ``d``'s inputs ``wrt`` (default: every float input),
    each parsed back from its text; ``source`` is ``d``'s TC text, for error messages."""
    names = differentiable_inputs(d)
    for w in wrt or ():
        if w not in names:
            kind = ("a scalar parameter (declare it as a rank-0 tensor, float() x, to get its "
                    "gradient)" if w in {s.name for s in d.scalars} else
                    "not a float tensor" if w in {t.name for t in d.inputs} else "not an input")
            raise ArgumentError(f"{d.name}: cannot differentiate with respect to '{w}': it is {kind}"
                                f" (float inputs: {', '.join(names) or 'none'})")
    fwd = Forward.of(d, source)
    out = []
    for w in (names if wrt is None else tuple(wrt)):
        definition, params = Backward(fwd, w).build()
        out.append(Gradient(w, parse_definition(format_definition(definition)), params))
    return tuple(out)


def grad(tc: str | Definition, wrt: str | Sequence[str] | None = None, *,
         name: str | None = None) -> str:
    """The TC text of the gradient definitions of ``tc`` (source text or a definition):
    one ``def <name>_grad_<input>`` per float input (or per input in ``wrt``), for every
    definition of the source or the one called ``name``."""
    if isinstance(tc, Definition):
        defs, source = [tc], None
    elif isinstance(tc, str):
        defs, source = list(parse(tc).definitions), tc
    else:
        raise ArgumentError(f"grad() takes TC source text or a Definition, got {type(tc).__name__}")
    if name is not None:
        chosen = [d for d in defs if d.name == name]
        if not chosen:
            raise ArgumentError(f"grad(): no definition '{name}' (there are: "
                                f"{', '.join(d.name for d in defs)})")
        defs = chosen
    wanted = (wrt,) if isinstance(wrt, str) else wrt
    texts = [g.text for d in defs for g in gradients(d, wanted, source=source)]
    return "\n\n".join(texts) + "\n"


__all__ = ["Gradient", "GradientError", "Param", "differentiable_inputs", "gradients", "grad"]
