"""Bitwise ops, shifts and BitCast against numpy, with broadcasting, on native code and the
reference interpreter.

numpy is the oracle: ONNX defines these ops as numpy computes them (a shift count outside
[0, bits) gives the sign fill, BitCast is ``ndarray.view``).
"""

import numpy as np
import pytest
from onnx import helper

import polyfuse as pf
from tests.onnx.ort_compare import one_node_model

RNG = np.random.default_rng(3)
TARGETS = ["host", "reference"]
INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def ints(dtype, *shape):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def run(op, feeds, out_dtype, target, opset=21, **attrs):
    node = helper.make_node(op, list(feeds), ["z"], name="n", **attrs)
    m = one_node_model(node, feeds, {"z": helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype))},
                       opset=opset)
    return pf.compile(m, target=target).run(feeds)["z"]


def assert_same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", INTS, ids=lambda d: d.__name__)
@pytest.mark.parametrize("op, fn", [("BitwiseAnd", np.bitwise_and), ("BitwiseOr", np.bitwise_or),
                                    ("BitwiseXor", np.bitwise_xor)])
def test_bitwise_binary_broadcasts(op, fn, dtype, target):
    a, b = ints(dtype, 2, 3, 4), ints(dtype, 3, 1)
    assert_same(run(op, {"a": a, "b": b}, dtype, target), fn(a, b))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", INTS, ids=lambda d: d.__name__)
def test_bitwise_not(dtype, target):
    x = ints(dtype, 3, 5)
    assert_same(run("BitwiseNot", {"x": x}, dtype, target), np.invert(x))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", INTS, ids=lambda d: d.__name__)
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bit_shift_broadcasts_every_count(direction, dtype, target):
    bits = np.dtype(dtype).itemsize * 8
    x = ints(dtype, 4, 1)
    x[:2, 0] = [np.iinfo(dtype).max, np.iinfo(dtype).min]
    counts = np.arange(-2, bits + 3)
    y = counts.astype(dtype)              # -2, -1 wrap to the largest counts when unsigned
    fn = np.left_shift if direction == "LEFT" else np.right_shift
    got = run("BitShift", {"x": x, "y": y}, dtype, target, opset=28, direction=direction)
    assert_same(got, fn(x, y))
    # the count's range decides, not its low bits: bits, bits + 1 give the sign fill
    fill = np.where(x < 0, -1, 0).astype(dtype) if direction == "RIGHT" else np.zeros_like(x)
    assert_same(got[:, counts == bits], fill)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("src, dst", [(np.float32, np.int32), (np.int32, np.float32),
                                      (np.float64, np.uint64), (np.int64, np.float64),
                                      (np.float16, np.int16), (np.uint16, np.float16),
                                      (np.int8, np.uint8), (np.bool_, np.uint8),
                                      (np.uint32, np.int32)], ids=str)
def test_bit_cast_is_a_view(src, dst, target):
    if np.dtype(src).kind == "f":
        x = (RNG.standard_normal((3, 4)) * 100).astype(src)
        x[0, :3] = [-0.0, np.inf, -np.inf]
    elif src is np.bool_:
        x = RNG.random((3, 4)) < 0.5
    else:
        x = ints(src, 3, 4)
        if np.dtype(dst).kind == "f":   # the exponent's top bit clear: finite floats
            x &= ~np.array(1 << (np.dtype(src).itemsize * 8 - 2), src)
    got = run("BitCast", {"x": x}, dst, target, opset=26, to=helper.np_dtype_to_tensor_dtype(np.dtype(dst)))
    assert_same(got, x.view(dst))


@pytest.mark.unit
def test_bit_cast_between_widths_is_refused():
    with pytest.raises(pf.ModelError, match=r"node 'n' \(BitCast\).*int16 \(16 bits\).*equally wide"):
        run("BitCast", {"x": np.zeros(3, np.float32)}, np.int16, "host", opset=26, to=5)


@pytest.mark.unit
def test_bit_shift_needs_a_direction():
    feeds = {"x": np.ones(3, np.uint8), "y": np.ones(3, np.uint8)}
    with pytest.raises(pf.ModelError, match=r"node 'n' \(BitShift\): attribute direction is 'UP'"):
        run("BitShift", feeds, np.uint8, "host", opset=28, direction="UP")


@pytest.mark.unit
def test_bitwise_and_of_floats_is_refused_with_the_node():
    feeds = {"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)}
    with pytest.raises(pf.PolyfuseError, match=r"node 'n' \(BitwiseAnd"):
        run("BitwiseAnd", feeds, np.float32, "host", opset=18)
