"""Malformed and random TC: token-level mutations of the canonical programs and of
random programs, random sizes and arguments (some of them wrong), for the fuzzer.

A case is TC text plus a seed for its arguments. It runs on the reference interpreter
and on a native target; the property is "the native target returns the reference's
answer, or one of them raises a polyfuse error" (a refusal by the reference must be a
refusal by the native target too)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import polyfuse as pf
from polyfuse.errors import PolyfuseError
from polyfuse.frontends.tc import parse
from polyfuse.frontends.tc.lexer import Kind, tokenize
from polyfuse.ir.comprehension import ScalarDecl
from polyfuse.ir.symbolic import evaluate_int
from polyfuse.ir.types import DType

from tests.fuzz.outcomes import Tally, judge, outcome_of
from tests.tc_programs import PROGRAMS
from tests.tc_random import programs as random_programs

VOCABULARY = ["(", ")", ",", "+", "-", "*", "/", "%", "?", ":", "<", "<=", "==", "!=", "&&", "||",
              "!", "=", "+=", "+=!", "max=!", "min=", "*=!", "->", "{", "}", "where", "in",
              "exists", "def", "<=>", "float", "double", "int32", "int64", "uint8", "bool",
              "float16", "bfloat16", "exp", "tanh", "fmax", "min", "sqrt", "log", "i", "j", "k",
              "N", "M", "K", "A", "O", "0", "1", "-1", "2", "7", "0.5", "1e38", "1e-45",
              "2147483647", "2147483648", "4294967296", "18446744073709551616",
              "99999999999999999999999", "@", "$", "\n", "#"]

_DTYPES = {DType.FLOAT16: np.float16, DType.FLOAT32: np.float32, DType.FLOAT64: np.float64,
           DType.INT8: np.int8, DType.INT16: np.int16, DType.INT32: np.int32, DType.INT64: np.int64,
           DType.UINT8: np.uint8, DType.UINT16: np.uint16, DType.UINT32: np.uint32,
           DType.UINT64: np.uint64, DType.BOOL: np.bool_}


def _join(tokens: list[tuple[int, str]]) -> str:
    """Tokens (line, text) back into text, one source line per line."""
    lines: dict[int, list[str]] = {}
    for line, text in tokens:
        lines.setdefault(line, []).append(text)
    return "\n".join(" ".join(lines[k]) for k in sorted(lines))


def _kind(text: str) -> str:
    return "ident" if text[:1].isalpha() or text[:1] == "_" else "number" if text[:1].isdigit() \
        else "op"


@st.composite
def mutated(draw, source: str) -> str:
    """``source`` with one to three token-level edits: delete, duplicate, swap, replace,
    insert, truncate, or wrap a token in deep nesting."""
    tokens = [(t.loc.line, t.text) for t in tokenize(source) if t.kind is not Kind.EOF]
    for _ in range(draw(st.integers(1, 3))):
        if not tokens:
            break
        at = draw(st.integers(0, len(tokens) - 1))
        line, text = tokens[at]
        edit = draw(st.sampled_from(["delete", "duplicate", "swap", "replace", "insert",
                                     "truncate", "nest", "number", "alike", "alike", "alike",
                                     "alike"]))
        if edit == "delete":
            del tokens[at]
        elif edit == "duplicate":
            tokens.insert(at, (line, text))
        elif edit == "swap" and at + 1 < len(tokens):
            tokens[at], tokens[at + 1] = tokens[at + 1], tokens[at]
        elif edit == "alike":  # a token of the same kind: the text still parses, mostly
            kind = _kind(text)
            tokens[at] = (line, draw(st.sampled_from(
                [t for _, t in tokens if _kind(t) == kind] + [t for t in VOCABULARY if _kind(t) == kind])))
        elif edit == "replace":
            tokens[at] = (line, draw(st.sampled_from(VOCABULARY)))
        elif edit == "insert":
            tokens.insert(at, (line, draw(st.sampled_from(VOCABULARY))))
        elif edit == "truncate":
            tokens = tokens[:at]
        elif edit == "nest":
            depth = draw(st.sampled_from([3, 150, 199, 200, 201, 400, 1200]))
            form = draw(st.sampled_from(["paren", "neg", "exp", "sum", "not"]))
            if form == "paren":
                text = "(" * depth + text + ")" * depth
            elif form == "neg":
                text = "- " * depth + text
            elif form == "exp":
                text = "exp(" * depth + text + ")" * depth
            elif form == "not":
                text = "! " * depth + text
            else:
                text = " + ".join([text] * depth)
            tokens[at] = (line, text)
        elif edit == "number":
            numbers = [i for i, (_, t) in enumerate(tokens) if t[:1].isdigit()]
            if numbers:
                k = draw(st.sampled_from(numbers))
                tokens[k] = (tokens[k][0], draw(st.sampled_from(
                    ["0", "1", "2147483648", "9223372036854775808", "1e39", "0.0", "3"])))
    return _join(tokens)


@st.composite
def cases(draw) -> tuple[str, int]:
    """TC text (mostly a mutated program, sometimes an intact one) and a seed for its
    arguments."""
    base = draw(st.one_of(st.sampled_from([p.source for p in PROGRAMS]), random_programs()))
    source = base if draw(st.integers(0, 9)) == 0 else draw(mutated(base))
    return source, draw(st.integers(0, 2**31 - 1))


def _value(rng: np.random.Generator, dtype: DType, shape: tuple[int, ...]) -> np.ndarray:
    np_type = _DTYPES.get(dtype, np.float32)
    if dtype.is_bool:
        return rng.random(shape) < 0.5
    if dtype.is_int:
        lo = 0 if dtype.is_unsigned else -3
        return rng.integers(lo, 6, size=shape).astype(np_type)
    if dtype is DType.BFLOAT16:
        import ml_dtypes
        return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
    return rng.standard_normal(shape).astype(np_type)


def arguments(source: str, seed: int) -> tuple[str, list] | None:
    """The first definition's name and arguments for it: random sizes 1..4, and now and
    then one wrong argument (shape, dtype, kind, count). None when the text does not
    parse (the case then tests the refusal)."""
    try:
        d = parse(source).definitions[0]
    except Exception:  # noqa: BLE001 - the run of the case records what parsing raised
        return None
    rng = np.random.default_rng(seed)
    sizes = {s: int(rng.integers(1, 5)) for s in d.sizes}
    args: list = []
    for p in d.params:
        if isinstance(p, ScalarDecl):
            args.append(float(rng.standard_normal()) if p.dtype.is_float else int(rng.integers(-2, 4)))
            continue
        shape = []
        for e in p.shape:
            try:
                extent = evaluate_int(e, sizes)
            except PolyfuseError:
                extent = -1
            # a declared extent past 64 (a mutated literal) gets a small array, refused
            shape.append(extent if 0 <= extent <= 64 else int(rng.integers(1, 4)))
        args.append(_value(rng, p.dtype, tuple(shape)))
    if args and rng.random() < 0.15:
        k = int(rng.integers(0, len(args)))
        wrong = int(rng.integers(0, 6))
        a = args[k]
        if wrong == 0:
            args.pop(k)
        elif wrong == 1:
            args.append(np.ones(2, np.float32))
        elif wrong == 2 and isinstance(a, np.ndarray):
            args[k] = a.astype(np.float64 if a.dtype != np.float64 else np.float32)
        elif wrong == 3 and isinstance(a, np.ndarray):
            args[k] = np.ones(a.shape + (2,), a.dtype)
        elif wrong == 4:
            args[k] = "x" if isinstance(a, np.ndarray) else np.ones(3, np.float32)
        else:
            args[k] = np.ones(tuple(s + 1 for s in np.shape(a)), np.asarray(a).dtype)
    return d.name, args


def run_case(case: tuple[str, int], target: str, tally: Tally) -> None:
    """One case: define and call on the reference, then on ``target``."""
    source, seed = case
    label = f"seed={seed}\n{source}"
    call = arguments(source, seed)

    def on(where: str):
        module = pf.define(source, target=where)
        if call is None:
            return None
        name, args = call
        return getattr(module, name)(*args)

    want = outcome_of(lambda: on("reference"))
    if want[0] == "raw":
        return tally.record("raw", "reference: " + label, want[1])
    judge(tally, want, outcome_of(lambda: on(target)), f"{target}: " + label)
