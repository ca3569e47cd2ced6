"""The narrow ONNX element types (float8 in five formats, float4 e2m1, int4, uint4, int2,
uint2) as graph inputs, outputs and initializers, through Cast, CastLike, QuantizeLinear
and DequantizeLinear, against onnx's reference evaluator (ml_dtypes underneath) and
onnxruntime: every value each float format has, the midpoints between them and their
neighbours (ties to even), the saturation boundaries, NaN, infinities and subnormals,
compared bit for bit."""

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import polyfuse as pf
from polyfuse.errors import DTypeError, UnsupportedOpError
from tests.cuda.emulator import CXX
from tests.cuda.test_emulated import emulated  # noqa: F401 - a fixture
from tests.onnx.ort_compare import onnxruntime_outputs

RNG = np.random.default_rng(11)
FLOAT8 = {TP.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn, TP.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
          TP.FLOAT8E5M2: ml_dtypes.float8_e5m2, TP.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz}
SMALL_FLOATS = {**FLOAT8, TP.FLOAT4E2M1: ml_dtypes.float4_e2m1fn}
SMALL_INTS = {TP.INT4: ml_dtypes.int4, TP.UINT4: ml_dtypes.uint4, TP.INT2: ml_dtypes.int2,
              TP.UINT2: ml_dtypes.uint2}


def graph_model(nodes, inputs, outputs, initializers=(), opset=25):
    """``inputs``/``outputs``: name -> (ONNX element type, shape)."""
    graph = helper.make_graph(
        nodes, "narrow", [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in outputs.items()],
        [numpy_helper.from_array(a, n) for n, a in dict(initializers).items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 11
    return m


def cast_model(src, dst, n, **attrs):
    node = helper.make_node("Cast", ["x"], ["y"], to=dst, **attrs)
    return graph_model([node], {"x": (src, [n])}, {"y": (dst, [n])})


def check(m, feeds, target="host"):
    """polyfuse's outputs equal the reference evaluator's in dtype and bits."""
    want = ReferenceEvaluator(m).run(None, feeds)
    got = pf.compile(m, target=target).run(feeds)
    for value, w in zip(m.graph.output, want):
        g = got[value.name]
        assert g.dtype == w.dtype and g.shape == w.shape, value.name
        np.testing.assert_array_equal(bits(g), bits(w), err_msg=value.name)
    return got


def bits(a):
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 and a.dtype.kind != "b" else a


def edge_values(dtype, wide=np.float32):
    """Every finite value of a small float type, the midpoints between neighbours and
    the nearest ``wide`` values either side of each, with both signs, plus values past
    the largest, infinities, NaN and tiny values."""
    codes = np.arange(256 if np.dtype(dtype).itemsize == 1 else 16, dtype=np.uint8)
    grid = np.unique(np.abs(codes.view(dtype).astype(np.float64)))
    grid = grid[np.isfinite(grid)]
    top = grid[-1]
    mids = (grid[:-1] + grid[1:]) / 2
    over = [top + (top - grid[-2]) / 2, top * 1.5, top * 2, 1e30]
    with np.errstate(over="ignore"):   # float16 has no 1e30: infinity
        pos = np.concatenate([grid, mids, over, grid[1:] / 3]).astype(wide)
    pos = np.concatenate([pos, np.nextafter(pos, wide(np.inf)), np.nextafter(pos, wide(0))])
    special = np.array([np.inf, np.nan, 1e-30, 0.0], wide)
    return np.concatenate([pos, -pos, special, -special])


# --- Cast to float8 and float4 ------------------------------------------------------------------

@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("code", list(SMALL_FLOATS))
def test_cast_float32_to_small_floats_rounds_as_onnx(code, saturate):
    x = edge_values(SMALL_FLOATS[code])
    check(cast_model(TP.FLOAT, code, len(x), saturate=saturate), {"x": x})


@pytest.mark.parametrize("src,wide", [(TP.DOUBLE, np.float64), (TP.FLOAT16, np.float16)])
@pytest.mark.parametrize("code", [TP.FLOAT8E4M3FN, TP.FLOAT8E5M2FNUZ, TP.FLOAT4E2M1])
def test_cast_float64_and_float16_round_once(code, src, wide):
    """float64 rounds straight to the format (no double rounding through float32)."""
    x = edge_values(SMALL_FLOATS[code], wide)
    if wide is np.float64:
        x = np.concatenate([x, x * (1 + 2.0 ** -40), x * (1 - 2.0 ** -40)])
    check(cast_model(src, code, len(x)), {"x": x})


@pytest.mark.unit
def test_cast_on_the_reference_interpreter():
    x = edge_values(ml_dtypes.float8_e4m3fn)
    check(cast_model(TP.FLOAT, TP.FLOAT8E4M3FN, len(x), saturate=0), {"x": x}, target="reference")


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [1, 0])
def test_cast_to_float8e8m0_rounds_the_exponent(round_mode, saturate):
    k = np.arange(-130, 128, dtype=np.float64)
    x = np.concatenate([2.0 ** k, 1.5 * 2.0 ** k, 1.25 * 2.0 ** k, 1.75 * 2.0 ** k])
    x = np.concatenate([x.astype(np.float32), [0, np.inf, np.nan, np.float32(3.4e38), 1e-45]])
    x = np.concatenate([x, np.nextafter(x, np.float32(np.inf))]).astype(np.float32)
    check(cast_model(TP.FLOAT, TP.FLOAT8E8M0, len(x), saturate=saturate, round_mode=round_mode),
          {"x": x})


# --- Cast to and from the small integers --------------------------------------------------------

@pytest.mark.parametrize("code", list(SMALL_INTS))
def test_cast_floats_to_small_ints_truncates_as_ml_dtypes(code):
    x = np.concatenate([np.arange(-20, 20, 0.25), [np.nan, np.inf, -np.inf, 1e10]]).astype(np.float32)
    got = check(cast_model(TP.FLOAT, code, len(x)), {"x": x})["y"]
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got, x.astype(SMALL_INTS[code]))


