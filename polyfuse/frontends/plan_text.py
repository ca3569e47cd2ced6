"""The plan IR's text form read back: ``str(parse_plan(str(plan))) == str(plan)``.

Grammar (white space, new lines included, only separates tokens; a LABEL is ``//`` and
the rest of its line, the step's label after one space)::

    plan   := 'plan' GROUP '(' [buffer (',' buffer)*] ')' '->' '(' [output (',' output)*] ')' '{'
              'arena' INT 'bytes' '(' 'naive' INT ')'
              ['specialized' 'to' 'the' 'values' 'of' VALUE (',' VALUE)*]
              ('const' buffer)* step* '}' kernel*
    buffer := VALUE ':' type ['@arena' '+' INT]     # type as in graph text, its dimensions INTs
    output := buffer ('out' | 'inout' | 'const')
    step   := buffer '=' 'view' VALUE ['+' INT] LABEL
            | '(' [buffer (',' buffer)*] ')' ['temp' '(' buffer (',' buffer)* ')']
              '=' NAME '(' [VALUE (',' VALUE)*] ')' LABEL
            | 'loop' '(' [buffer '=' VALUE (',' buffer '=' VALUE)*] ')' ['trip' VALUE] ['cond' VALUE]
              'counter' buffer 'condition' buffer '{' LABEL step*
              'next' VALUE 'carry' '(' [VALUE (',' VALUE)*] ')'
              ['scan' '(' VALUE '->' buffer (',' VALUE '->' buffer)* ')'] '}'
            | '(' [buffer (',' buffer)*] ')' '=' 'if' VALUE '{' LABEL block '}' 'else' '{' block '}'
    block  := step* 'yield' '(' [VALUE (',' VALUE)*] ')'
    kernel := '//' LABEL NEWLINE TC                  # a TC definition, per kernel step in order

What the text does not print is filled in so:

* a buffer's type is where it is declared (``%h: float32[2, 8]``: the header, a ``const``
  line, the step defining it); a buffer may be declared again alike, and every buffer
  read must be declared somewhere;
* each kernel step's definition is the TC after the ``// label`` line of the same label
  (kernel steps and definitions pair in program order, as ``str`` prints them), and its
  ``source`` that TC as written;
* constants take their arrays from ``constants`` by name, of the type printed; those it
  lacks are zeros of their type;
* the memory plan is the text's: each ``@arena+N`` offset, the arena's size and the naive
  bytes as printed; only the views' roots and starts are computed (as ``plan_memory``
  does). Which buffers the arena holds follows from the steps (what they allocate, but
  graph outputs and the values they view): each of them needs an offset, and no other
  buffer may have one. So a test of the memory planner is a text and
  ``plan_memory(p.steps, p.types, set(p.outputs)) == p.memory``; a bad placement parses,
  and ``p.verify()`` refuses it.

A plan is not verified here: call :meth:`Plan.verify`. A plan's tail (``then at run
time: ...``) is refused: its text does not hold the nodes it runs.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from polyfuse.errors import FrontendError, GraphSyntaxError, PolyfuseError, SourceLocation, WeightError
from polyfuse.frontends.graph_text import _STRING, _Parser, _Token, _tokenize
from polyfuse.frontends.tc import parse_definition
from polyfuse.ir.comprehension import Definition
from polyfuse.ir.graph import NAME_PATTERN, PREFIXED_NAME_PATTERN, TensorType
from polyfuse.ir.limits import MAX_NEST_DEPTH
from polyfuse.ir.plan import MemoryPlan, Plan, plan_memory
from polyfuse.ir.steps import Block, BranchStep, KernelStep, LoopStep, Step, ViewStep, view_roots
from polyfuse.ir.types import DType, aligned_array

_TOKEN = re.compile(
    r"(?P<space>\s+)"
    r"|(?P<label>//[^\n]*)"
    rf"|(?P<string>{_STRING})"
    r"|(?P<int>-?\d+)"
    rf"|(?P<value>%(?:{PREFIXED_NAME_PATTERN}|{_STRING}))"
    rf"|(?P<group>@(?:{PREFIXED_NAME_PATTERN}|{_STRING}))"
    rf"|(?P<name>{NAME_PATTERN})"
    r"|(?P<punct>->|[()\[\]{},=:+])"
    r"|(?P<other>.)")   # the kernels' TC after the plan, or a character out of place
_ROLES = ("out", "inout", "const")


def parse_plan(text: str, constants: Mapping[str, np.ndarray] | None = None, *,
               filename: str = "<plan>") -> Plan:
    """The Plan that ``text`` (as ``str(plan)`` prints it) describes; ``constants``: the
    arrays of its constants by name (zeros for those it lacks; see the module docstring
    for what else is filled in).

    Raises GraphSyntaxError at the first token that does not fit, or where the text
    contradicts itself (a buffer declared twice unlike, a role or arena offset the plan
    cannot have); the TC front end's errors at their line of ``text``; WeightError for a
    constant's array of another type.
    """
    return _PlanParser(text, filename).plan(dict(constants or {}))


@dataclass(frozen=True)
class _Definition:
    """A kernel's TC after the plan, under its ``// label`` line at ``loc``."""

    label: str
    definition: Definition
    source: str
    loc: SourceLocation


