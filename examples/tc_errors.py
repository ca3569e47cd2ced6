"""What polyfuse says about bad TC: line:col, the source line and a caret, and a hint."""

import numpy as np

import polyfuse as pf

BAD_PROGRAMS = {
    "typo in a tensor name": """
def mm(float(M, K) A, float(K, N) B) -> (C) {
  C(m, n) +=! A(m, k) * Bt(k, n)
}""",
    "reduction index with '='": """
def rowsum(float(M, N) A) -> (S) {
  S(m) = A(m, n)
}""",
    "range that cannot be inferred": """
def shift(float(N) A) -> (O) {
  O(i) +=! A(i + j)
}""",
}

for title, source in BAD_PROGRAMS.items():
    try:
        pf.define(source)
    except pf.FrontendError as err:
        print(f"--- {title} ({type(err).__name__} at line {err.line}, column {err.col})")
        print(err)
    else:
        raise AssertionError(f"{title}: not refused")

mod = pf.define("def emb(float(V, D) E, int32(B) Idx) -> (O) { O(b, d) = E(Idx(b), d) }")
try:
    mod.emb(np.ones((4, 2), np.float32), np.array([0, 9], np.int32))
except pf.BoundsError as err:
    print("--- a bad embedding index at run time (BoundsError)")
    print(err)
else:
    raise AssertionError("the index 9 into 4 rows was not caught")