@pytest.mark.parametrize("src,dtype", [(TP.INT32, np.int32), (TP.INT64, np.int64), (TP.UINT8, np.uint8)])
@pytest.mark.parametrize("code", list(SMALL_INTS))
def test_cast_ints_to_small_ints_wraps(code, src, dtype):
    info = np.iinfo(dtype)
    x = np.concatenate([np.arange(max(info.min, -40), 40), [info.min, info.max]]).astype(dtype)
    check(cast_model(src, code, len(x)), {"x": x})


@pytest.mark.parametrize("code", [*SMALL_INTS, *SMALL_FLOATS, TP.FLOAT8E8M0])
@pytest.mark.parametrize("dst", [TP.FLOAT, TP.FLOAT16, TP.INT8, TP.UINT8, TP.FLOAT8E5M2, TP.INT4])
def test_cast_from_narrow_inputs(code, dst):
    dtype = {**SMALL_INTS, **SMALL_FLOATS, TP.FLOAT8E8M0: ml_dtypes.float8_e8m0fnu}[code]
    if code in SMALL_INTS:
        info = ml_dtypes.iinfo(dtype)
        x = np.arange(int(info.min), int(info.max) + 1).astype(dtype)
    else:   # every code of the type
        x = np.arange(256 if np.dtype(dtype).itemsize == 1 else 16, dtype=np.uint8).view(dtype)
    if dst in (TP.INT8, TP.UINT8) and code not in SMALL_INTS:   # out of range: undefined
        f = x.astype(np.float32)
        x = x[np.isfinite(f) & (f > (-128 if dst == TP.INT8 else -1)) & (f < 128)]
    check(cast_model(code, dst, len(x)), {"x": x})


def test_castlike_takes_the_type_of_a_float8_initializer():
    like = np.zeros(1, ml_dtypes.float8_e5m2)
    node = helper.make_node("CastLike", ["x", "like"], ["y"], saturate=0)
    x = edge_values(ml_dtypes.float8_e5m2)
    m = graph_model([node], {"x": (TP.FLOAT, [len(x)])}, {"y": (TP.FLOAT8E5M2, [len(x)])},
                    {"like": like})
    check(m, {"x": x})


