"""A Packing's copy (BLIS's packed panels of a constant operand) against the element-wise
definition: element ``i`` is ``source[offsets + coefs . i]``, or 0 where a padded packing
reads past the source's edge."""

import numpy as np
import pytest

from polyfuse.errors import IRVerificationError
from polyfuse.ir.loops import Packing


def by_element(p: Packing, source: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    out = np.zeros(shape, source.dtype)
    for i in np.ndindex(*shape):
        at = tuple(off + sum(c * k for c, k in zip(row, i)) for off, row in zip(p.offsets, p.coefs))
        if all(0 <= a < n for a, n in zip(at, source.shape)):
            out[i] = source[at]
    return out


@pytest.mark.unit
def test_random_packings_copy_what_the_definition_says():
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(400):
        rank, packed = int(rng.integers(1, 4)), int(rng.integers(1, 5))
        source_shape = tuple(int(n) for n in rng.integers(1, 8, rank))
        shape = tuple(int(n) for n in rng.integers(1, 5, packed))
        coefs = tuple(tuple(int(c) for c in rng.integers(-2, 4, packed) * (rng.random(packed) < 0.6))
                      for _ in range(rank))
        p = Packing("W", tuple(int(o) for o in rng.integers(-2, 7, rank)), coefs, bool(rng.random() < 0.5))
        source = rng.standard_normal(source_shape).astype(np.float32)
        # a transposed source too: the packing reads values, not memory order
        for given in (source, np.asfortranarray(source)):
            if not p.padded and not p.inside(shape, source_shape):
                with pytest.raises(IRVerificationError, match="reads outside its source"):
                    p.apply(given, shape)
                continue
            got = p.apply(given, shape)
            assert got.flags.c_contiguous and got.dtype == source.dtype
            np.testing.assert_array_equal(got, by_element(p, source, shape))
            checked += 1
    assert checked > 300
