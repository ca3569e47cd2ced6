"""pack_operands, filecheck style: a micro-kernel's vector operand is copied into
contiguous panels (a local buffer), the result prints as expected and parses back, and
it computes what the kernel before it does, in the loop-IR interpreter and natively
(x86 and aarch64), at shapes its blocks do not divide."""

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.frontends.loop_ir import parse_kernel
from polyfuse.ir.loops import BufferRole
from polyfuse.ir.loops_interpreter import interpret_kernel
from polyfuse.scheduler.loop_passes import pack_operands
from polyfuse.scheduler.loop_passes.pack_operands import PACK_BYTES
from polyfuse.scheduler.options import MappingOptions
from tests.arm_tools import needs_arm_tools

RNG = np.random.default_rng(5)

MICRO = """kernel mm(in float32(8, 16) A, in float32(16, 24) B, out float32(8, 24) C) {
  for c0 in 0:8 step 2 {
    for c1 in 0:24 step 8 {
      for c2 in 0:16 {
        for c3 in 0:8 vectorize(4) {
          C(c0, c1 + c3) = C(c0, c1 + c3) + A(c0, c2) * B(c2, c1 + c3)
          C(c0 + 1, c1 + c3) = C(c0 + 1, c1 + c3) + A(c0 + 1, c2) * B(c2, c1 + c3)
        }
      }
    }
  }
}"""

# B is read a vector (8 elements of a row) at a time and reused by the 4 row blocks of
# c0: its box, 16 x 24, is copied once as 3 panels of 16 x 8, each contiguous
PACKED = """kernel mm(in float32(8, 16) A, in float32(16, 24) B, out float32(8, 24) C, local float32(3, 16, 8) B_packed) {
  for B_packed_0 in 0:3 {
    for B_packed_1 in 0:16 {
      for B_packed_2 in 0:8 vectorize(4) {
        B_packed(B_packed_0, B_packed_1, B_packed_2) = B(B_packed_1, B_packed_0 * 8 + B_packed_2)
      }
    }
  }
  for c0 in 0:8 step 2 {
    for c1 in 0:24 step 8 {
      for c2 in 0:16 {
        for c3 in 0:8 vectorize(4) {
          C(c0, c1 + c3) = C(c0, c1 + c3) + A(c0, c2) * B_packed(c1 / 8, c2, c3)
          C(c0 + 1, c1 + c3) = C(c0 + 1, c1 + c3) + A(c0 + 1, c2) * B_packed(c1 / 8, c2, c3)
        }
      }
    }
  }
}"""

A = RNG.standard_normal((8, 16)).astype(np.float32)
B = RNG.standard_normal((16, 24)).astype(np.float32)


def test_a_vector_operand_reused_by_row_blocks_is_packed_into_contiguous_panels():
    out = pack_operands(parse_kernel(MICRO))
    assert str(out) == PACKED
    assert parse_kernel(PACKED) == out
    assert out.buffer("B_packed").role is BufferRole.LOCAL
    assert [b.name for b in out.parameters] == ["A", "B", "C"]
    got = interpret_kernel(out, {"A": A, "B": B})
    assert set(got) == {"C"}
    np.testing.assert_allclose(got["C"], A @ B, rtol=1e-5)


@pytest.mark.parametrize("change", [
    ("for c0 in 0:8 step 2", "for c0 in 0:2 step 2"),           # no reuse: one row block
    ("        for c3 in 0:8 vectorize(4) {", "        if c0 < 6 {\n        for c3 in 0:8 vectorize(4) {"),
    ("for c1 in 0:24 step 8", "for c1 in 0:min(24, 30 - c0) step 8"),   # bounds not constant
    ("B(c2, c1 + c3)", "B(c2, c1 + c3 / 2)"),                     # not a contiguous vector
])
def test_what_the_pass_cannot_copy_exactly_or_would_not_reuse_stays(change):
    old, new = change
    text = MICRO.replace(old, new)
    if new.startswith("        if"):
        text = text.replace("        }\n      }\n    }\n  }\n}", "        }\n        }\n      }\n    }\n  }\n}")
    kernel = parse_kernel(text)
    assert pack_operands(kernel) == kernel


def test_a_box_past_the_budget_is_not_packed():
    rows = PACK_BYTES // (4 * 24) + 1   # the 24-wide box of B, taller than the budget
    text = MICRO.replace("(16, 24) B", f"({rows}, 24) B").replace("(8, 16) A", f"(8, {rows}) A") \
        .replace("for c2 in 0:16", f"for c2 in 0:{rows}")
    kernel = parse_kernel(text)
    assert pack_operands(kernel) == kernel


MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
BMM_T = "def bmm(float(Bt,M,K) A, float(Bt,N,K) B) -> (C) { C(b,m,n) +=! A(b,m,k) * B(b,n,k) }"


@pytest.mark.parametrize("shape", [(1024, 1024, 1024), (197, 768, 300), (130, 257, 200)])
def test_native_matmuls_pack_their_panels_and_match_numpy(shape):
    M, K, N = shape
    a = RNG.standard_normal((M, K)).astype(np.float32)
    b = RNG.standard_normal((K, N)).astype(np.float32)
    kernel = pf.define(MM, target="host").mm
    spec = kernel.specialize(a, b)
    assert "local float32(" in spec.stages["loops"]      # the full tiles read packed panels
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=2e-4, atol=2e-3)


def test_a_parallel_kernel_packs_per_thread():
    a = RNG.standard_normal((300, 256)).astype(np.float32)
    b = RNG.standard_normal((256, 520)).astype(np.float32)
    kernel = pf.define(MM, target="host", options=MappingOptions(
        tile_sizes=(16, 128, 64), register_tile=(4, 32, 0), point_order=(2, 0, 1), vector_width=16,
        unroll=2, unroll_jam=4, reorder_reductions=True, num_threads=2)).mm
    spec = kernel.specialize(a, b)
    loops = spec.stages["loops"]
    assert "local float32(" in loops and loops.index("parallel for") < loops.index("_packed_0 in")
    for _ in range(3):   # the threads' panels do not mix
        np.testing.assert_allclose(kernel(a, b), a @ b, rtol=2e-4, atol=2e-3)


@needs_arm_tools
def test_aarch64_kernels_read_packed_panels():
    a = RNG.standard_normal((70, 96)).astype(np.float32)
    b = RNG.standard_normal((96, 80)).astype(np.float32)
    kernel = pf.define(MM, target="aarch64").mm
    spec = kernel.specialize(a, b)
    assert "local float32(" in spec.stages["loops"]
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=2e-4, atol=2e-3)
