"""pack_operands, filecheck style: a micro-kernel's vector operand is copied into
contiguous panels (a local buffer), or, for a constant operand, read from panels packed
before the kernel runs (a packed input); the result prints as expected and parses back,
and it computes what the kernel before it does, in the loop-IR interpreter and natively
(x86 and aarch64), at shapes its blocks do not divide."""

from dataclasses import replace

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.frontends.loop_ir import parse_kernel
from polyfuse.ir.loops import BufferRole
from polyfuse.ir.loops_interpreter import interpret_kernel
from polyfuse.scheduler.loop_passes import pack_operands
from polyfuse.scheduler.heuristics import PACK_MIN_REUSE
from polyfuse.scheduler.loop_passes import widen_partial_blocks
from polyfuse.scheduler.options import MappingOptions

BOX_BYTES = 768 << 10   # one packed box at most, as the pipeline gives an L2 of 2 MiB
PACKING = {"min_reuse": PACK_MIN_REUSE, "box_bytes": BOX_BYTES, "line_bytes": 64}
from tests.scheduler.avx512 import avx512_loops
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
PACKED = """kernel mm(in float32(8, 16) A, in float32(16, 24) B, out float32(8, 24) C, local panel float32(3, 16, 8) B_packed) {
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


@pytest.mark.unit
def test_a_vector_operand_reused_by_row_blocks_is_packed_into_contiguous_panels():
    out = pack_operands(parse_kernel(MICRO), **PACKING)
    assert str(out) == PACKED
    assert parse_kernel(PACKED) == out
    assert out.buffer("B_packed").role is BufferRole.LOCAL
    assert [b.name for b in out.parameters] == ["A", "B", "C"]
    got = interpret_kernel(out, {"A": A, "B": B})
    assert set(got) == {"C"}
    np.testing.assert_allclose(got["C"], A @ B, rtol=1e-5, atol=1e-5)


# the same box of a constant B, packed before the kernel runs: no copy in the kernel
PREPACKED = """kernel mm(in float32(8, 16) A, in float32(16, 24) B, in panel float32(3, 16, 8) B_prepacked = pack B(p1, 8*p0 + p2), out float32(8, 24) C) {
  for c0 in 0:8 step 2 {
    for c1 in 0:24 step 8 {
      for c2 in 0:16 {
        for c3 in 0:8 vectorize(4) {
          C(c0, c1 + c3) = C(c0, c1 + c3) + A(c0, c2) * B_prepacked(c1 / 8, c2, c3)
          C(c0 + 1, c1 + c3) = C(c0 + 1, c1 + c3) + A(c0 + 1, c2) * B_prepacked(c1 / 8, c2, c3)
        }
      }
    }
  }
}"""


@pytest.mark.unit
def test_a_constant_operand_is_packed_before_the_kernel_runs():
    out = pack_operands(parse_kernel(MICRO), frozenset({"B"}), **PACKING)
    assert str(out) == PREPACKED
    assert parse_kernel(PREPACKED) == out
    assert [b.name for b in out.parameters] == ["A", "B", "B_prepacked", "C"]
    got = interpret_kernel(out, {"A": A, "B": B})
    assert set(got) == {"C"}
    np.testing.assert_allclose(got["C"], A @ B, rtol=1e-5, atol=1e-5)


@pytest.mark.unit
def test_a_prepacked_operand_holds_every_box_its_enclosing_tile_loops_visit():
    # column tiles of 24 on the threads around the nest: one box per tile, tile numbers first
    text = MICRO.replace("(16, 24) B", "(16, 48) B").replace("(8, 24) C", "(8, 48) C") \
        .replace("B(c2, c1 + c3)", "B(c2, t + c1 + c3)").replace("C(c0, c1 + c3)", "C(c0, t + c1 + c3)") \
        .replace("C(c0 + 1, c1 + c3)", "C(c0 + 1, t + c1 + c3)")
    lines = text.splitlines()
    text = "\n".join([lines[0], "  parallel for t in 0:48 step 24 {", *("  " + ln for ln in lines[1:-1]), "  }", "}"])
    out = pack_operands(parse_kernel(text), frozenset({"B"}), **PACKING)
    packed = out.buffer("B_prepacked")
    assert packed.shape == (2, 3, 16, 8) and str(packed.packing) == "pack B(p2, 24*p0 + 8*p1 + p3)"
    assert "A(c0, c2) * B_prepacked(t / 24, c1 / 8, c2, c3)" in str(out)
    b = RNG.standard_normal((16, 48)).astype(np.float32)
    got = interpret_kernel(out, {"A": A, "B": b})
    np.testing.assert_allclose(got["C"], A @ b, rtol=1e-5, atol=1e-5)
    # the packed input given ready-made (as a compiled model binds it) computes the same
    given = packed.packing.apply(b, packed.shape)
    np.testing.assert_allclose(interpret_kernel(out, {"A": A, "B": b, "B_prepacked": given})["C"], A @ b,
                               rtol=1e-5, atol=1e-5)


# B given transposed, Bt(n, k): the vector loop c3 moves its first index, 8 rows apart
# per step; the copy transposes the box into the same panels, read contiguously
MICRO_T = MICRO.replace("(16, 24) B", "(24, 16) Bt").replace("B(c2, c1 + c3)", "Bt(c1 + c3, c2)")
PACKED_T = """kernel mm(in float32(8, 16) A, in float32(24, 16) Bt, out float32(8, 24) C, local panel float32(3, 16, 8) Bt_packed) {
  for Bt_packed_0 in 0:3 {
    for Bt_packed_1 in 0:16 {
      for Bt_packed_2 in 0:8 vectorize(4) {
        Bt_packed(Bt_packed_0, Bt_packed_1, Bt_packed_2) = Bt(Bt_packed_0 * 8 + Bt_packed_2, Bt_packed_1)
      }
    }
  }"""


@pytest.mark.unit
def test_a_transposed_vector_operand_is_copied_into_the_same_panels():
    out = pack_operands(parse_kernel(MICRO_T), **PACKING)
    assert str(out).startswith(PACKED_T)
    assert "A(c0, c2) * Bt_packed(c1 / 8, c2, c3)" in str(out)
    assert parse_kernel(str(out)) == out
    got = interpret_kernel(out, {"A": A, "Bt": np.ascontiguousarray(B.T)})
    np.testing.assert_allclose(got["C"], A @ B, rtol=1e-5, atol=1e-5)
    # a constant one is packed transposed before the kernel runs
    pre = pack_operands(parse_kernel(MICRO_T), frozenset({"Bt"}), **PACKING)
    packed = pre.buffer("Bt_prepacked")
    assert packed.shape == (3, 16, 8) and str(packed.packing) == "pack Bt(8*p0 + p2, p1)"
    bt = np.ascontiguousarray(B.T)
    np.testing.assert_allclose(interpret_kernel(pre, {"A": A, "Bt": bt})["C"], A @ B, rtol=1e-5, atol=1e-5)
    given = packed.packing.apply(bt, packed.shape)
    np.testing.assert_allclose(interpret_kernel(pre, {"A": A, "Bt": bt, "Bt_prepacked": given})["C"],
                               A @ B, rtol=1e-5, atol=1e-5)


TRANSPOSED = {
    "A·Bᵀ": ("def f(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }",
             lambda a, b: a @ b.T, lambda m, k, n: [(m, k), (n, k)]),
    "Aᵀ·Bᵀ": ("def f(float(K,M) A, float(N,K) B) -> (C) { C(m,n) +=! A(k,m) * B(n,k) }",
              lambda a, b: a.T @ b.T, lambda m, k, n: [(k, m), (n, k)]),
    "Aᵀ·B": ("def f(float(K,M) A, float(K,N) B) -> (C) { C(m,n) +=! A(k,m) * B(k,n) }",
             lambda a, b: a.T @ b, lambda m, k, n: [(k, m), (k, n)]),
    "batched": ("def f(float(Bt,K,M) A, float(Bt,N,K) W) -> (C) { C(b,m,n) +=! A(b,k,m) * W(b,n,k) }",
                lambda a, w: a.transpose(0, 2, 1) @ w.transpose(0, 2, 1), lambda m, k, n: [(3, k, m), (3, n, k)]),
}


@pytest.mark.parametrize("case", sorted(TRANSPOSED))
@pytest.mark.parametrize("shape", [(256, 300, 512), (130, 257, 200)])
def test_native_products_with_a_transposed_operand_vectorize_the_output_through_packed_panels(case, shape):
    src, ref, shapes = TRANSPOSED[case]
    a, b = (RNG.standard_normal(s).astype(np.float32) for s in shapes(*shape))
    kernel = pf.define(src, target="host").f
    loops = kernel.specialize(a, b).stages["loops"]
    second = "W" if case == "batched" else "B"
    if case != "Aᵀ·B":
        assert f"{second}_packed(" in loops   # copied transposed
    if shape[0] == 256 and (case.startswith("Aᵀ") or case == "batched"):
        # the jammed rows' scalars lie a row apart along k: their panels are copied too
        # (at 130 x 200 a row tile's copy would serve too few column blocks)
        assert "A_packed(" in loops
    np.testing.assert_allclose(kernel(a, b), ref(a, b), rtol=2e-4, atol=2e-3)


def test_full_tiles_and_the_partial_one_after_them_share_one_packed_copy():
    # 200 rows: tiles of 60 and a partial one of 20; packed nest by nest, the partial
    # tile copied (and transposed) the same panels of Bᵀ again, into a buffer of its own
    a = RNG.standard_normal((200, 300)).astype(np.float32)
    b = RNG.standard_normal((512, 300)).astype(np.float32)
    kernel = pf.define(TRANSPOSED["A·Bᵀ"][0], target="host").f
    loops = kernel.specialize(a, b).stages["loops"]
    assert "for c2 in 180:200" in loops and "B_packed(" in loops and "* B(" not in loops
    assert "B_packed2" not in loops
    np.testing.assert_allclose(kernel(a, b), a @ b.T, rtol=2e-4, atol=2e-3)


# A given transposed, At(k, m): the 2 jammed rows' scalars At(c2, c0) and At(c2, c0 + 1)
# step a row of At apart along the reduction c2; with rows of 32 floats (128 bytes, a new
# line every step) their box is copied as panels of the 2 rows, each step's pair side by
# side, and reused by the 4 column blocks of c1
BROADCAST_T = """kernel mm(in float32(16, 32) At, in float32(16, 32) B, out float32(8, 32) C) {
  for c0 in 0:8 step 2 {
    for c1 in 0:32 step 8 {
      for c2 in 0:16 {
        for c3 in 0:8 vectorize(4) {
          C(c0, c1 + c3) = C(c0, c1 + c3) + At(c2, c0) * B(c2, c1 + c3)
          C(c0 + 1, c1 + c3) = C(c0 + 1, c1 + c3) + At(c2, c0 + 1) * B(c2, c1 + c3)
        }
      }
    }
  }
}"""


@pytest.mark.unit
def test_jammed_rows_of_a_transposed_operand_are_copied_into_panels_of_their_rows():
    rng = np.random.default_rng(11)
    at = rng.standard_normal((16, 32)).astype(np.float32)
    b = rng.standard_normal((16, 32)).astype(np.float32)
    out = pack_operands(parse_kernel(BROADCAST_T), **PACKING)
    text = str(out)
    assert "local panel float32(4, 16, 2) At_packed" in text, text
    assert "At_packed(At_packed_0, At_packed_1, At_packed_2) = At(At_packed_1, At_packed_0 * 2 + At_packed_2)" in text
    assert "At_packed(c0 / 2, c2, 0) * B_packed(" in text and "At_packed(c0 / 2, c2, 1) * B_packed(" in text
    assert parse_kernel(text) == out
    np.testing.assert_allclose(interpret_kernel(out, {"At": at, "B": b})["C"], at[:, :8].T @ b, rtol=1e-5, atol=1e-5)
    # a constant one is packed so before the kernel runs
    pre = pack_operands(parse_kernel(BROADCAST_T), frozenset({"At"}), **PACKING)
    assert str(pre.buffer("At_prepacked").packing) == "pack At(p1, 2*p0 + p2)"
    np.testing.assert_allclose(interpret_kernel(pre, {"At": at, "B": b})["C"], at[:, :8].T @ b, rtol=1e-5, atol=1e-5)
    # rows 8 floats apart (32 bytes) share lines: the reads stay as they are
    narrow = BROADCAST_T.replace("(16, 32) At", "(16, 8) At")
    assert "At_packed" not in str(pack_operands(parse_kernel(narrow), **PACKING))


CHANGES = [
    ("for c0 in 0:8 step 2", "for c0 in 0:2 step 2"),           # no reuse: one row block
    ("        for c3 in 0:8 vectorize(4) {", "        if c0 < 6 {\n        for c3 in 0:8 vectorize(4) {"),
    ("for c1 in 0:24 step 8", "for c1 in 0:min(24, 30 - c0) step 8"),   # bounds not constant
    ("B(c2, c1 + c3)", "B(c2, c1 + c3 / 2)"),                     # not a contiguous vector
]


@pytest.mark.unit
@pytest.mark.parametrize("change", CHANGES)
def test_what_the_pass_cannot_copy_exactly_or_would_not_reuse_stays(change):
    old, new = change
    text = MICRO.replace(old, new)
    if new.startswith("        if"):
        text = text.replace("        }\n      }\n    }\n  }\n}", "        }\n        }\n      }\n    }\n  }\n}")
    kernel = parse_kernel(text)
    assert pack_operands(kernel, **PACKING) == kernel
    # nor is a constant B where its reads are strided or move with loops of varying
    # bounds; one block of rows reuses nothing, and reads under a guard cannot be copied
    # in the kernel, but a constant B is packed before any call (every box, zeros past
    # its edge), at no cost to the call, and its panels then stream contiguously
    prepacked = pack_operands(kernel, frozenset({"B"}), **PACKING)
    assert ("B_prepacked" in str(prepacked)) == (change in CHANGES[:2])
    if "B_prepacked" in str(prepacked):
        a, b = RNG.standard_normal((8, 16)).astype(np.float32), RNG.standard_normal((16, 24)).astype(np.float32)
        np.testing.assert_allclose(interpret_kernel(prepacked, {"A": a, "B": b})["C"],
                                   interpret_kernel(kernel, {"A": a, "B": b})["C"], rtol=1e-5, atol=1e-5)


@pytest.mark.unit
def test_a_box_past_the_budget_is_not_packed():
    rows = BOX_BYTES // (4 * 24) + 1   # the 24-wide box of B, taller than the budget
    text = MICRO.replace("(16, 24) B", f"({rows}, 24) B").replace("(8, 16) A", f"(8, {rows}) A") \
        .replace("for c2 in 0:16", f"for c2 in 0:{rows}")
    kernel = parse_kernel(text)
    assert pack_operands(kernel, **PACKING) == kernel


MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
BMM_T = "def bmm(float(Bt,M,K) A, float(Bt,N,K) B) -> (C) { C(b,m,n) +=! A(b,m,k) * B(b,n,k) }"


@pytest.mark.parametrize("shape", [(1024, 1024, 1024), (197, 768, 300), (130, 257, 200)])
def test_native_matmuls_pack_their_panels_and_match_numpy(shape):
    M, K, N = shape
    a = RNG.standard_normal((M, K)).astype(np.float32)
    b = RNG.standard_normal((K, N)).astype(np.float32)
    kernel = pf.define(MM, target="host").mm
    spec = kernel.specialize(a, b)
    assert "local panel float32(" in spec.stages["loops"]      # the full tiles read packed panels
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=2e-4, atol=2e-3)


def test_a_parallel_kernel_packs_per_thread():
    a = RNG.standard_normal((300, 256)).astype(np.float32)
    b = RNG.standard_normal((256, 520)).astype(np.float32)
    kernel = pf.define(MM, target="host", options=MappingOptions(
        tile_sizes=(16, 128, 64), register_tile=(4, 32, 0), point_order=(2, 0, 1), vector_width=16,
        unroll=2, unroll_jam=4, reorder_reductions=True, num_threads=2)).mm
    spec = kernel.specialize(a, b)
    loops = spec.stages["loops"]
    assert "local panel float32(" in loops and loops.index("parallel for") < loops.index("_packed_0 in")
    for _ in range(3):   # the threads' panels do not mix
        np.testing.assert_allclose(kernel(a, b), a @ b, rtol=2e-4, atol=2e-3)


@needs_arm_tools
def test_aarch64_kernels_read_packed_panels():
    a = RNG.standard_normal((70, 96)).astype(np.float32)
    b = RNG.standard_normal((96, 80)).astype(np.float32)
    kernel = pf.define(MM, target="aarch64").mm
    spec = kernel.specialize(a, b)
    assert "local panel float32(" in spec.stages["loops"]
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=2e-4, atol=2e-3)


def test_a_kernel_given_constants_packs_them_per_call_when_run_alone():
    from polyfuse.frontends.tc import parse
    from polyfuse.runtime.kernel import Kernel
    from polyfuse.scheduler.pipeline import Usage
    a = RNG.standard_normal((197, 300)).astype(np.float32)
    b = RNG.standard_normal((300, 520)).astype(np.float32)
    target = pf.define(MM, target="host").mm.target
    kernel = Kernel(parse(MM).definitions[0], target, MM, usage=Usage(constants=frozenset({"B"})))
    assert "B_prepacked = pack B(" in kernel.specialize(a, b).stages["loops"]
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=2e-4, atol=2e-3)


def test_models_read_their_weights_packed_once():
    from onnx import TensorProto, helper, numpy_helper
    w = RNG.standard_normal((300, 520)).astype(np.float32)
    k = RNG.standard_normal((96, 3, 3, 40)).astype(np.float32) * 0.1
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]),
         helper.make_node("Conv", ["img", "k"], ["z"], pads=[1, 1, 1, 1])],
        "weights", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [197, 300]),
                    helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 40, 23, 23])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [197, 520]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 96, 23, 23])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(k.transpose(0, 3, 1, 2).copy(), "k")])
    model = pf.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), target="host")
    x = RNG.standard_normal((197, 300)).astype(np.float32)
    img = RNG.standard_normal((1, 40, 23, 23)).astype(np.float32)
    for _ in range(2):   # the packed copies are made once, then reused
        y, z = model(x, img)
        np.testing.assert_allclose(y, x @ w, rtol=2e-4, atol=2e-3)
    assert model.dump("loops").count("_prepacked = pack") >= 2
    import onnxruntime as ort
    session = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                                   .SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(z, session.run(None, {"x": x, "img": img})[1], rtol=1e-3, atol=1e-3)


def test_a_bundle_carries_packed_weights_not_the_originals(tmp_path):
    from onnx import TensorProto, helper, numpy_helper
    w = RNG.standard_normal((256, 512)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 512])], [numpy_helper.from_array(w, "w")])
    model = pf.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), target="host")
    x = RNG.standard_normal((64, 256)).astype(np.float32)
    np.testing.assert_allclose(model(x), x @ w, rtol=2e-4, atol=2e-3)
    assert "B_prepacked = pack B(" in model.dump("loops")
    layout = model.plan_for().program.layout
    assert sum(a.nbytes for a in layout.constants.values()) < 1.1 * w.nbytes   # not w twice


@pytest.mark.parametrize("target", ["host", pytest.param("aarch64", marks=needs_arm_tools)])
def test_micro_kernels_prefetch_the_prepacked_panels_they_stream(target):
    # each vector loop reading a panel packed at compile time prefetches its stream a few
    # KiB ahead (into L2: a hint, so past the panel's end too); panels the kernel packs
    # itself were just written and are not prefetched
    from polyfuse.frontends.tc import parse
    from polyfuse.runtime.kernel import Kernel
    from polyfuse.scheduler.pipeline import Usage
    from polyfuse.targets.llvm_kernel import PREFETCH_AHEAD
    a = RNG.standard_normal((53, 300)).astype(np.float32)
    b = RNG.standard_normal((300, 200)).astype(np.float32)
    tgt = pf.define(MM, target=target).mm.target
    kernel = Kernel(parse(MM).definitions[0], tgt, MM, usage=Usage(constants=frozenset({"B"})))
    llvm = kernel.specialize(a, b).stages["llvm"]
    calls = [ln for ln in llvm.splitlines() if 'call void @"llvm.prefetch.p0"(' in ln]
    assert calls and all("i32 0, i32 2, i32 1" in ln for ln in calls)
    assert f"i64 {PREFETCH_AHEAD}" in llvm
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=2e-4, atol=2e-3)
    plain = pf.define(MM, target=target).mm
    assert "llvm.prefetch" not in plain.specialize(a, b).stages["llvm"]
    np.testing.assert_allclose(plain(a, b), a @ b, rtol=2e-4, atol=2e-3)


# 22 columns in register blocks of 8 (vectors of 4): two full blocks and one of 6, each
# summing into its accumulators; the partial block reads the last panel of the same copy
def _edge_block(columns: str, acc: str, lanes: int) -> str:
    """One register block of EDGE: two rows of ``lanes`` columns summed into ``acc``."""
    sums = "\n".join(f"          {acc}({r}, c3) = {acc}({r}, c3) + A(c0{' + 1' if r else ''}, c2) * B(c2, c1 + c3)"
                     for r in (0, 1))
    return f"""    for c1 in {columns} step 8 {{
      for c3 in 0:{lanes} vectorize(4) {{
        {acc}(0, c3) = 0.0
        {acc}(1, c3) = 0.0
      }}
      for c2 in 0:16 {{
        for c3 in 0:{lanes} vectorize(4) {{
{sums}
        }}
      }}
      for c3 in 0:{lanes} vectorize(4) {{
        C(c0, c1 + c3) = {acc}(0, c3)
        C(c0 + 1, c1 + c3) = {acc}(1, c3)
      }}
    }}"""


EDGE = ("kernel mm(in float32(8, 16) A, in float32(16, 22) B, out float32(8, 22) C, local float32(2, 8) acc, "
        "local float32(2, 6) acc2) {\n  for c0 in 0:8 step 2 {\n"
        + _edge_block("0:16", "acc", 8) + "\n" + _edge_block("16:22", "acc2", 6) + "\n  }\n}")

EDGE_COPY = """  for B_packed_0 in 0:2 {
    for B_packed_1 in 0:16 {
      for B_packed_2 in 0:8 vectorize(4) {
        B_packed(B_packed_0, B_packed_1, B_packed_2) = B(B_packed_1, B_packed_0 * 8 + B_packed_2)
      }
    }
  }
  for B_packed_0 in 2:3 {
    for B_packed_1 in 0:16 {
      for B_packed_2 in 0:6 vectorize(4) {
        B_packed(B_packed_0, B_packed_1, B_packed_2) = B(B_packed_1, B_packed_0 * 8 + B_packed_2)
      }
      for B_packed_2 in 6:8 vectorize(4) {
        B_packed(B_packed_0, B_packed_1, B_packed_2) = 0.0
      }
    }
  }"""


@pytest.mark.unit
def test_a_partial_register_block_reads_a_zero_padded_last_panel_in_whole_vectors():
    rng = np.random.default_rng(21)
    a = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal((16, 22)).astype(np.float32)
    out = widen_partial_blocks(pack_operands(parse_kernel(EDGE), **PACKING))
    text = str(out)
    # one copy: two whole panels of 8 columns and a last one of 6, its lanes 6:8 zeroed
    assert "local panel float32(3, 16, 8) B_packed" in text and EDGE_COPY in text, text
    assert text.count("A(c0, c2) * B_packed(c1 / 8, c2, c3)") == 2
    # the partial block sets and sums its accumulators over two whole vectors (8 lanes,
    # the last two adding zeros) and stores its 6 columns
    assert "local float32(2, 8) acc2" in text
    partial = text[text.index("for c1 in 16:22"):]
    assert partial.count("for c3 in 0:8 vectorize(4)") == 2 and partial.count("for c3 in 0:6 vectorize(4)") == 1
    assert parse_kernel(text) == out
    np.testing.assert_allclose(interpret_kernel(out, {"A": a, "B": b})["C"], a @ b, rtol=1e-5, atol=1e-5)
    # a constant B: its boxes packed before the kernel runs, the lanes past column 22 zero
    pre = widen_partial_blocks(pack_operands(parse_kernel(EDGE), frozenset({"B"}), **PACKING))
    packed = pre.buffer("B_prepacked")
    assert packed.shape == (3, 16, 8) and str(packed.packing) == "pack B(p1, 8*p0 + p2) padded"
    assert parse_kernel(str(pre)) == pre and "local float32(2, 8) acc2" in str(pre)
    given = packed.packing.apply(b, packed.shape)
    np.testing.assert_array_equal(given[2, :, 6:], 0)
    np.testing.assert_array_equal(given[2, :, :6], b[:, 16:])
    for inputs in ({"A": a, "B": b}, {"A": a, "B": b, "B_prepacked": given}):
        np.testing.assert_allclose(interpret_kernel(pre, inputs)["C"], a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.unit
def test_an_accumulator_a_loop_cannot_widen_stays_as_wide_as_its_block():
    # the partial block's sum also reads C along its columns: C has no padded lanes, so
    # neither that loop nor the accumulator's other loops widen
    text = EDGE.replace("acc2(0, c3) = acc2(0, c3) + A(c0, c2) * B(c2, c1 + c3)",
                        "acc2(0, c3) = acc2(0, c3) + A(c0, c2) * B(c2, c1 + c3) + C(c0, c1 + c3) * 0.0")
    out = str(widen_partial_blocks(pack_operands(parse_kernel(text), **PACKING)))
    assert "local float32(2, 8) acc, local float32(2, 6) acc2" in out
    assert "for c3 in 0:8 vectorize(4)" not in out[out.index("for c1 in 16:22"):]


@pytest.mark.unit
def test_a_padded_packing_holds_zeros_past_its_source():
    from polyfuse.errors import IRVerificationError
    from polyfuse.ir.loops import Packing
    b = np.arange(12, dtype=np.float32).reshape(2, 6)
    plain = Packing("B", (0, 0), ((0, 1, 0), (4, 0, 1)))      # panels of 4 columns
    with pytest.raises(IRVerificationError, match="reads outside its source"):
        plain.apply(b, (2, 2, 4))
    got = replace(plain, padded=True).apply(b, (2, 2, 4))
    np.testing.assert_array_equal(got[0], b[:, :4])
    np.testing.assert_array_equal(got[1, :, :2], b[:, 4:])
    np.testing.assert_array_equal(got[1, :, 2:], 0)


@pytest.mark.parametrize("shape", [(1024, 1024, 1000), (999, 999, 999), (197, 768, 1000), (300, 257, 40)])
def test_native_matmuls_with_partial_register_blocks_match_numpy(shape):
    # 1000 columns end in a block of 40, 999 in one of 39 (and a last reduction panel of
    # 487 steps, packed into the same copy as the whole ones): both run three whole
    # vectors of 16 over zero-padded panels
    M, K, N = shape
    a = RNG.standard_normal((M, K)).astype(np.float32)
    b = RNG.standard_normal((K, N)).astype(np.float32)
    kernel = pf.define(MM, target="host").mm
    loops = avx512_loops(MM, a, b)
    if N > 64:
        assert "for c8 in 0:48 vectorize(16)" in loops and "B_packed2" not in loops
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=2e-4, atol=3e-3)


def test_a_model_with_a_partial_register_block_reads_its_weights_prepacked_and_padded():
    import onnx
    import onnx.helper as oh
    import onnxruntime as ort
    rng = np.random.default_rng(8)
    w = (rng.standard_normal((512, 1000)) * 0.05).astype(np.float32)
    g = oh.make_graph([oh.make_node("MatMul", ["x", "w"], ["y"])], "g",
                      [oh.make_tensor_value_info("x", 1, [200, 512])],
                      [oh.make_tensor_value_info("y", 1, [200, 1000])], [onnx.numpy_helper.from_array(w, "w")])
    model = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)]).SerializeToString()
    x = rng.standard_normal((200, 512)).astype(np.float32)
    compiled = pf.compile(model, target="host")
    got = compiled.run({"x": x})["y"]
    loops = compiled.dump("loops")
    assert ") padded" in loops and "_packed(" not in loops   # every tile reads prepacked panels
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def test_a_whole_reduction_panel_that_l2_holds_is_copied_once_per_column_tile():
    # 768 steps x 256 columns (768 KiB, a transformer's product) stay one panel; its copy
    # is made once per column tile, before the row tiles, not per register block and row tile
    a = RNG.standard_normal((197, 768)).astype(np.float32)
    b = RNG.standard_normal((768, 3072)).astype(np.float32)
    kernel = pf.define(MM, target="host").mm
    loops = avx512_loops(MM, a, b)
    assert "local panel float32(4, 768, 64) B_packed" in loops
    assert loops.index("B_packed_0 in") < loops.index("for c2 in")
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=2e-4, atol=3e-3)


def test_a_constant_operand_narrower_than_its_panel_is_prepacked_in_whole_vectors():
    """ShuffleNet's 1x1 convolutions over 58 channels: the weights are one panel of
    whole rows, 58 columns read by a block of 64; prepacked, their lanes past 58 are
    zeros and the block runs in whole vectors (not 3 vectors, 8 lanes and 2 masked ones
    a step), where a panel of exactly 64 columns stays as it is. Results against
    onnxruntime."""
    import onnx
    import onnx.helper as oh
    import onnxruntime as ort
    rng = np.random.default_rng(9)
    for channels, packed in ((58, True), (64, False)):
        w = (rng.standard_normal((channels, channels, 1, 1)) * 0.1).astype(np.float32)
        g = oh.make_graph([oh.make_node("Conv", ["x", "w"], ["c"]), oh.make_node("Relu", ["c"], ["y"])], "g",
                          [oh.make_tensor_value_info("x", 1, [1, channels, 28, 28])],
                          [oh.make_tensor_value_info("y", 1, [1, channels, 28, 28])],
                          [onnx.numpy_helper.from_array(w, "w")])
        model = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)]).SerializeToString()
        x = rng.standard_normal((1, channels, 28, 28)).astype(np.float32)
        compiled = pf.compile(model, target="host")
        want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(compiled.run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)
        loops = compiled.dump("loops")
        assert ("_prepacked = pack" in loops) == packed, loops
        if packed:
            assert ") padded" in loops and "in 0:64 vectorize" in loops, loops   # the block's whole vectors


def test_an_operand_narrower_than_its_panel_is_copied_per_call_in_whole_vectors():
    """The same for an operand given at run time: its one panel of 58 columns is copied
    per call into a zero-padded panel of 64, which the block reads in whole vectors."""
    a = RNG.standard_normal((784, 58)).astype(np.float32)
    b = RNG.standard_normal((58, 58)).astype(np.float32)
    kernel = pf.define(MM, target="host").mm
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=2e-4, atol=2e-3)
    loops = kernel.specialize(a, b).stages["loops"]
    assert "B_packed" in loops and "in 0:64 vectorize" in loops, loops
