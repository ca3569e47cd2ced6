"""Scalar arguments are checked by value against their parameter's type on every call
(the fast path of repeated calls included), on every target."""

import numpy as np
import pytest

import polyfuse as pf
from tests.arm_tools import AARCH64

TARGETS = ["reference", "host", AARCH64]
X = np.arange(4, dtype=np.int64)


def kernel(dtype: str, target: str):  # noqa: ANN201
    """``Y(i) = s + X(i)`` computed in int64 (or float64 for a float ``s``): the oracle
    is numpy's sum with the value of ``s``."""
    wide = "double" if dtype.startswith("float") else "int64"
    source = f"def f({dtype} s, {wide}(N) X) -> (Y) {{ Y(i) = {wide}(s) + X(i) }}"
    return pf.define(source, target=target).f


def xs(dtype: str) -> np.ndarray:
    return X.astype(np.float64) if dtype.startswith("float") else X


IN_RANGE = [("int32", 2**31 - 1), ("int32", -2**31), ("int32", np.int64(-7)), ("int32", np.uint8(3)),
            ("uint8", 255), ("uint8", np.int64(0)), ("int64", -2**63), ("int64", 2**63 - 1),
            ("uint64", 2**63 + 5), ("int8", np.array(-128)), ("float32", 2**70), ("float32", 1.5),
            ("float32", np.int32(-3)), ("float32", float("inf")), ("float16", 65504.0),
            ("float", 1e300 * 0)]


@pytest.mark.parametrize("target", TARGETS)
def test_scalars_in_range_give_numpys_answer_on_every_call(target):
    for dtype, value in IN_RANGE:
        f = kernel(dtype if dtype != "float" else "float64", target)
        want = np.asarray(value).astype(dtype if dtype != "float" else "float64").astype(xs(dtype).dtype) + xs(dtype)
        for _ in range(2):   # the second call takes the fast path
            np.testing.assert_array_equal(f(value, xs(dtype)), want, err_msg=f"{dtype} {value!r}")


OUT_OF_RANGE = [("int32", 2**40, r"is 1099511627776, outside the range of int32 \[-2147483648, 2147483647\]"),
                ("int32", -2**31 - 1, r"is -2147483649, outside the range of int32"),
                ("int32", np.int64(2**40), r"is 1099511627776, outside the range of int32"),
                ("int32", np.array(2**33), r"is 8589934592, outside the range of int32"),
                ("uint8", -1, r"is -1, outside the range of uint8 \[0, 255\]"),
                ("uint8", np.int8(-1), r"is -1, outside the range of uint8"),
                ("uint8", 256, r"is 256, outside the range of uint8"),
                ("int64", 2**70, r"is 1180591620717411303424, outside the range of int64"),
                ("int64", np.uint64(2**64 - 1), r"is 18446744073709551615, outside the range of int64"),
                ("uint64", 2**64, r"is 18446744073709551616, outside the range of uint64 \[0, 18446744073709551615\]"),
                ("float32", 1e300, r"is 1e\+300, beyond the range of float32 \(±3.40282e\+38\)"),
                ("float32", np.float64(-1e39), r"is -1e\+39, beyond the range of float32"),
                ("float16", 70000, r"is 70000, beyond the range of float16 \(±65504\)"),
                ("float64", 10**400, r"is an integer of 401 digits, beyond the range of float64")]


@pytest.mark.parametrize("target", TARGETS)
def test_scalars_out_of_range_are_refused_with_the_range_on_every_call(target):
    for dtype, value, message in OUT_OF_RANGE:
        f = kernel(dtype, target)
        f(0, xs(dtype))  # a first call, so that the next one takes the fast path
        with pytest.raises(pf.ArgumentError, match=rf"f: argument 's' {message}.*wider type"):
            f(value, xs(dtype))


WRONG_KIND = [("int32", 1.5, "must be an int32 scalar, got float; pass an int"),
              ("int32", 2.0, "got float"), ("int32", True, "got bool"),
              ("int32", np.float32(2), "got float32"), ("int32", "3", "got str"),
              ("int32", None, "got NoneType"), ("uint8", np.bool_(True), "got bool"),
              ("float32", True, "must be a float32 scalar, got bool; pass a float"),
              ("float32", "1.5", "got str"), ("float32", 1j, "got complex"),
              ("bool", 1, "must be a bool scalar, got int; pass True or False")]


@pytest.mark.parametrize("target", TARGETS)
def test_scalars_of_the_wrong_kind_are_dtype_errors(target):
    for dtype, value, message in WRONG_KIND:
        f = kernel(dtype if dtype != "bool" else "bool", target)
        good = True if dtype == "bool" else 0
        f(good, xs(dtype))
        with pytest.raises(pf.DTypeError, match=message):
            f(value, xs(dtype))


@pytest.mark.parametrize("target", TARGETS)
def test_tensors_for_scalars_and_scalars_for_tensors_are_argument_errors(target):
    f = kernel("int32", target)
    f(1, X)
    with pytest.raises(pf.ArgumentError, match=r"'s' is a scalar int32, got an array of shape \(4,\); "
                       "pass one value"):
        f(X, X)
    with pytest.raises(pf.ArgumentError, match=r"'X' must be a numpy array, got int; wrap it with "
                       r"np.asarray\(..., dtype=np.int64\)"):
        f(1, 2)
    np.testing.assert_array_equal(f(np.array(5, np.int32), X), X + 5)   # a 0-d array is a scalar
