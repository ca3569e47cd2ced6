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
* Within a model's first plan, :meth:`Generalizer.alike` makes one template of the
  texts that share a skeleton where there are :data:`ALIKE_IN_PLAN` or more of them and they
  reduce over nothing (elementwise chains, copies: a DenseNet normalizes 62
  concatenations of different widths): one compile instead of one per text. A
  contraction keeps its sizes: they decide its tiles, register blocks and packing,
  which a kernel for any size chooses for less well (a DenseNet's 1x1 convolutions
  over symbolic widths ran 1.3-1.5x slower).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from polyfuse.errors import FrontendError
from polyfuse.ir.comprehension import Binary, BinaryOp, Definition, Expr, IndexVar, Read, SizeVar, children, walk

# a number literal of TC text, not a part of a name (i0, float32); integers are the
# ones a template may turn into sizes, others are part of the skeleton
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)(?![\w.])")

TEXTS_PER_SKELETON = 8   # earlier texts a Generalizer keeps per skeleton (the latest)
ALIKE_IN_PLAN = 3        # texts of one plan and skeleton that share one kernel (see Generalizer.alike)


@dataclass(frozen=True)
class Text:
    """A TC text split at its integer literals: ``parts`` (the text between them, one
    more than ``values``), the integers, how many of them stand in the inputs'
    declared shapes (those before the signature's ``->``) and how many in the whole
    signature (the outputs' shapes too, before the body's ``{``)."""

    parts: tuple[str, ...]
    values: tuple[int, ...]
    declared: int
    signed: int

    @staticmethod
    def of(source: str) -> Text:
        arrow = source.find("->")
        body = source.find("{", arrow)
        parts, values, declared, signed, at = [], [], 0, 0, 0
        for m in _NUMBER.finditer(source):
            if m.group().isdigit():   # (a float literal stays part of the skeleton)
                parts.append(source[at:m.start()])
                values.append(int(m.group()))
                declared += m.start() < arrow
                signed += m.start() < body
                at = m.end()
        parts.append(source[at:])
        return Text(tuple(parts), tuple(values), declared, signed)


# An expression of sizes S0, S1, ...: ``(constant, terms)``, each term a ``(coefficient,
# sizes multiplied)``; ``(-1, ((1, (0,)), (1, (1,))))`` is S0 + S1 - 1.
Expression = tuple[int, tuple[tuple[int, tuple[int, ...]], ...]]