def test_a_cast_inside_a_graph_rounds_in_the_kernel():
    """x -> float8 -> Transpose (a float8 output too) -> float -> + y: the rounding happens
    between kernels, and the Transpose's output keeps the float8 type."""
    nodes = [helper.make_node("Cast", ["x"], ["q"], to=TP.FLOAT8E4M3FN),
             helper.make_node("Transpose", ["q"], ["t"], perm=[1, 0]),
             helper.make_node("Cast", ["t"], ["f"], to=TP.FLOAT),
             helper.make_node("Add", ["f", "y"], ["z"])]
    m = graph_model(nodes, {"x": (TP.FLOAT, [5, 7]), "y": (TP.FLOAT, [7, 5])},
                    {"z": (TP.FLOAT, [7, 5]), "t": (TP.FLOAT8E4M3FN, [7, 5])})
    x = RNG.normal(0, 100, (5, 7)).astype(np.float32)
    y = RNG.normal(0, 1, (7, 5)).astype(np.float32)
    got = check(m, {"x": x, "y": y})
    np.testing.assert_array_equal(got["z"], x.astype(ml_dtypes.float8_e4m3fn).astype(np.float32).T + y)


def test_folded_casts_pads_and_constants_of_shape_keep_narrow_types():
    """A Cast of an initializer (folded at compile time), a Pad of float8 values with a
    float8 pad value and a ConstantOfShape of an int4 value."""
    nodes = [helper.make_node("Cast", ["c"], ["q"], to=TP.FLOAT8E4M3FN, saturate=0),
             helper.make_node("Cast", ["x"], ["xq"], to=TP.FLOAT8E4M3FN),
             helper.make_node("Pad", ["xq", "pads", "pv"], ["p"]),
             helper.make_node("ConstantOfShape", ["shape"], ["k"],
                              value=numpy_helper.from_array(np.array([5], ml_dtypes.int4)))]
    constants = {"c": np.linspace(-600, 600, 41).astype(np.float32),
                 "pads": np.array([1, 2], np.int64), "pv": np.array(3.5, ml_dtypes.float8_e4m3fn),
                 "shape": np.array([2, 3], np.int64)}
    m = graph_model(nodes, {"x": (TP.FLOAT, [6])}, {"q": (TP.FLOAT8E4M3FN, [41]),
                    "p": (TP.FLOAT8E4M3FN, [9]), "k": (TP.INT4, [2, 3])}, constants)
    got = check(m, {"x": np.array([1.3, -500, 0.01, 7, np.nan, -0.0], np.float32)})
    assert np.isnan(got["q"].astype(np.float32)[-5:]).all()   # past 464 without saturation
    assert got["p"][0] == 3.5 and (got["k"] == 5).all()


# --- QuantizeLinear, DequantizeLinear -------------------------------------------------------------

@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("code", [*SMALL_FLOATS, *SMALL_INTS])
def test_quantize_per_axis_to_narrow_types(code, saturate):
    dtype = {**SMALL_FLOATS, **SMALL_INTS}[code]
    rng = np.random.default_rng(code * 2 + saturate)   # the same data whatever ran before
    x = rng.normal(0, 30, (3, 4, 5)).astype(np.float32)
    # far outside every type's range, but x / s stays inside int32's: the reference
    # rounds through int32, where 1e9 / s wraps for s < 0.47 (it gave 0, not the
    # saturated 15, for uint4 when an earlier test had drawn from a shared generator)
    x[0, 0, :4] = [1e8, -1e8, 1e-9, -1e-9]
    if code in SMALL_FLOATS:   # (the reference turns infinities into int32's minimum)
        x[0, 1, :2] = [np.inf, -np.inf]
    s = rng.uniform(0.05, 2, 4).astype(np.float32)
    z = np.zeros(4, dtype) if code in SMALL_FLOATS else np.array([1, 0, 1, 0]).astype(dtype)
    attrs = {"saturate": saturate} if code in FLOAT8 else {}
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=1, **attrs)
    m = graph_model([node], {"x": (TP.FLOAT, [3, 4, 5])}, {"y": (code, [3, 4, 5])}, {"s": s, "z": z})
    check(m, {"x": x})


