"""Register blocks that share a prepacked panel prefetch the next one in slices."""

import math
import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from polyfuse.frontends.loop_ir import parse_kernel
from polyfuse.ir.loops import For, format_loop_expr
from polyfuse.runtime import cpu
from polyfuse.targets import panel_prefetch
from polyfuse.targets.panel_prefetch import panel_prefetches
from tests.arm_tools import AARCH64

# seven rows (h) share each 8-channel panel of W; the depth tile c1 moves to the next
CONV = """kernel conv(in float32(9, 16) P, in float32(16, 32) W, in float32(2, 8, 32) W_prepacked = pack W(8*p0 + p1, p2), out float32(7, 32) O) {
  for c1 in 0:16 step 8 {
    for h in 0:7 {
      for c in 0:8 {
        for v in 0:32 vectorize(16) {
          O(h, v) = O(h, v) + P(h, c1 + c) * W_prepacked(c1 / 8, c, v)
        }
      }
    }
  }
}"""


@pytest.mark.unit
def test_each_row_block_prefetches_its_slice_of_the_next_panel():
    kernel = parse_kernel(CONV)
    depth: For = kernel.body[0]       # type: ignore[assignment]
    rows: For = depth.body[0]         # type: ignore[assignment]
    (got,) = panel_prefetches(rows, (depth,), kernel)
    # a panel of 8 x 32 floats (1 KiB, 16 lines) over 7 passes: 3 lines each, from the
    # first element of the panel the next depth tile reads
    assert (got.tensor, got.lines) == ("W_prepacked", 3)
    assert format_loop_expr(got.first) == "W_prepacked((c1 + 8) / 8, 0, 0)"
    # loops that move the read do not share its panel; without an enclosing loop that
    # moves to another panel there is none next
    assert panel_prefetches(depth, (), kernel) == []
    assert panel_prefetches(rows.body[0], (depth, rows), kernel) == []   # type: ignore[arg-type]
    assert panel_prefetches(rows, (), kernel) == []


@pytest.mark.unit
def test_a_slice_too_large_for_one_burst_streams_through_the_reduction_loop(monkeypatch):
    kernel = parse_kernel(CONV)
    depth: For = kernel.body[0]       # type: ignore[assignment]
    (burst,) = panel_prefetches(depth.body[0], (depth,), kernel)   # type: ignore[arg-type]
    assert burst.over is None
    monkeypatch.setattr(panel_prefetch, "SPREAD_LINES", 2)
    (streamed,) = panel_prefetches(depth.body[0], (depth,), kernel)   # type: ignore[arg-type]
    # the same 3 lines per pass, over the 8 steps of the pass's reduction loop c
    assert streamed.lines == 3 and streamed.first == burst.first
    assert streamed.over is not None and (streamed.over.var, streamed.over.trips) == ("c", 8)


def _matmul_model(weights: np.ndarray, rows: int) -> bytes:
    depth, cols = weights.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, depth])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, cols])],
        [numpy_helper.from_array(weights, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("target", ["host", AARCH64])
def test_a_product_streams_the_next_weight_panel_through_each_row_blocks_reduction(target, monkeypatch):
    import onnxruntime as ort
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", "")
    monkeypatch.setattr(cpu, "_COMPILED", {})
    rng = np.random.default_rng(8)
    weights = (rng.standard_normal((300, 256)) * 0.05).astype(np.float32)
    model = _matmul_model(weights, 100)   # 100 rows: blocks of 6 share each column block's panel
    x = rng.standard_normal((100, 300)).astype(np.float32)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    compiled = pf.compile(model, target=target)
    np.testing.assert_allclose(compiled(x), want, rtol=1e-3, atol=1e-4)
    # each of the 300 reduction steps prefetches line j * lines / 300 of its pass's slice
    # (more lines than one burst takes)
    streams = re.findall(r'= mul i64 %"[^"]+", (\d+)\n\s+%"[^"]+" = sdiv i64 %"[^"]+", 300\n',
                         compiled.dump("llvm"))
    assert streams and all(int(lines) > panel_prefetch.SPREAD_LINES for lines in streams)


def _conv_model(channels: int, size: int, weights: np.ndarray) -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "k"], ["y"], pads=[1, 1, 1, 1])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, size, size])],
        [numpy_helper.from_array(weights, "k")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("target", ["host", AARCH64])
def test_a_convolution_of_a_small_map_prefetches_its_next_weight_panel_in_slices(target, monkeypatch):
    import onnxruntime as ort
    monkeypatch.setenv("POLYFUSE_CACHE_DIR", "")      # each compile below builds its kernels
    monkeypatch.setattr(cpu, "_COMPILED", {})
    rng = np.random.default_rng(7)
    channels, size = 96, 7   # 7 rows of 7 pixels share each 8-channel panel of 3x3 weights
    weights = (rng.standard_normal((channels, channels, 3, 3)) * 0.05).astype(np.float32)
    model = _conv_model(channels, size, weights)
    x = rng.standard_normal((1, channels, size, size)).astype(np.float32)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    spread = pf.compile(model, target=target)
    np.testing.assert_allclose(spread(x), want, rtol=1e-3, atol=1e-4)
    # the panel (a depth tile of channels x 9 taps x a register block's columns: 8 x 9 x
    # 32 floats with AVX-512, 9 KiB) in slices of a seventh per row, in place of two
    # lines ahead of every read
    loops = spread.dump("loops")
    columns = int(re.search(r"float32\(\d+, 1, \d+, 3, 3, (\d+)\) Wt_prepacked", loops).group(1))
    depth = int(re.search(r"for c1 in 0:\d+ step (\d+)", loops).group(1))
    calls = spread.dump("llvm").count('call void @"llvm.prefetch.p0"')
    assert calls == math.ceil(depth * 9 * columns * 4 / 64 / size)
    monkeypatch.setattr(panel_prefetch, "SPREAD_LINES", 0)   # every slice streams instead
    cpu._COMPILED.clear()
    streamed = pf.compile(model, target=target)
    np.testing.assert_allclose(streamed(x), want, rtol=1e-3, atol=1e-4)
    assert streamed.dump("llvm").count('call void @"llvm.prefetch.p0"') != calls
