"""Accesses outside a tensor: refused for the sizes of a call, or checked when they run.

Range inference does not bound ``i + j`` below: its indices get their ranges from the
other dimensions. polyfuse proves every access with isl once the sizes are known.
"""

import numpy as np

import polyfuse as pf

mod = pf.define("""
def diag(float(N, NM, M) I) -> (O) { O(i, j) = I(i, i + j, j) }
def pick(float(N) X, float(N) C) -> (O) { O(i) = C(i) > 0.0 ? X(i + 2) : -1.0 where i in 0:N }
""", target="host")

total = mod.diag(np.ones((4, 7, 4), np.float32)).sum()   # in bounds: 16.0
print(total)
assert total == 16.0
try:
    mod.diag(np.ones((30, 1, 30), np.float32))           # i + j reaches 58 in a dimension of 1
except pf.AccessRangeError as e:
    print(e)
else:
    raise AssertionError("an access outside the tensor was not refused")

X = np.arange(5, dtype=np.float32)
picked = mod.pick(X, np.array([1, 0, 1, 0, 0], np.float32))  # the condition keeps X(i + 2) inside
print(picked)
np.testing.assert_array_equal(picked, [2, -1, 4, -1, -1])
try:
    mod.pick(X, np.ones(5, np.float32))                   # X(5) at i = 3: checked when it runs
except pf.BoundsError as e:
    print(e)
else:
    raise AssertionError("a read outside X was not caught")
