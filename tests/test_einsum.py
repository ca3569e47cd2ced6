"""polyfuse.einsum against numpy.einsum."""

import numpy as np
import pytest

import polyfuse as pf

pytestmark = pytest.mark.unit

CASES = [
    ("mk,kn->mn", [(5, 4), (4, 3)]),
    ("mk,kn", [(5, 4), (4, 3)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("ii->i", [(4, 4)]),
    ("i,i->", [(6,), (6,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("abcd,cdbe->ae", [(2, 3, 4, 5), (4, 5, 3, 2)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,jk", [(2, 2, 3, 4), (4, 5)]),
    ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),
]


@pytest.mark.parametrize("subscripts,shapes", CASES, ids=[c[0] for c in CASES])
def test_einsum_matches_numpy(subscripts, shapes):
    rng = np.random.default_rng(0)
    ops = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    got = pf.einsum(subscripts, *ops)
    want = np.einsum(subscripts, *ops)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_einsum_integer_operands_keep_their_type():
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    got = pf.einsum("ij->i", a)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, a.sum(1))


@pytest.mark.parametrize("subscripts,shapes,message", [
    ("ij,jk->ik", [(3, 4)], "2 operands"),
    ("ijk->i", [(3, 4)], "rank 2"),
    ("ij->iz", [(3, 4)], "'z' appears in no operand"),
    ("ij->ii", [(3, 4)], "appears twice"),
    ("i$->i", [(3, 4)], "invalid character"),
])
def test_einsum_bad_subscripts(subscripts, shapes, message):
    ops = [np.zeros(s, np.float32) for s in shapes]
    with pytest.raises(pf.ArgumentError, match=message):
        pf.einsum(subscripts, *ops)


def test_einsum_size_mismatch_names_both_values():
    with pytest.raises(pf.ShapeError, match="3.*4|4.*3"):
        pf.einsum("ij,jk->ik", np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32))