@pytest.mark.parametrize("code", [TP.INT4, TP.UINT4, TP.FLOAT8E4M3FN])
def test_blocked_int4_weights_dequantize_like_onnxruntime(code):
    """An int4 initializer with blocked scales (weight-only quantization), and a float8
    input, dequantized: the reference evaluator and onnxruntime agree with polyfuse."""
    dtype = {**SMALL_INTS, **SMALL_FLOATS}[code]
    w = RNG.integers(-8, 8, (8, 6)).astype(np.float32)
    w = (w if code != TP.UINT4 else w + 8).astype(dtype)
    s = RNG.uniform(0.01, 1, (4, 6)).astype(np.float32)
    dq = helper.make_node("DequantizeLinear", ["w", "s"], ["wf"], axis=0, block_size=2)
    mm = helper.make_node("MatMul", ["x", "wf"], ["y"])
    m = graph_model([dq, mm], {"x": (TP.FLOAT, [3, 8])}, {"y": (TP.FLOAT, [3, 6])}, {"w": w, "s": s})
    x = RNG.normal(0, 1, (3, 8)).astype(np.float32)
    got = check(m, {"x": x})["y"]
    m.ir_version = 10
    m.opset_import[0].version = 21
    np.testing.assert_allclose(got, onnxruntime_outputs(m, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_quantize_dequantize_float8_activations_match_onnxruntime():
    x = RNG.normal(0, 4, (2, 16)).astype(np.float32)
    s = np.float32(0.05)
    z = np.zeros((), ml_dtypes.float8_e4m3fn)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    m = graph_model(nodes, {"x": (TP.FLOAT, [2, 16])},
                    {"y": (TP.FLOAT, [2, 16]), "q": (TP.FLOAT8E4M3FN, [2, 16])}, {"s": s, "z": z})
    got = check(m, {"x": x})
    m.ir_version, m.opset_import[0].version = 10, 21
    y, q = onnxruntime_outputs(m, {"x": x})
    np.testing.assert_array_equal(bits(got["q"]), bits(q))
    np.testing.assert_array_equal(got["y"], y)


# --- errors ----------------------------------------------------------------------------------------

@pytest.mark.unit
def test_a_float32_feed_for_a_float8_input_is_a_dtype_error():
    m = pf.compile(cast_model(TP.FLOAT8E4M3FN, TP.FLOAT, 3), target="host")
    with pytest.raises(DTypeError, match="float8e4m3fn"):
        m.run({"x": np.zeros(3, np.float32)})


@pytest.mark.unit
def test_bitcast_of_float8_is_refused_naming_the_node():
    node = helper.make_node("BitCast", ["x"], ["y"], to=TP.UINT8, name="bits")
    m = graph_model([node], {"x": (TP.FLOAT8E4M3FN, [3])}, {"y": (TP.UINT8, [3])}, opset=26)
    with pytest.raises(UnsupportedOpError, match="bits"):
        pf.compile(m, target="host").run({"x": np.zeros(3, ml_dtypes.float8_e4m3fn)})


# --- the CUDA C of the rounding (run by the emulator on machines without a GPU) ------------------

@pytest.mark.skipif(CXX is None, reason="the emulator needs a C++20 compiler")
@pytest.mark.parametrize("code,attrs", [(TP.FLOAT8E4M3FN, {"saturate": 0}),
                                        (TP.FLOAT8E5M2, {}), (TP.FLOAT4E2M1, {}),
                                        (TP.FLOAT8E8M0, {"round_mode": "nearest"}), (TP.INT4, {})])
def test_cuda_kernels_round_the_same(code, attrs, emulated):
    x = edge_values(ml_dtypes.float8_e4m3fn) * np.float32(3.3)
    check(cast_model(TP.FLOAT, code, len(x), **attrs), {"x": x}, target="cuda")
    assert emulated.launches


@pytest.mark.unit
def test_a_bundle_refuses_narrow_inputs(tmp_path):
    m = pf.compile(cast_model(TP.FLOAT8E4M3FN, TP.FLOAT, 3), target="x86")
    with pytest.raises(pf.ArgumentError, match="'x' is float8e4m3fn"):
        m.save_bundle(tmp_path, shapes={"x": (3,)})