@dataclass(frozen=True)
class _Declared:
    type: TensorType
    offset: int | None   # in the arena
    tok: _Token          # where first declared


def _label(text: str) -> str:
    return text[3:] if text.startswith("// ") else text[2:]


def _plan_end(tokens: list[_Token]) -> int:
    """The index of the '}' closing the plan (the first to balance the braces before it),
    or of the eof token."""
    depth = 0
    for k, tok in enumerate(tokens):
        if tok.kind == "punct" and tok.text in "{}":
            depth += 1 if tok.text == "{" else -1
            if depth == 0 and tok.text == "}":
                return k
    return len(tokens) - 1


class _PlanParser(_Parser):
    def __init__(self, text: str, filename: str) -> None:   # graph_text's parser, on the plan's tokens
        tokens = _tokenize(text, filename, _TOKEN)
        end = _plan_end(tokens)
        self.text, self.weights, self.filename = text, {}, filename
        self.tokens = tokens[:end + 1] + [_Token("eof", "", tokens[min(end + 1, len(tokens) - 1)].loc)]
        self.close = tokens[end].loc if end < len(tokens) - 1 else None   # the plan's '}'
        self.pos = 0
        self.lists = 0
        self.declared: dict[str, _Declared] = {}
        self.used: dict[str, _Token] = {}    # each buffer read, where first read
        self.definitions: deque[_Definition] = deque()

    def error_at(self, loc: SourceLocation, message: str, cls: type[FrontendError] = GraphSyntaxError,
                 hint: str | None = None) -> FrontendError:
        return cls(message, loc, self.text, hint=hint, filename=self.filename)

    def accept(self, text: str) -> bool:
        """Take the next token if it is ``text``."""
        found = self.at(text)
        if found:
            self.advance()
        return found

    # --- the plan ---
    def plan(self, given: dict[str, np.ndarray]) -> Plan:
        self.expect("plan")
        name = self.prefixed("group", "the plan's @name")
        self.expect("(")
        inputs = tuple(self.comma_list(")", self.buffer))
        self.expect("->")
        self.expect("(")
        outputs: list[tuple[str, _Token]] = self.comma_list(")", self.output)
        self.expect("{")
        arena, naive = self.arena()
        specialized: list[str] = []
        if self.accept("specialized"):
            for word in ("to", "the", "values", "of"):
                self.expect(word)
            specialized.append(self.use())
            while self.accept(","):
                specialized.append(self.use())
        consts = []
        while self.accept("const"):
            consts.append(self.buffer())
        steps = self.body()
        types = {v: d.type for v, d in self.declared.items()}
        roots, starts = view_roots(steps, {v: t.dtype.bits // 8 for v, t in types.items()})
        memory = MemoryPlan({v: d.offset for v, d in self.declared.items() if d.offset is not None},
                            arena, naive, roots, starts)
        plan = Plan(name, inputs, tuple(v for v, _ in outputs), types, self.constants(consts, given),
                    steps, memory, None, tuple(specialized))
        self.check_arena(plan)
        for value, role in outputs:
            if plan.roles[value].value != role.text:
                raise self.error(f"output '{value}' is marked {role.text}; in this plan it is "
                                 f"{plan.roles[value].value}", role,
                                 hint="inout: an output that is an input or a view of one; "
                                      "const: a constant; out: any other")
        return plan

    def arena(self) -> tuple[int, int]:
        self.expect("arena")
        size = self.count("the arena's size in bytes")
        self.expect("bytes")
        self.expect("(")
        self.expect("naive")
        naive = self.count("the naive bytes")
        self.expect(")")
        return size, naive

    def body(self) -> tuple[Step, ...]:
        """The steps to the plan's '}', each kernel step with its definition after it."""
        build = self.steps(("}", "then"), 0)
        if self.at("then"):
            raise self.error("a plan's tail (what it leaves to run time) cannot be read back: its text "
                             "does not hold the nodes it runs",
                             hint="the text of a plan with a tail is for reading; plan_graph makes such plans")
        self.expect("}")
        for value, tok in self.used.items():
            if value not in self.declared:
                raise self.error(f"'{value}' has no type: no declaration ('%name: type') in the text gives one", tok)
        self.definitions.extend(self.kernel_definitions())
        steps = tuple(make() for make in build)
        if self.definitions:
            extra = self.definitions[0]
            raise self.error_at(extra.loc, f"'// {extra.label}' defines a kernel no kernel step is left to call")
        return steps

    def count(self, what: str) -> int:
        tok = self.take("int", what)
        if tok.text.startswith("-"):
            raise self.error(f"expected {what}, found {tok.describe()}", tok)
        return int(tok.text)

    def buffer(self) -> str:
        """A buffer's declaration: its name, type and offset in the arena."""
        tok = self.tok
        value = self.value_name()
        self.expect(":")
        t = self.type()
        if not t.is_static:
            raise self.error(f"buffer '{value}' is {t}: a plan's dimensions are integers", tok)
        offset = None
        if self.tok.kind == "group" and self.tok.text == "@arena":
            self.advance()
            self.expect("+")
            offset = self.count("a byte offset into the arena")
        seen = self.declared.setdefault(value, _Declared(t, offset, tok))
        if (seen.type, seen.offset) != (t, offset):
            def described(t: TensorType, offset: int | None) -> str:
                return f"{t}" + ("" if offset is None else f" @arena+{offset}")
            raise self.error(f"'{value}' is declared {described(t, offset)} here and "
                             f"{described(seen.type, seen.offset)} on line {seen.tok.loc.line}", tok)
        return value

    def use(self) -> str:
        """A buffer read by name."""
        tok = self.tok
        value = self.value_name()
        self.used.setdefault(value, tok)
        return value

    def uses(self) -> tuple[str, ...]:
        self.expect("(")
        return tuple(self.comma_list(")", self.use))

    def output(self) -> tuple[str, _Token]:
        value = self.buffer()
        role = self.take("name", "the output's role (out, inout or const)")
        if role.text not in _ROLES:
            raise self.error(f"expected the output's role (out, inout or const), found {role.describe()}", role)
        return value, role

    def label(self) -> str:
        return _label(self.take("label", "'//' and the step's label").text)

    # --- steps: each parsed to a function making it once the kernels' definitions are read ---
    def steps(self, ends: tuple[str, ...], depth: int) -> list[Callable[[], Step]]:
        if depth > MAX_NEST_DEPTH:
            raise self.error(f"loops and ifs are nested more than {MAX_NEST_DEPTH} deep")
        found = []
        while not any(self.at(end) for end in ends) and self.tok.kind != "eof":
            found.append(self.step(depth))
        return found

    def step(self, depth: int) -> Callable[[], Step]:
        if self.tok.kind == "value":
            return self.view()
        if self.at("loop"):
            return self.loop(depth)
        if not self.at("("):
            raise self.error(f"expected a step (a kernel call, a view, a loop or an if), found {self.tok.describe()}")
        self.advance()
        outputs = tuple(self.comma_list(")", self.buffer))
        temps: tuple[str, ...] = ()
        if self.accept("temp"):
            self.expect("(")
            temps = tuple(self.comma_list(")", self.buffer))
        self.expect("=")
        if self.at("if") and self.tokens[self.pos + 1].kind == "value":
            if temps:
                raise self.error("an if step has no temporaries")
            return self.branch(outputs, depth)
        return self.kernel(outputs, temps)

    def view(self) -> Callable[[], Step]:
        output = self.buffer()
        self.expect("=")
        self.expect("view")
        source = self.use()
        offset = self.count("the view's offset in elements") if self.accept("+") else 0
        st = ViewStep(self.label(), source, output, tuple(int(d) for d in self.declared[output].type.shape), offset)
        return lambda: st

    def kernel(self, outputs: tuple[str, ...], temps: tuple[str, ...]) -> Callable[[], Step]:
        name_tok = self.tok
        name = self.name("a kernel's definition name")
        inputs = self.uses()
        label_tok = self.tok
        label = self.label()

        def make() -> Step:
            if not self.definitions:
                raise self.error(f"kernel step '{label}' has no definition: no '// {label}' and its TC "
                                 "follow the plan", label_tok)
            d = self.definitions.popleft()
            if d.label != label:
                raise self.error(f"kernel step '{label}' needs the definition after '// {label}'; the next "
                                 f"one after the plan is '// {d.label}' (line {d.loc.line})", label_tok)
            if d.definition.name != name:
                raise self.error(f"kernel step '{label}' calls '{name}'; the definition after '// {label}' "
                                 f"(line {d.loc.line}) is '{d.definition.name}'", name_tok)
            return KernelStep(label, d.definition, d.source, inputs, outputs, temps)
        return make

    def loop(self, depth: int) -> Callable[[], Step]:
        self.expect("loop")
        self.expect("(")
        pairs: list[tuple[str, str]] = self.comma_list(")", self.carried)
        trip = self.use() if self.accept("trip") else ""
        cond = self.use() if self.accept("cond") else ""
        self.expect("counter")
        counter = self.buffer()
        self.expect("condition")
        going = self.buffer()
        self.expect("{")
        label = self.label()
        body = self.steps(("next",), depth + 1)
        self.expect("next")
        next_cond = self.use()
        carry = self.expect("carry")
        results = self.uses()
        if len(results) != len(pairs):
            raise self.error(f"'carry' names {len(results)} values; the loop carries {len(pairs)}", carry)
        scans: list[tuple[str, str]] = []
        if self.accept("scan"):
            self.expect("(")
            scans = self.comma_list(")", self.scan)
        self.expect("}")
        return lambda: LoopStep(label, trip, cond, tuple(i for _, i in pairs), counter, going,
                                tuple(c for c, _ in pairs),
                                Block(tuple(make() for make in body), (next_cond, *results, *(v for v, _ in scans))),
                                tuple(b for _, b in scans))

    def carried(self) -> tuple[str, str]:
        value = self.buffer()
        self.expect("=")
        return value, self.use()

    def scan(self) -> tuple[str, str]:
        value = self.use()
        self.expect("->")
        return value, self.buffer()

    def branch(self, outputs: tuple[str, ...], depth: int) -> Callable[[], Step]:
        self.expect("if")
        cond = self.use()
        self.expect("{")
        label = self.label()
        then = self.block(depth)
        self.expect("}")
        self.expect("else")
        self.expect("{")
        other = self.block(depth)
        self.expect("}")
        return lambda: BranchStep(label, cond, outputs, then(), other())

    def block(self, depth: int) -> Callable[[], Block]:
        steps = self.steps(("yield",), depth + 1)
        self.expect("yield")
        results = self.uses()
        return lambda: Block(tuple(make() for make in steps), results)

    # --- what follows the steps ---
    def kernel_definitions(self) -> list[_Definition]:
        """Each ``// label`` line after the plan's '}' and the TC under it."""
        if self.close is None:
            return []
        lines = self.text.split("\n")
        after = lines[self.close.line - 1][self.close.col:]
        if after.strip():
            raise self.error_at(SourceLocation(self.close.line, self.close.col + 1 + len(after) - len(after.lstrip())),
                                "expected nothing after the plan's '}' on its line")
        blocks: list[tuple[int, list[str]]] = []    # the line of each '// label', the lines under it
        for number, line in enumerate(lines[self.close.line:], self.close.line + 1):
            if line.startswith("//"):
                blocks.append((number, []))
            elif blocks:
                blocks[-1][1].append(line)
            elif line.strip():
                raise self.error_at(SourceLocation(number, 1 + len(line) - len(line.lstrip()), len(line.strip())),
                                    "expected a kernel's definition after a '// label' line")
        return [self.kernel_definition(number, lines[number - 1], body) for number, body in blocks]

    def kernel_definition(self, number: int, label_line: str, body: list[str]) -> _Definition:
        label, loc = _label(label_line), SourceLocation(number, 1, len(label_line))
        source = "\n".join(body).rstrip()
        if not source.strip():
            raise self.error_at(loc, f"'// {label}' is followed by no definition")
        try:
            d = parse_definition(source)
        except FrontendError as err:   # at its line of the plan's text
            at = loc if err.loc is None else SourceLocation(err.loc.line + number, err.loc.col, err.loc.length)
            raise self.error_at(at, err.message, type(err), err.hint) from None
        except PolyfuseError as err:
            raise self.error_at(loc, f"the definition after '// {label}' is not valid: {err}") from None
        return _Definition(label, d, source, loc)

    def constants(self, names: list[str], given: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise WeightError(f"arrays given for {unknown}, which the text declares no 'const' line for",
                              filename=self.filename)
        arrays = {}
        for value in names:
            t, shape = self.declared[value].type, tuple(int(d) for d in self.declared[value].type.shape)
            array = np.asarray(given[value]) if value in given else np.zeros(shape, t.dtype.numpy)
            dtype = DType.from_numpy(array.dtype)
            if dtype is not t.dtype or array.shape != shape:
                found = f"{dtype}{list(array.shape)}" if dtype else f"numpy {array.dtype} {list(array.shape)}"
                raise self.error(f"constant '{value}' is {t}; the array given for it is {found}",
                                 self.declared[value].tok, WeightError)
            arrays[value] = aligned_array(array)
        return arrays

    def check_arena(self, plan: Plan) -> None:
        """The buffers the arena holds (see the module docstring) have offsets, no others."""
        placed = plan_memory(plan.steps, plan.types, set(plan.outputs)).offsets
        for value, d in self.declared.items():
            if value in placed and d.offset is None:
                raise self.error(f"'{value}' is in the arena, but is declared with no '@arena+N' offset", d.tok)
            if value not in placed and d.offset is not None:
                raise self.error(f"'{value}' is declared at '@arena+{d.offset}', but is not in the arena (which "
                                 "holds what steps allocate, but graph outputs and the values they view)", d.tok)
