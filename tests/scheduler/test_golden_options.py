"""The golden corpus of the CPU heuristics: the options ``default_options`` chooses for
about 800 kernel shapes on each of four machine models (an AVX-512 server with AMX, an AVX2
desktop with a small L2, an AVX2 server core, a NEON server core), compared with the
files under ``tests/scheduler/golden/``, one line per case. A change to the heuristics
or the machine models that moves a choice fails here; when it is meant, regenerate the
files and review their diff with the change:

    POLYFUSE_UPDATE_GOLDEN=1 python -m pytest tests/scheduler/test_golden_options.py

The cases: products in the three layouts (``A·B``, ``A·Bᵀ``, ``Aᵀ·B``) and batched,
channels-last convolutions (3x3, strided, 1x1, depthwise), row sums and global pools,
over sizes that CNNs and transformers use and some that divide no tile.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import fields
from pathlib import Path

import pytest

from polyfuse.frontends.tc import parse
from polyfuse.ir.machine import MACHINES
from polyfuse.scheduler.heuristics import default_options
from polyfuse.scheduler.options import MappingOptions

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).parent / "golden"
MODELS = ("sapphirerapids", "haswell", "znver3", "neoverse-n1")

KERNELS = {
    "mm": "def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
    "mt": "def f(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }",
    "tm": "def f(float(K,M) A, float(K,N) B) -> (C) { C(m,n) +=! A(k,m) * B(k,n) }",
    "bmm": "def f(float(G,M,K) A, float(G,K,N) B) -> (C) { C(g,m,n) +=! A(g,m,k) * B(g,k,n) }",
    "conv": "def f(float(N,H,W,C) P, float(C,KH,KW,M) Wt) -> (O) "
            "{ O(n,h,w,m) +=! P(n,h+kh,w+kw,c) * Wt(c,kh,kw,m) where h in 0:H-KH+1, w in 0:W-KW+1 }",
    "conv_s2": "def f(float(N,H,W,C) P, float(C,KH,KW,M) Wt) -> (O) "
               "{ O(n,h,w,m) +=! P(n,2*h+kh,2*w+kw,c) * Wt(c,kh,kw,m) "
               "where h in 0:(H-KH)/2+1, w in 0:(W-KW)/2+1 }",
    "depthwise": "def f(float(N,H,W,C) P, float(KH,KW,C) Wt) -> (O) "
                 "{ O(n,h,w,c) +=! P(n,h+kh,w+kw,c) * Wt(kh,kw,c) where h in 0:H-KH+1, w in 0:W-KW+1 }",
    "rowsum": "def f(float(N,D) X) -> (S) { S(n) +=! X(n,d) }",
    "pool": "def f(float(N,H,W,C) X) -> (S) { S(n,c) +=! X(n,h,w,c) }",
}

ROWS = (1, 49, 128, 197, 1024, 3136)
DEPTHS = (3, 64, 256, 768, 3072)
COLS = (8, 40, 64, 256, 1000, 3072)


def cases() -> list[tuple[str, dict[str, int]]]:
    found: list[tuple[str, dict[str, int]]] = []
    for kind in ("mm", "mt", "tm"):
        found += [(kind, {"M": m, "K": k, "N": n}) for m, k, n in itertools.product(ROWS, DEPTHS, COLS)]
    found += [("bmm", {"G": g, "M": m, "K": k, "N": n})
              for g, m, k, n in itertools.product((2, 12), (64, 197), (64, 197), (64, 197))]
    for kind, kernel in (("conv", 3), ("conv_s2", 3), ("depthwise", 3), ("conv", 1)):
        for size, channels, out in itertools.product((7, 14, 28, 56), (16, 64, 256, 512), (16, 96, 256)):
            if kind == "depthwise":
                if out != 16:
                    continue
                sizes = {"N": 1, "H": size + 2, "W": size + 2, "C": channels, "KH": 3, "KW": 3}
            else:
                sizes = {"N": 1, "H": size + kernel - 1, "W": size + kernel - 1, "C": channels,
                         "KH": kernel, "KW": kernel, "M": out}
            found.append((kind, sizes))
    found += [("rowsum", {"N": n, "D": d}) for n, d in itertools.product(ROWS, COLS)]
    found += [("pool", {"N": n, "H": s, "W": s, "C": c})
              for n, s, c in itertools.product((1, 8), (7, 14), (64, 512, 1280))]
    return found


def describe(options: MappingOptions) -> str:
    """The options that differ from the defaults, as ``name=value`` words."""
    default = MappingOptions()
    return " ".join(f"{f.name}={getattr(options, f.name)}" for f in fields(options)
                    if getattr(options, f.name) != getattr(default, f.name)).replace("Fusion.", "")


def corpus(model: str) -> str:
    definitions = {kind: parse(src).definitions[0] for kind, src in KERNELS.items()}
    lines = []
    for kind, sizes in cases():
        named = " ".join(f"{k}={v}" for k, v in sizes.items())
        lines.append(f"{kind} {named}: {describe(default_options(definitions[kind], sizes, MACHINES[model]))}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("model", MODELS)
def test_the_heuristics_choose_what_the_golden_corpus_holds(model):
    path = GOLDEN / f"{model}.txt"
    made = corpus(model)
    if os.environ.get("POLYFUSE_UPDATE_GOLDEN"):
        path.write_text(made)
    held = path.read_text().splitlines()
    moved = [(old, new) for old, new in zip(held, made.splitlines()) if old != new]
    assert len(held) == len(made.splitlines()) == len(cases()), \
        "the corpus's cases changed: regenerate it (see the module docstring)"
    assert not moved, (f"{len(moved)} of {len(held)} choices on {MACHINES[model]} moved, e.g.\n"
                       f"  was: {moved[0][0]}\n  now: {moved[0][1]}\n"
                       "regenerate tests/scheduler/golden/ if the change is meant (module docstring)")


def test_the_machine_models_choose_differently_where_they_differ():
    """The corpus is not one machine's choices four times: vector widths and register
    files move some (the cache sizes decide nothing yet: haswell and znver3, alike but
    for their L2, choose alike)."""
    texts = {m: (GOLDEN / f"{m}.txt").read_text() for m in MODELS}
    assert len({texts["sapphirerapids"], texts["znver3"], texts["neoverse-n1"]}) == 3
    assert texts["haswell"] == texts["znver3"]