@dataclass(frozen=True)
class Template:
    """A TC text with sizes where plans' texts differed. ``slots[k]`` is, for the
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
                slot is not None and evaluate(slot, bound) != value for value, slot in zip(text.values, self.slots)):
            return None
        return dict(zip(self.names, bound))


def size(k: int) -> Expression:
    """Size ``k`` alone."""
    return (0, ((1, (k,)),))


def _size(e: Expression) -> int | None:
    """The size an expression is, where it is one size alone."""
    constant, terms = e
    return terms[0][1][0] if constant == 0 and len(terms) == 1 and terms[0][0] == 1 and len(terms[0][1]) == 1 \
        else None


def evaluate(e: Expression | int, sizes: list[int]) -> int:
    if isinstance(e, int):
        return e
    constant, terms = e
    for coefficient, factors in terms:
        product = coefficient
        for k in factors:
            product *= sizes[k]
        constant += product
    return constant


def polynomial(e: Expression | int) -> dict[tuple[int, ...], int]:
    """An expression as its terms: sizes multiplied (sorted; () the constant) -> coefficient."""
    if isinstance(e, int):
        return {(): e} if e else {}
    out: dict[tuple[int, ...], int] = {(): e[0]} if e[0] else {}
    for coefficient, factors in e[1]:
        key = tuple(sorted(factors))
        out[key] = out.get(key, 0) + coefficient
    return {k: c for k, c in out.items() if c}


def expression(terms: dict[tuple[int, ...], int]) -> Expression | int:
    """Terms (as :func:`polynomial` gives them) as an expression; an int where constant."""
    rest = tuple((c, k) for k, c in sorted(terms.items()) if k and c)
    return (terms.get((), 0), rest) if rest else terms.get((), 0)


def product(a: Expression | int, b: Expression | int) -> Expression | int:
    """``a * b``, expanded."""
    out: dict[tuple[int, ...], int] = {}
    for x, c in polynomial(a).items():
        for y, d in polynomial(b).items():
            key = tuple(sorted(x + y))
            out[key] = out.get(key, 0) + c * d
    return expression(out)


def total(a: Expression | int, b: Expression | int) -> Expression | int:
    """``a + b``."""
    out = polynomial(a)
    for k, c in polynomial(b).items():
        out[k] = out.get(k, 0) + c
    return expression(out)


class Polynomials:
    """Many expressions of the sizes evaluated at once: ``at(values)`` is
    ``[evaluate(e, values) for e in expressions]`` (an array), one integer matrix product over
    the products of sizes they use (exactly; sizes large enough that some expression
    could leave int64 are evaluated one by one in Python's integers)."""

    LIMIT = 1 << 62

    def __init__(self, expressions: list[Expression | int]) -> None:
        self.expressions = expressions
        terms = [polynomial(e) for e in expressions]
        self.products = sorted({k for t in terms for k in t if k}, key=lambda k: (len(k), k))
        column = {k: j for j, k in enumerate(self.products)}
        self.matrix = np.zeros((len(terms), len(self.products)), np.int64)
        self.constants = np.array([t.get((), 0) for t in terms], np.int64)
        for row, t in enumerate(terms):
            for k, c in t.items():
                if k:
                    self.matrix[row, column[k]] = c
        # the largest size at which every expression's terms stay under LIMIT
        self.largest = 1 << 31
        while self.largest > 1 and any(sum(abs(c) * self.largest ** len(k) for k, c in t.items()) >= self.LIMIT
                                       for t in terms):
            self.largest >>= 1

    def at(self, values: list[int]) -> np.ndarray:
        """The expressions' values (int64; Python ints in an object array where some
        could leave int64)."""
        if not self.products:
            return self.constants
        if max(values) > self.largest or min(values) < 0:
            return np.array([evaluate(e, values) for e in self.expressions], object)
        m = np.array([math.prod([values[k] for k in p]) for p in self.products], np.int64)
        return self.matrix @ m + self.constants  # type: ignore[no-any-return]


def fit(values: list[int], rows: list[list[int]]) -> Expression | int | None:
    """The simplest expression of the sizes that is ``values[s]`` at the sizes of each
    sample ``rows[s]``: a constant; an affine function with integer coefficients of one
    size (``2 * S0 - 1``), of two (``S0 + S1``) or of all; or one product of two sizes,
    scaled and shifted (``S0 * S1``, ``12 * S0 * S0``). A form is tried only where the
    samples determine it (two samples fix ``c * S + d``; ``a * S + b * T + d`` takes
    three, where two samples try sums and differences alone). None where nothing is
    exact at every sample: more samples than a form needs make a fit a check too."""
    if len(set(values)) == 1:
        return values[0]
    n = len(rows[0])
    if not n:
        return None
    forms: list[tuple[tuple[int, ...], ...]] = [((k,),) for k in range(n)]
    forms += [((k,), (j,)) for k in range(n) for j in range(k + 1, n)]
    if n > 2:
        forms.append(tuple((k,) for k in range(n)))
    forms += [((k, j),) for k in range(n) for j in range(k, n)]
    for form in forms:
        if len(form) + 1 <= len(rows):
            e = _solve(form, values, rows)
            if e is not None:
                return e
    for k in range(n):   # a * S + b * T + d from two samples: a and b of 1 and -1
        for j in range(n):
            for a, b in ((1, 1), (1, -1)) if k < j else ((1, -1),) if k != j else ():
                e = (values[0] - a * rows[0][k] - b * rows[0][j], ((a, (k,)), (b, (j,))))
                if all(evaluate(e, row) == v for row, v in zip(rows, values)):
                    return e
    return None


def _solve(form: tuple[tuple[int, ...], ...], values: list[int], rows: list[list[int]]) -> Expression | None:
    """The integer coefficients of ``d + sum(c_t * term_t)`` that give ``values`` at
    ``rows`` exactly, or None."""
    basis = np.array([[1.0] + [float(math.prod(row[k] for k in term)) for term in form] for row in rows])
    solution, *_ = np.linalg.lstsq(basis, np.array(values, dtype=np.float64), rcond=None)
    if not np.all(np.isfinite(solution)):
        return None
    coefficients = [int(round(c)) for c in solution]
    e: Expression = (coefficients[0], tuple((c, term) for c, term in zip(coefficients[1:], form) if c))
    if not e[1] or not all(evaluate(e, row) == v for row, v in zip(rows, values)):
        return None
    return e


def _written(e: Expression, names: tuple[str, ...]) -> str:
    constant, terms = e
    text = ""
    for coefficient, factors in terms:
        term = " * ".join([str(abs(coefficient))] * (abs(coefficient) != 1) + [names[k] for k in factors])
        text += (f" - {term}" if coefficient < 0 else f" + {term}") if text else (f"-{term}" if coefficient < 0 else term)
    if constant:
        text += f" - {-constant}" if constant < 0 else f" + {constant}"
    return text if _size(e) is not None else f"({text})"


def generalize(texts: list[Text]) -> Template | None:
    """The template of texts of one skeleton (``texts[0]`` the latest; see the module
    docstring), or None where they are equal or a differing integer fits no expression
    of the sizes. Integers of the inputs' declared shapes that differ become sizes, one
    per distinct run of values over the texts; an output's dimension, then an integer
    of the statements, that fits no expression of the sizes so far is a size of its own
    (a Range's length and start: the caller gives them,
    :meth:`~polyfuse.runtime.kernel.Kernel.specialize_at`)."""
    first = texts[0]
    if any(t.parts != first.parts for t in texts) or all(t.values == first.values for t in texts[1:]):
        return None
    columns = list(zip(*(t.values for t in texts)))
    runs: dict[tuple[int, ...], int] = {}
    for k, column in enumerate(columns):
        if k < first.declared and len(set(column)) > 1:
            runs.setdefault(column, len(runs))
    declared = len(runs)
    for part in (range(first.declared, first.signed), range(first.signed, len(columns))):
        known = [[run[t] for run in runs] for t in range(len(texts))]
        for k in part:
            column = columns[k]
            if len(set(column)) > 1 and column not in runs and fit(list(column), known) is None:
                runs[column] = len(runs)
    rows = [[run[t] for run in runs] for t in range(len(texts))]
    slots: list[Expression | None] = []
    for k, column in enumerate(columns):
        if len(set(column)) == 1:
            slots.append(None)
        elif column in runs:
            slots.append(size(runs[column]))
        else:   # (a derived size: of the inputs' where the signature has it)
            e = fit(list(column), [r[:declared] for r in rows] if k < first.signed else rows)
            if e is None or isinstance(e, int):
                return None
            slots.append(e)
    source = "".join(first.parts)
    names = tuple(_fresh(f"S{k}", source) for k in range(len(runs)))
    pieces = [first.parts[0]]
    for slot, value, part in zip(slots, first.values, first.parts[1:]):
        pieces.append(str(value) if slot is None else _written(slot, names))
        pieces.append(part)
    return Template(first.parts, first.values, tuple(slots), names, "".join(pieces))


def _fresh(name: str, source: str) -> str:
    while re.search(rf"\b{name}\b", source):
        name += "_"
    return name


def _pointwise(d: Definition) -> bool:
    """Whether ``d`` reduces over nothing and reads each element at its own indices, each
    index shifted by sizes at most, or at an index a tensor holds (elementwise chains,
    copies into a concatenation, an embedding's rows): the kernels a symbolic compile
    serves as well as specialized ones. A strided read (a Winograd transform's
    ``X(4 * t + k)``) is left to kernels of its own sizes: GoogLeNet's, symbolic, ran
    10-27x slower."""
    def terms(e: Expr) -> list[Expr]:   # (an index a tensor holds is one term)
        return [e] if isinstance(e, Read) else [e, *(t for c in children(e) for t in terms(c))]

    def shifted(e: Expr) -> bool:
        return sum(isinstance(n, IndexVar) for n in terms(e)) <= 1 and not any(
            isinstance(n, Binary) and n.op is not BinaryOp.ADD and n.op is not BinaryOp.SUB
            and any(isinstance(m, IndexVar) for m in terms(n)) for n in terms(e))
    return not any(st.reduction_indices for st in d.statements) and all(
        shifted(i) for st in d.statements for r in walk(st.rhs) if isinstance(r, Read) for i in r.indices)


@dataclass(frozen=True)
class Generalized:
    """A text's template and the sizes at which it is that text."""

    template: Template
    sizes: dict[str, int]


@dataclass(frozen=True)
class Generic:
    """A plan step's kernel compiled for symbolic sizes (a
    :class:`~polyfuse.runtime.kernel.Kernel`) and the template whose text it compiles."""

    template: Template
    kernel: Any


class Generalizer:
    """A model's texts of earlier plans, and the templates made from them (see the
    module docstring). ``find`` is called for each kernel text of a plan, from the
    threads compiling the plan's kernels; ``remember`` after the plan is compiled.
    ``definition`` parses a template's text (the planner's, :class:`~polyfuse.ir.plan.Planner`)."""

    def __init__(self, definition: Callable[[str, tuple[str, ...]], Definition]) -> None:
        self._definition = definition
        self._texts: dict[tuple[str, ...], list[Text]] = {}
        self._labels: dict[tuple[tuple[str, ...], tuple[int, ...]], set[str]] = {}   # each text's steps
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

    def find(self, source: str, label: str = "") -> Generalized | None:
        """A template ``source`` (the text of step ``label``) matches: a known one, else one
        made from the nearest text of an earlier plan (of the same step, where an earlier
        plan has it); None where there is none, where the step had only this very text in
        earlier plans at other sizes (its sizes are the weights', which a template made
        with another step's text would leave unknown: unpacked), where TC refuses the template's text, or where
        a size would be 0 (kernels for symbolic sizes take sizes from 1): the text is
        compiled as it is."""
        text = Text.of(source)
        with self._lock:
            for known in self._templates.get(text.parts, ()):
                sizes = known.match(text)
                if sizes is not None and min(sizes.values()) >= 1:   # (a size of 0 compiles as it is)
                    return Generalized(known, sizes)
            earlier = [t for t in self._texts.get(text.parts, ()) if t.values != text.values]
            # the same step's texts in earlier plans, where there are some
            mine = [t for t in earlier if label in self._labels.get((text.parts, t.values), ())]
            if not mine and label and label in self._labels.get((text.parts, text.values), ()):
                return None   # the step had only this very text at other sizes: none changes it
            earlier = mine or earlier
            if not earlier:
                return None
            # the nearest text (fewest integers differing), with every other that differs
            # from this one only where it does (more samples: the fits are checks), else
            # the nearest alone
            nearest = min(earlier, key=lambda t: sum(a != b for a, b in zip(t.values, text.values)))
            same = [k for k, (a, b) in enumerate(zip(nearest.values, text.values)) if a == b]
            alike = [t for t in reversed(earlier) if t is not nearest and all(t.values[k] == text.values[k] for k in same)]
            template = generalize([text, nearest, *alike]) if alike else None
            template = template or generalize([text, nearest])
            if template is None:
                return None
            definition = self._parsed(template)
            if definition is None:
                return None
            self._definitions[template.source] = definition
            sizes = template.match(text)
            assert sizes is not None, "a template matches the texts it was made from"
            self._templates.setdefault(text.parts, []).append(template)
            return Generalized(template, sizes) if min(sizes.values()) >= 1 else None

    def _parsed(self, template: Template) -> Definition | None:
        """The template's text parsed, or None where TC refuses it (a size where TC
        takes none, an int size in a float context: its texts are compiled as they are)."""
        try:
            return self._definition(template.source, template.names)
        except FrontendError:
            return None

    def alike(self, sources: Iterable[str]) -> None:
        """Templates for the texts of a model's first plan that differ only in sizes,
        where :data:`ALIKE_IN_PLAN` or more of them share a skeleton and reduce over
        nothing (see the module docstring): ``find`` then gives each of them the
        template, so they share one kernel compiled for symbolic sizes instead of one
        compile each. Only before any text is remembered: a template of one plan's texts
        keeps what they share (a sequence length) constant, where later plans' texts
        (or the probes of a compile ahead) change it, and would stand in the way of the
        templates made across plans."""
        with self._lock:
            if self._texts:   # plans seen, or probes of shapes to come: sizes change across plans
                return
        groups: dict[tuple[str, ...], list[Text]] = {}
        for source in sources:
            text = Text.of(source)
            group = groups.setdefault(text.parts, [])
            if text not in group:
                group.append(text)
        for parts, texts in groups.items():
            if len(texts) < ALIKE_IN_PLAN:
                continue
            template = generalize(texts)
            if template is None or any(template.match(t) is None for t in texts):
                continue
            definition = self._parsed(template)
            if definition is None or not _pointwise(definition):
                continue
            with self._lock:
                self._definitions[template.source] = definition
                self._templates.setdefault(parts, []).append(template)

    def remember(self, sources: Iterable[str], labels: Iterable[str] | None = None) -> None:
        """The kernel texts of a plan compiled (what later plans' texts are compared with),
        and the labels of their steps."""
        with self._lock:
            for source, label in zip(sources, labels if labels is not None else repeat("")):
                text = Text.of(source)
                texts = self._texts.setdefault(text.parts, [])
                self._labels.setdefault((text.parts, text.values), set()).add(label)
                if text not in texts:
                    texts.append(text)
                    for dropped in texts[:-TEXTS_PER_SKELETON]:
                        self._labels.pop((text.parts, dropped.values), None)
                    del texts[:-TEXTS_PER_SKELETON]
