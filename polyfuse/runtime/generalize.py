"""A model's kernels generalized over the sizes its plans change: one compile for every shape.

A model is planned per set of input shapes, and each plan's kernels are TC texts with
the sizes written in (``float32(2, 33, 768) X ... where i1 in 0:33``). Planned at a
second shape, most texts come back equal but for some integers: those a dynamic
dimension (a batch, a sequence length, a past's length) decides. As torch.compile
does after a recompile ("automatic dynamic shapes"), the integers that changed become
sizes and the rest stay constants:

* :func:`generalize` anti-unifies two texts of one skeleton (the text with its
  integers cut out): positions whose pair of values differ become size names, one
  per pair (``(7, 33)`` at every place the sequence length stood). A size that no
  input's shape declares is written as an expression of those that one does (``2 * S0``,
  ``S0 * S1``, ``S0 + 1``) fitted to both texts; a text where one does not fit has no
  template.
* A :class:`Template` **matches** a later text when the text has its skeleton, its
  constants, and values at the size positions consistent with one binding of the
  sizes: the template's text with those values is then exactly that text, so its
  kernel (compiled once, for symbolic sizes: :attr:`polyfuse.runtime.kernel.Kernel.symbolic_sizes`)
  computes the same thing. Nothing is assumed that a match does not check.
* :class:`Generalizer` keeps, per model, the texts of earlier plans and the templates
  made from them. A text is anti-unified only with a text of another plan (the
  nearest one: fewest integers differing), so two kernels of one plan that differ in
  a constant (a 768- and a 3072-wide projection) keep kernels of their own.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import combinations_with_replacement
from typing import Any

from polyfuse.errors import FrontendError
from polyfuse.ir.comprehension import Definition, SizeVar, walk

# a number literal of TC text, not a part of a name (i0, float32); integers are the
# ones a template may turn into sizes, others are part of the skeleton
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)(?![\w.])")

TEXTS_PER_SKELETON = 8   # earlier texts a Generalizer keeps per skeleton (the latest)


@dataclass(frozen=True)
class Text:
    """A TC text split at its integer literals: ``parts`` (the text between them, one
    more than ``values``), the integers, and how many of them stand in the inputs'
    declared shapes (those before the signature's ``->``)."""

    parts: tuple[str, ...]
    values: tuple[int, ...]
    declared: int

    @staticmethod
    def of(source: str) -> Text:
        arrow = source.find("->")
        parts, values, declared, at = [], [], 0, 0
        for m in _NUMBER.finditer(source):
            if m.group().isdigit():   # (a float literal stays part of the skeleton)
                parts.append(source[at:m.start()])
                values.append(int(m.group()))
                declared += m.start() < arrow
                at = m.end()
        parts.append(source[at:])
        return Text(tuple(parts), tuple(values), declared)


# an expression of the declared sizes: (coefficient, sizes multiplied, constant added)
Expression = tuple[int, tuple[int, ...], int]


@dataclass(frozen=True)
class Template:
    """A TC text with sizes where two plans' texts differed. ``slots[k]`` is, for the
    ``k``-th integer of the skeleton, None (a constant: ``constants[k]``) or an
    expression of the sizes; ``source`` is the general text (sizes named ``names``)."""

    parts: tuple[str, ...]
    constants: tuple[int, ...]
    slots: tuple[Expression | None, ...]
    names: tuple[str, ...]
    source: str

    def match(self, text: Text) -> dict[str, int] | None:
        """The sizes at which this template's text is ``text``, or None."""
        if text.parts != self.parts:
            return None
        sizes: list[int | None] = [None] * len(self.names)
        for value, slot, constant in zip(text.values, self.slots, self.constants):
            if slot is None:
                if value != constant:
                    return None
            elif (k := _size(slot)) is not None:   # a size itself: binds it (derived ones checked after)
                if sizes[k] not in (None, value):
                    return None
                sizes[k] = value
        bound = [s for s in sizes if s is not None]
        if len(bound) < len(sizes) or any(
                slot is not None and _evaluate(slot, bound) != value for value, slot in zip(text.values, self.slots)):
            return None
        return dict(zip(self.names, bound))


def _size(e: Expression) -> int | None:
    """The size an expression is, where it is one size alone."""
    return e[1][0] if e[0] == 1 and len(e[1]) == 1 and e[2] == 0 else None


def _evaluate(e: Expression, sizes: list[int]) -> int:
    coefficient, factors, constant = e
    product = coefficient
    for k in factors:
        product *= sizes[k]
    return product + constant


def _fit(a: int, b: int, declared: list[tuple[int, int]]) -> Expression | None:
    """An expression of the declared sizes (their values in the two texts) that is ``a``
    in the first and ``b`` in the second: ``c * S``, ``c * S * T`` or ``c * S + d``, the
    simplest that fits (two values fit many lines; a later text that another fits
    instead only misses the template)."""
    fits: list[Expression] = []
    for k, (x, y) in enumerate(declared):
        if x != y and (a - b) % (x - y) == 0:
            c = (a - b) // (x - y)
            if c:
                fits.append((c, (k,), a - c * x))
    for k, j in combinations_with_replacement(range(len(declared)), 2):
        x = declared[k][0] * declared[j][0]
        y = declared[k][1] * declared[j][1]
        if x and y and a % x == 0 and b % y == 0 and a // x == b // y:
            fits.append((a // x, (k, j), 0))
    return min(fits, key=lambda e: (abs(e[2]), len(e[1]), abs(e[0])), default=None)


def _written(e: Expression, names: tuple[str, ...]) -> str:
    coefficient, factors, constant = e
    term = " * ".join([str(coefficient)] * (coefficient != 1) + [names[k] for k in factors])
    if constant > 0:
        return f"({term} + {constant})"
    if constant < 0:
        return f"({term} - {-constant})"
    return f"({term})" if coefficient != 1 or len(factors) > 1 else term


def generalize(first: Text, second: Text) -> Template | None:
    """The template of two texts of one skeleton (see the module docstring), or None
    where they are equal or a differing integer fits no expression of the declared sizes."""
    if first.parts != second.parts or first.values == second.values:
        return None
    pairs: dict[tuple[int, int], int] = {}
    for k, (a, b) in enumerate(zip(first.values, second.values)):
        if a != b and k < first.declared:
            pairs.setdefault((a, b), len(pairs))
    declared = list(pairs)
    slots: list[Expression | None] = []
    for a, b in zip(first.values, second.values):
        if a == b:
            slots.append(None)
        elif (a, b) in pairs:
            slots.append((1, (pairs[a, b],), 0))
        else:
            e = _fit(a, b, declared)
            if e is None:
                return None
            slots.append(e)
    source = "".join(first.parts)
    names = tuple(_fresh(f"S{k}", source) for k in range(len(declared)))
    pieces = [first.parts[0]]
    for slot, value, part in zip(slots, first.values, first.parts[1:]):
        pieces.append(str(value) if slot is None else _written(slot, names))
        pieces.append(part)
    return Template(first.parts, first.values, tuple(slots), names, "".join(pieces))


def _fresh(name: str, source: str) -> str:
    while re.search(rf"\b{name}\b", source):
        name += "_"
    return name


@dataclass(frozen=True)
class Generalized:
    """A text's template and the sizes at which it is that text."""

    template: Template
    sizes: dict[str, int]


class Generalizer:
    """A model's texts of earlier plans, and the templates made from them (see the
    module docstring). ``find`` is called for each kernel text of a plan, from the
    threads compiling the plan's kernels; ``remember`` after the plan is compiled.
    ``definition`` parses a template's text (the planner's, :class:`~polyfuse.ir.plan.Planner`)."""

    def __init__(self, definition: Callable[[str], Definition]) -> None:
        self._definition = definition
        self._texts: dict[tuple[str, ...], list[Text]] = {}
        self._templates: dict[tuple[str, ...], list[Template]] = {}
        self._definitions: dict[str, Definition] = {}   # each template's text, parsed
        self._kernels: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def kernel(self, template: Template, constants: frozenset[str], discarded: frozenset[str],
               make: Callable[[Definition, frozenset[str]], Any]) -> Any:
        """The kernel of ``template`` (made once by ``make(definition, fixed)``) for steps
        whose parameters named in ``constants`` are the plan's constants and whose
        outputs in ``discarded`` are never read: ``fixed`` are those of the constants
        whose shapes have no size (weights the kernel may read packed; a constant
        whose shape changes with the plan is read as it is)."""
        key = (template.source, constants, discarded)
        with self._lock:
            found = self._kernels.get(key)
            if found is None:
                definition = self._definitions[template.source]
                fixed = frozenset(p.name for p in definition.inputs if p.name in constants
                                  and not any(isinstance(n, SizeVar) for e in p.shape for n in walk(e)))
                found = self._kernels[key] = make(definition, fixed)
            return found

    def find(self, source: str) -> Generalized | None:
        """A template ``source`` matches: a known one, else one made from the nearest text
        of an earlier plan; None where there is none, or TC refuses the template's text
        (the text is compiled as it is)."""
        text = Text.of(source)
        with self._lock:
            for known in self._templates.get(text.parts, ()):
                sizes = known.match(text)
                if sizes is not None:
                    return Generalized(known, sizes)
            earlier = [t for t in self._texts.get(text.parts, ()) if t.values != text.values]
            if not earlier:
                return None
            nearest = min(earlier, key=lambda t: sum(a != b for a, b in zip(t.values, text.values)))
            template = generalize(nearest, text)
            if template is None:
                return None
            try:   # (a size where TC takes none, an int size in a float context: the text as it is)
                self._definitions[template.source] = self._definition(template.source)
            except FrontendError:
                return None
            sizes = template.match(text)
            assert sizes is not None, "a template matches the texts it was made from"
            self._templates.setdefault(text.parts, []).append(template)
            return Generalized(template, sizes)

    def remember(self, sources: Iterable[str]) -> None:
        """The kernel texts of a plan compiled (what later plans' texts are compared with)."""
        with self._lock:
            for source in sources:
                text = Text.of(source)
                texts = self._texts.setdefault(text.parts, [])
                if text not in texts:
                    texts.append(text)
                    del texts[:-TEXTS_PER_SKELETON]
