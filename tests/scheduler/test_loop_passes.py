"""Loop-IR passes, filecheck style: a kernel's text goes through one pass, the result
prints as the expected text, parses back to an equal kernel, and computes what numpy
does (with the loop interpreter)."""

import re
from dataclasses import replace

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.errors import IRVerificationError
from polyfuse.frontends.loop_ir import parse_kernel
from polyfuse.frontends.tc import parse_definition
from polyfuse.ir.comprehension import Binary, BinaryOp, IndexVar, Literal, Read
from polyfuse.ir.limits import MAX_NEST_DEPTH
from polyfuse.ir.loops import For, LoopKernel, Store, map_loops, rewrite
from polyfuse.ir.loops_interpreter import interpret_kernel
from polyfuse.ir.passes import Pass
from polyfuse.ir.types import DType
from polyfuse.scheduler.gpu_heuristics import default_gpu_options
from polyfuse.scheduler.gpu_mapping import DeviceLimits
from polyfuse.scheduler.loop_passes import (LoopPassManager, drop_dead_stores, fuse_epilogues, promote_accumulators,
                                             promote_register_blocks, unroll_and_jam)
from polyfuse.scheduler.options import MappingOptions
from polyfuse.scheduler.pipeline import schedule_definition, schedule_gpu_definition
from polyfuse.ir.machine import DEFAULT_MACHINE

RNG = np.random.default_rng(7)
A = RNG.standard_normal((4, 3)).astype(np.float32)
B = RNG.standard_normal((3, 6)).astype(np.float32)

MM = """kernel mm(in float32(4, 3) A, in float32(3, 6) B, out float32(4, 6) C) {
  for c0 in 0:4 {
    for c1 in 0:6 {
      for c2 in 0:3 {
        C(c0, c1) = C(c0, c1) + A(c0, c2) * B(c2, c1)
      }
    }
  }
}"""

MM_JAMMED_3 = """kernel mm(in float32(4, 3) A, in float32(3, 6) B, out float32(4, 6) C) {
  for c0 in 0:4 {
    for c1 in 0:6 step 3 {
      for c2 in 0:3 {
        C(c0, c1) = C(c0, c1) + A(c0, c2) * B(c2, c1)
        C(c0, c1 + 1) = C(c0, c1 + 1) + A(c0, c2) * B(c2, c1 + 1)
        C(c0, c1 + 2) = C(c0, c1 + 2) + A(c0, c2) * B(c2, c1 + 2)
      }
    }
  }
}"""

ROWSUM = """kernel rowsum(in float32(4, 3) A, out float32(4) O) {
  for c0 in 0:4 {
    for c1 in 0:3 {
      O(c0) = O(c0) + A(c0, c1)
    }
  }
}"""

ROWSUM_PROMOTED = """kernel rowsum(in float32(4, 3) A, out float32(4) O) {
  for c0 in 0:4 {
    let acc1 = O(c0)
    for c1 in 0:3 {
      let acc1 = acc1 + A(c0, c1)
    }
    O(c0) = acc1
  }
}"""


def check(kernel: LoopKernel, expected: str) -> None:
    """``kernel`` prints as ``expected`` and parses back to itself."""
    assert str(kernel) == expected
    assert parse_kernel(expected) == kernel


@pytest.mark.unit
def test_unroll_and_jam_jams_copies_of_the_loop_around_the_innermost():
    out = unroll_and_jam(parse_kernel(MM), 3)
    check(out, MM_JAMMED_3)
    np.testing.assert_allclose(interpret_kernel(out, {"A": A, "B": B})["C"], A @ B, rtol=1e-5)


@pytest.mark.unit
@pytest.mark.parametrize("factor", [1, 4])   # 1: no jam; 4 does not divide 6 trips
def test_unroll_and_jam_leaves_loops_it_cannot_jam(factor):
    check(unroll_and_jam(parse_kernel(MM), factor), MM)


@pytest.mark.unit
def test_promote_accumulators_keeps_the_sum_in_a_local():
    out = promote_accumulators(parse_kernel(ROWSUM))
    check(out, ROWSUM_PROMOTED)
    np.testing.assert_allclose(interpret_kernel(out, {"A": A})["O"], A.sum(axis=1), rtol=1e-6)


SUMS = """kernel sums(in float32(4, 3) A, out float32(4) O, out float32(4, 3) P) {
  for c0 in 0:4 {
    for c1 in 0:3 {
      P(c0, c1) = A(c0, c1)
    }
    for c1 in 0:3 {
      O(c0) = O(c0) + A(c0, c1)
    }
    for c1 in 0:3 {
      O(c0) = O(c0) * A(c0, c1)
    }
  }
}"""

SUMS_PROMOTED = """kernel sums(in float32(4, 3) A, out float32(4) O, out float32(4, 3) P) {
  for c0 in 0:4 {
    for c1 in 0:3 {
      P(c0, c1) = A(c0, c1)
    }
    let acc1 = O(c0)
    for c1 in 0:3 {
      let acc1 = acc1 + A(c0, c1)
    }
    O(c0) = acc1
    let acc2 = O(c0)
    for c1 in 0:3 {
      let acc2 = acc2 * A(c0, c1)
    }
    O(c0) = acc2
  }
}"""


@pytest.mark.unit
def test_promote_accumulators_numbers_accumulators_in_order_and_skips_what_it_cannot_keep():
    out = promote_accumulators(parse_kernel(SUMS))
    check(out, SUMS_PROMOTED)   # P's store moves with c1: not an accumulation
    got = interpret_kernel(out, {"A": A})
    np.testing.assert_allclose(got["O"], A.sum(axis=1) * A.prod(axis=1), rtol=1e-5)
    np.testing.assert_array_equal(got["P"], A)
    parallel = parse_kernel(ROWSUM.replace("for c1", "parallel for c1"))
    assert promote_accumulators(parallel) == parallel


@pytest.mark.unit
def test_the_pipeline_keeps_the_loops_after_each_named_pass():
    d = parse_definition("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
    stages: dict[str, str] = {}
    kernel = schedule_definition(d, {"M": 4, "K": 3, "N": 6}, MappingOptions(unroll_jam=3), stages)
    names = [s for s in stages if s.startswith("loops")]
    assert names == ["loops:lower_schedule", "loops:separate_full_tiles", "loops:unroll_and_jam",
                     "loops:promote_accumulators", "loops:promote_register_blocks", "loops:fuse_epilogues",
                     "loops:drop_dead_stores", "loops:pack_operands", "loops:widen_partial_blocks", "loops"]
    assert stages["loops:lower_schedule"] == MM and stages["loops:unroll_and_jam"] == MM_JAMMED_3
    assert stages["loops"] == stages["loops:widen_partial_blocks"] == str(kernel)
    for name in names:
        got = interpret_kernel(parse_kernel(stages[name]), {"A": A, "B": B})["C"]
        np.testing.assert_allclose(got, A @ B, rtol=1e-5, err_msg=name)


def test_a_specialized_kernel_shows_the_loops_after_each_pass():
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    spec = pf.define("def rowsum(float(M,K) A) -> (O) { O(m) +=! A(m,k) }", target="x86") \
        .rowsum.specialize(x)
    lowered, promoted = spec.stages["loops:lower_schedule"], spec.stages["loops:promote_accumulators"]
    assert "let acc" not in lowered and "let acc1 = acc1 + A(c0, c1)" in promoted
    assert spec.stages["loops"] == promoted
    for text in (lowered, promoted):
        assert str(parse_kernel(text)) == text


@pytest.mark.unit
def test_gpu_kernels_keep_the_loops_and_the_gpu_kernel_after_each_pass():
    d = parse_definition("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
    sizes = {"M": 64, "K": 64, "N": 64}
    options = default_gpu_options(d, sizes)
    for private in (False, True):   # True last: its stages are checked below
        stages: dict[str, str] = {}
        schedule_gpu_definition(d, sizes, replace(options, use_private_memory=private,
                                                  use_shared_memory=private), DeviceLimits(), stages)
        passes = ["loops:promote_accumulators"] if private else []
        assert [s for s in stages if s.startswith("loops")] == ["loops:lower_schedule", *passes, "loops"]
        assert ("let acc1" in stages["loops"]) is private
        shared = ["gpu:promote_to_shared"] if private else []
        pipelined = ["gpu:pipeline_copies", "gpu:use_matrix_units"] if private else []
        gpu = ["gpu:map_to_gpu", "gpu:fuse_epilogues", "gpu:fuse_launches", *shared, "gpu:hoist_reciprocals", "gpu:place_barriers",
               *pipelined, "gpu"]
        assert [s for s in stages if s.startswith("gpu")] == gpu
        assert stages["gpu"] == stages[gpu[-2]]
    assert "copy A_s0 <- A(c0, c2)" not in stages["gpu:map_to_gpu"]
    before, after = stages["gpu:promote_to_shared"], stages["gpu:place_barriers"]
    assert "copy A_s0 <- A(c0, c2)\n          copy B_s1 <- B(c2, c1)\n          for c5" in before
    assert "copy B_s1 <- B(c2, c1)\n          barrier\n          for c5" in after
    assert "copy async B_s1[(c2 / 16 + 1) % 2] <- B(c2 + 16, c1)" in stages["gpu:pipeline_copies"]


@pytest.mark.unit
def test_rewrite_splices_drops_and_maps_after_the_children():
    k = parse_kernel(ROWSUM)
    store = k.body[0].body[0].body[0]
    doubled = rewrite(k, pre=lambda s: (s, s) if isinstance(s, Store) else None)
    assert str(doubled).count("O(c0) = O(c0) + A(c0, c1)") == 2
    assert rewrite(k, pre=lambda s: () if s == store else None).body[0].body[0].body == ()
    seen: list[str] = []
    rewrite(k, post=lambda s: seen.append(s.var if isinstance(s, For) else "store"))
    assert seen == ["store", "c1", "c0"]
    assert map_loops(k.body, lambda f: replace(f, unroll=2)) == rewrite(
        k.body, post=lambda s: replace(s, unroll=2) if isinstance(s, For) else None)


@pytest.mark.unit
def test_the_loop_pass_manager_verifies_and_names_the_pass_that_broke_a_kernel():
    def drop_outer_loop(k: LoopKernel) -> LoopKernel:
        return replace(k, body=k.body[0].body)

    manager = LoopPassManager([Pass("jam", lambda k: unroll_and_jam(k, 2)), drop_outer_loop], verify=True)
    with pytest.raises(IRVerificationError, match="in loop pass 'drop_outer_loop' on kernel 'mm'"):
        manager.run(parse_kernel(MM))
    keep = LoopPassManager([Pass("jam", lambda k: unroll_and_jam(k, 3))], keep=True)
    assert keep.run(parse_kernel(MM)) == parse_kernel(MM_JAMMED_3)
    assert keep.dumps == [("input", MM), ("jam", MM_JAMMED_3)]
    assert [name for name, _ in keep.times] == ["jam"]


@pytest.mark.unit
def test_the_passes_walk_the_deepest_nest_a_kernel_may_have_from_a_deep_caller():
    i64, f32 = DType.INT64, DType.FLOAT32
    base = parse_kernel(ROWSUM)
    acc = Read("O", (IndexVar("c0"),), f32)
    body: tuple = (Store("O", (IndexVar("c0"),), Binary(BinaryOp.ADD, acc, Literal(1.0, f32), f32)),)
    for depth in range(MAX_NEST_DEPTH - 1, 0, -1):
        body = (For(f"d{depth}", Literal(0, i64), Literal(1, i64), body),)
    kernel = replace(base, body=(For("c0", Literal(0, i64), Literal(4, i64), body),))

    def deep(n: int) -> LoopKernel:
        return deep(n - 1) if n else promote_accumulators(unroll_and_jam(kernel, 2))

    out = deep(400)
    assert "let acc1 = acc1 + 1.0" in str(out) and parse_kernel(str(out)) == out
    np.testing.assert_array_equal(interpret_kernel(out, {"A": A})["O"], np.ones(4, np.float32))


def test_a_model_dumps_its_kernels_after_each_loop_pass():
    from tests.onnx.test_frontend import mlp
    model = pf.compile(mlp(), target="host")
    model.run({"x": np.ones((2, 16), np.float32)})
    first = model.dump("loops:lower_schedule")
    assert first.startswith("// g0[fc1 bias1 relu1]") and "kernel fused(" in first
    assert model.dump("loops").split("\n", 1)[1] in model.dump("loops:widen_partial_blocks")
    with pytest.raises(pf.ArgumentError, match="no stage 'loops:bogus'.*loops:unroll_and_jam"):
        model.dump("loops:bogus")


# a 2 x 5 register block of a 4 x 10 x 6 matmul: rows c1 jammed, columns c2 a vector
# loop (5 wide: no multiple of any SIMD width), the reduction c3 outside the block
BLOCK = """kernel mm(in float32(4, 6) A, in float32(6, 10) B, out float32(4, 10) C) {
  for c0 in 0:10 step 5 {
    for c1 in 0:4 step 2 {
      for c3 in 0:6 {
        for c2 in 0:5 vectorize(16) {
          C(c1, c0 + c2) = C(c1, c0 + c2) + A(c1, c3) * B(c3, c0 + c2)
          C(c1 + 1, c0 + c2) = C(c1 + 1, c0 + c2) + A(c1 + 1, c3) * B(c3, c0 + c2)
        }
      }
    }
  }
}"""

BLOCK_PROMOTED = """kernel mm(in float32(4, 6) A, in float32(6, 10) B, out float32(4, 10) C, local float32(2, 5) acc) {
  for c0 in 0:10 step 5 {
    for c1 in 0:4 step 2 {
      for c2 in 0:5 vectorize(16) {
        acc(0, c2) = C(c1, c0 + c2)
        acc(1, c2) = C(c1 + 1, c0 + c2)
      }
      for c3 in 0:6 {
        for c2 in 0:5 vectorize(16) {
          acc(0, c2) = acc(0, c2) + A(c1, c3) * B(c3, c0 + c2)
          acc(1, c2) = acc(1, c2) + A(c1 + 1, c3) * B(c3, c0 + c2)
        }
      }
      for c2 in 0:5 vectorize(16) {
        C(c1, c0 + c2) = acc(0, c2)
        C(c1 + 1, c0 + c2) = acc(1, c2)
      }
    }
  }
}"""


# what promote_register_blocks makes of a sum: acc starts at zero and is added once
BLOCK_SUMMED = BLOCK_PROMOTED.replace("acc(0, c2) = C(c1, c0 + c2)", "acc(0, c2) = 0.0").replace(
    "acc(1, c2) = C(c1 + 1, c0 + c2)", "acc(1, c2) = 0.0").replace(
    "C(c1, c0 + c2) = acc(0, c2)", "C(c1, c0 + c2) = C(c1, c0 + c2) + acc(0, c2)").replace(
    "C(c1 + 1, c0 + c2) = acc(1, c2)", "C(c1 + 1, c0 + c2) = C(c1 + 1, c0 + c2) + acc(1, c2)")

# BLOCK with its reduction tiled: c9 around the block, c3 the point loop
TILED_BLOCK = BLOCK.replace("    for c1 in 0:4 step 2 {\n", "    for c9 in 0:6 step 3 {\n    for c1 in 0:4 step 2 {\n") \
    .replace("      for c3 in 0:6 {", "      for c3 in 0:3 {").replace("    }\n  }\n}", "    }\n    }\n  }\n}") \
    .replace(", c3)", ", c9 + c3)").replace("B(c3,", "B(c9 + c3,")


@pytest.mark.unit
def test_register_blocks_keep_their_accumulators_in_a_local_array_across_the_reduction():
    """A sum's block starts its accumulators at zero and adds them to C after the
    reduction (C's loads then wait on nothing); C's initial values still count."""
    a, b = RNG.standard_normal((4, 6)).astype(np.float32), RNG.standard_normal((6, 10)).astype(np.float32)
    c = RNG.standard_normal((4, 10)).astype(np.float32)
    out = promote_register_blocks(parse_kernel(BLOCK))
    check(out, BLOCK_SUMMED)
    got = c.copy()
    interpret_kernel(out, {"A": a, "B": b, "C": got})   # C given: updated in place
    np.testing.assert_allclose(got, c + a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.unit
def test_a_block_that_is_not_a_sum_loads_its_accumulators():
    """``max`` has no zero to start from: the block loads C and stores acc back."""
    a, b = RNG.standard_normal((4, 6)).astype(np.float32), RNG.standard_normal((6, 10)).astype(np.float32)
    maxed = BLOCK.replace("C(c1, c0 + c2) + A(c1, c3) * B(c3, c0 + c2)", "max(C(c1, c0 + c2), A(c1, c3) * B(c3, c0 + c2))")\
        .replace("C(c1 + 1, c0 + c2) + A(c1 + 1, c3) * B(c3, c0 + c2)", "max(C(c1 + 1, c0 + c2), A(c1 + 1, c3) * B(c3, c0 + c2))")
    out = promote_register_blocks(parse_kernel(maxed))
    text = str(out)
    assert "acc(0, c2) = C(c1, c0 + c2)" in text and "C(c1, c0 + c2) = acc(0, c2)" in text, text
    got = np.full((4, 10), -np.inf, np.float32)
    interpret_kernel(out, {"A": a, "B": b, "C": got})
    np.testing.assert_allclose(got, (a[:, :, None] * b[None]).max(1), rtol=1e-6)


@pytest.mark.unit
def test_an_epilogue_after_summed_blocks_of_a_tiled_reduction_reads_the_whole_sum():
    """The blocks of a reduction tile add their sums to C; on the last tile the epilogue
    applies to C as stored (C plus acc), not to acc alone nor twice."""
    a, b = RNG.standard_normal((4, 6)).astype(np.float32), RNG.standard_normal((6, 10)).astype(np.float32)
    bias = RNG.standard_normal(10).astype(np.float32)
    promoted = str(promote_register_blocks(parse_kernel(TILED_BLOCK)))
    with_epilogue = promoted.replace("out float32(4, 10) C,", "in float32(10) D, out float32(4, 10) Y, out float32(4, 10) C,")\
        [:-2] + """  for c4 in 0:4 {
    for c5 in 0:10 vectorize(16) {
      Y(c4, c5) = max(C(c4, c5) + D(c5), 0.0)
    }
  }
}"""
    out = fuse_epilogues(parse_kernel(with_epilogue), frozenset({"C", "Y"}))
    text = str(out)
    assert "for c4" not in text and "Y(c1, c0 + c2) = max(C(c1, c0 + c2) + D(c0 + c2), 0.0)" in text, text
    got = interpret_kernel(out, {"A": a, "B": b, "D": bias})["Y"]
    np.testing.assert_allclose(got, np.maximum(a @ b + bias, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.unit
@pytest.mark.parametrize("change", [
    ("C(c1 + 1, c0 + c2) = C(c1 + 1, c0 + c2) +", "C(c1 + 1, c0 + c2) = C(c1, c0 + c2) +"),  # reads row 0
    ("C(c1 + 1, c0 + c2) = C(c1 + 1, c0 + c2) +", "C(c1, c0 + c2) = C(c1, c0 + c2) +"),      # one element twice
    ("C(c1, c0 + c2) = C(c1, c0 + c2) +", "C(c1 + c3, c0 + c2) = C(c1 + c3, c0 + c2) +"),   # moves with c3
    ("for c2 in 0:5 vectorize(16)", "for c2 in 0:5"),                                       # no vector loop
])
def test_register_blocks_are_left_alone_where_hoisting_would_change_the_result(change):
    kernel = parse_kernel(BLOCK.replace(*change).replace("in float32(4, 6) A", "in float32(9, 6) A")
                          .replace("out float32(4, 10) C", "out float32(9, 10) C"))
    assert promote_register_blocks(kernel) == kernel


# BLOCK_PROMOTED with a bias and ReLU epilogue as a nest of its own (T the product)
EPILOGUE = BLOCK_PROMOTED.replace("out float32(4, 10) C,", "in float32(10) D, out float32(4, 10) Y, "
                                  "out float32(4, 10) C,").replace("""      }
    }
  }
}""", """      }
    }
  }
  for c4 in 0:4 {
    for c5 in 0:10 vectorize(16) {
      Y(c4, c5) = max(C(c4, c5) + D(c5), 0.0)
    }
  }
}""")


@pytest.mark.unit
def test_an_epilogue_nest_runs_in_the_register_blocks_stores():
    """The bias and ReLU apply to the accumulators where the block stores them, and the
    epilogue nest goes; the product is still stored (a TC caller may read it)."""
    a, b = RNG.standard_normal((4, 6)).astype(np.float32), RNG.standard_normal((6, 10)).astype(np.float32)
    bias = RNG.standard_normal(10).astype(np.float32)
    out = fuse_epilogues(parse_kernel(EPILOGUE), frozenset({"C"}))
    text = str(out)
    assert "for c4" not in text and "C(c1, c0 + c2) = acc(0, c2)" in text, text
    assert "Y(c1 + 1, c0 + c2) = max(acc(1, c2) + D(c0 + c2), 0.0)" in text, text
    got = interpret_kernel(out, {"A": a, "B": b, "D": bias})
    np.testing.assert_allclose(got["Y"], np.maximum(a @ b + bias, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["C"], a @ b, rtol=1e-5, atol=1e-6)


@pytest.mark.unit
def test_an_epilogue_after_a_tiled_reduction_runs_on_its_last_tile():
    """With the reduction tiled (c9 outside the block), the block stores partial sums on
    every tile and applies the epilogue on the last one only."""
    a, b = RNG.standard_normal((4, 6)).astype(np.float32), RNG.standard_normal((6, 10)).astype(np.float32)
    bias = RNG.standard_normal(10).astype(np.float32)
    tiled = EPILOGUE.replace("    for c1 in 0:4 step 2 {\n", "    for c9 in 0:6 step 3 {\n    for c1 in 0:4 step 2 {\n") \
        .replace("      for c3 in 0:6 {", "      for c3 in c9:c9 + 3 {").replace("""    }
  }
  for c4""", """    }
    }
  }
  for c4""")
    out = fuse_epilogues(parse_kernel(tiled), frozenset({"C"}))
    text = str(out)
    assert "if c9 == 3 {" in text and "C(c1, c0 + c2) = acc(0, c2)" in text and "for c4" not in text, text
    got = interpret_kernel(out, {"A": a, "B": b, "D": bias})["Y"]
    np.testing.assert_allclose(got, np.maximum(a @ b + bias, 0), rtol=1e-5, atol=1e-6)


@pytest.mark.unit
@pytest.mark.parametrize("change", [
    ("Y(c4, c5) = max(C(c4, c5) + D(c5), 0.0)", "Y(c4, c5) = max(C(c4, c5) + D(9 - c5), 0.0)"),  # D reversed
    ("Y(c4, c5) = max(C(c4, c5) + D(c5), 0.0)", "Y(c4, c5) = C(c4, 9 - c5)"),                  # T reversed
    ("Y(c4, c5) = max(C(c4, c5) + D(c5), 0.0)", "Y(c4, c5) = C(c4, c5) + c5"),                 # its position
    ("Y(c4, c5) = max(C(c4, c5) + D(c5), 0.0)", "Y(c4, c5) = A(c4, 0)"),                       # not T
])
def test_epilogues_that_do_not_read_the_block_element_for_element_stay_apart(change):
    kernel = parse_kernel(EPILOGUE.replace(*change))
    assert fuse_epilogues(kernel, frozenset({"C"})) == kernel


@pytest.mark.unit
def test_an_epilogue_stays_apart_from_blocks_that_store_only_part_of_the_product():
    """C's first rows come from a nest of their own and the blocks store the last two:
    applied in the blocks, the epilogue would write only Y's last rows. Nor does it fuse
    when nothing says one statement writes C whole."""
    partial = EPILOGUE.replace("    for c1 in 0:4 step 2 {", "    for c1 in 2:4 step 2 {").replace(
        "  for c0 in 0:10 step 5 {", "  for c7 in 0:2 {\n    for c8 in 0:10 {\n      C(c7, c8) = 1.0\n"
        "    }\n  }\n  for c0 in 0:10 step 5 {", 1)
    kernel = parse_kernel(partial)
    assert fuse_epilogues(kernel, frozenset({"C", "Y"})) == kernel
    assert fuse_epilogues(parse_kernel(EPILOGUE)) == parse_kernel(EPILOGUE)


@pytest.mark.unit
def test_a_discarded_product_is_not_stored_once_its_epilogue_runs_in_the_blocks():
    """A plan's step discards the product C (a private temporary): after epilogue fusion
    nothing reads C, so its stores go; Y is unchanged. With the reduction tiled, the
    blocks read C back between tiles (as they do here from the start), so its stores stay."""
    a, b = RNG.standard_normal((4, 6)).astype(np.float32), RNG.standard_normal((6, 10)).astype(np.float32)
    bias = RNG.standard_normal(10).astype(np.float32)
    zeroed = EPILOGUE.replace("acc(0, c2) = C(c1, c0 + c2)", "acc(0, c2) = 0.0").replace(
        "acc(1, c2) = C(c1 + 1, c0 + c2)", "acc(1, c2) = 0.0")
    fused = fuse_epilogues(parse_kernel(zeroed), frozenset({"C"}))
    out = drop_dead_stores(fused, frozenset({"C"}))
    assert "C(c1, c0 + c2) = " not in str(out) and "Y(c1 + 1, c0 + c2) = max(acc(1, c2)" in str(out), str(out)
    got = interpret_kernel(out, {"A": a, "B": b, "D": bias})
    np.testing.assert_allclose(got["Y"], np.maximum(a @ b + bias, 0), rtol=1e-5, atol=1e-6)
    assert drop_dead_stores(fused) == fused   # nothing discarded: a TC caller gets C back
    tiled = fuse_epilogues(parse_kernel(EPILOGUE.replace(
        "    for c1 in 0:4 step 2 {\n", "    for c9 in 0:6 step 3 {\n    for c1 in 0:4 step 2 {\n")
        .replace("      for c3 in 0:6 {", "      for c3 in c9:c9 + 3 {").replace("  for c4 in 0:4 {", "  }\n  for c4 in 0:4 {")),
        frozenset({"C"}))
    assert drop_dead_stores(tiled, frozenset({"C"})) == tiled


def test_a_models_fused_kernels_do_not_store_their_private_temporaries():
    """A fusion group's intermediate (the product before its bias and ReLU) is a private
    temporary of the plan's step: the kernel writes only what the graph reads."""
    from tests.onnx.test_frontend import mlp
    model = pf.compile(mlp(), target="host")
    x = RNG.standard_normal((2, 16)).astype(np.float32)
    got = model.run({"x": x})
    want = pf.compile(mlp(), target="reference").run({"x": x})
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
    (step, kernel), *_ = model._latest_plan("x").steps()
    assert step.temporaries, "the group should keep its product as a temporary"
    private = [t.name for t in step.definition.outputs[len(step.outputs):]]
    stores = [line.split("(")[0].strip() for line in kernel.stages["loops"].splitlines() if " = " in line]
    assert not set(private) & set(stores), kernel.stages["loops"]


@pytest.mark.parametrize("k", [64, 9100])   # one reduction tile; several, the last partial
def test_a_tc_product_and_its_epilogue_both_come_back(k):
    """On the host the epilogue runs in the product's register blocks; the product, an
    output of the definition, still holds the sums."""
    mm = pf.define("def f(float(M,K) A, float(K,N) B, float(N) D) -> (Y, T) {\n"
                   "  T(m, n) +=! A(m, k) * B(k, n)\n  Y(m, n) = max(T(m, n) + D(n), 0.0)\n}",
                   target="host").f
    a, b = RNG.standard_normal((128, k)).astype(np.float32), RNG.standard_normal((k, 128)).astype(np.float32)
    d = RNG.standard_normal(128).astype(np.float32)
    spec = mm.specialize(a, b, d)
    # one tile: the epilogue reads the accumulators; several: T as the last tile's blocks add to it
    applied = "max(acc" if k == 64 else "max(T(c"
    assert "loops:fuse_epilogues" in spec.stages and applied in spec.stages["loops"], spec.stages["loops"]
    y, t = spec(a, b, d)
    np.testing.assert_allclose(t, a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y, np.maximum(a @ b + d, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.unit
def test_a_block_summing_the_whole_reduction_into_a_zeroed_output_starts_at_zero():
    """C starts as zeros (a +=!'s output) and one block sums all of k: its accumulators
    start at 0 instead of loading C, and C is reported initialized (the runtime need not
    fill it). With the reduction tiled (c9 around the block) they load the partial sums."""
    a, b = RNG.standard_normal((4, 6)).astype(np.float32), RNG.standard_normal((6, 10)).astype(np.float32)
    initialized: set[str] = set()
    out = promote_register_blocks(parse_kernel(BLOCK), frozenset({"C"}), initialized)
    assert "acc(1, c2) = 0.0" in str(out) and "= C(" not in str(out) and initialized == {"C"}
    np.testing.assert_allclose(interpret_kernel(out, {"A": a, "B": b})["C"], a @ b, rtol=1e-5, atol=1e-6)
    initialized = set()
    out = promote_register_blocks(parse_kernel(TILED_BLOCK), frozenset({"C"}), initialized)
    assert "C(c1 + 1, c0 + c2) = C(c1 + 1, c0 + c2) + acc(1, c2)" in str(out) and not initialized
    np.testing.assert_allclose(interpret_kernel(out, {"A": a, "B": b})["C"], a @ b, rtol=1e-5, atol=1e-6)


@pytest.mark.unit
def test_blocks_of_a_reduction_split_over_two_nests_add_to_the_zeroed_output():
    """The reduction's first 2 steps in one nest and the other 4 in another (full and
    partial tiles): neither block holds the whole sum, so each adds its accumulators to
    C instead of storing them over the other's, and C still needs its zeros."""
    a, b = RNG.standard_normal((4, 6)).astype(np.float32), RNG.standard_normal((6, 10)).astype(np.float32)
    split = _two_nests(BLOCK, "for c3 in 0:6 {", "for c3 in 0:2 {", "for c3 in 2:6 {")
    initialized: set[str] = set()
    out = promote_register_blocks(parse_kernel(split), frozenset({"C"}), initialized)
    assert str(out).count("C(c1, c0 + c2) = C(c1, c0 + c2) + acc") == 2 and not initialized, str(out)
    np.testing.assert_allclose(interpret_kernel(out, {"A": a, "B": b})["C"], a @ b, rtol=1e-5, atol=1e-5)


def _two_nests(kernel: str, loop: str, first: str, second: str) -> str:
    """``kernel``'s one nest twice, side by side, with ``loop`` as ``first`` in the one
    and as ``second`` in the other."""
    one, other = kernel.replace(loop, first), kernel.replace(loop, second)
    return one[:-2] + other[other.index("{\n") + 2:]


@pytest.mark.unit
def test_blocks_of_rows_split_over_two_nests_still_start_at_zero():
    """Rows 0:2 in one nest and 2:4 in another (full tiles and the partial one after
    them): each block sums the whole reduction of rows the other never stores, so both
    start at zero and C needs no zeros; rows that meet (0:4 and 2:4) add to C."""
    a, b = RNG.standard_normal((4, 6)).astype(np.float32), RNG.standard_normal((6, 10)).astype(np.float32)
    rows = "for c1 in 0:4 step 2 {"
    split = _two_nests(BLOCK, rows, "for c1 in 0:2 step 2 {", "for c1 in 2:4 step 2 {")
    initialized: set[str] = set()
    out = promote_register_blocks(parse_kernel(split), frozenset({"C"}), initialized)
    assert "acc(1, c2) = 0.0" in str(out) and "acc2(1, c2) = 0.0" in str(out)
    assert "= C(" not in str(out) and initialized == {"C"}, str(out)
    np.testing.assert_allclose(interpret_kernel(out, {"A": a, "B": b})["C"], a @ b, rtol=1e-5, atol=1e-6)
    overlap = _two_nests(BLOCK, rows, rows, "for c1 in 2:4 step 2 {")
    initialized = set()
    out = promote_register_blocks(parse_kernel(overlap), frozenset({"C"}), initialized)
    assert "= C(c1, c0 + c2) + acc" in str(out) and not initialized, str(out)
    want = a @ b
    want[2:] *= 2   # rows 2:4 summed by both nests
    np.testing.assert_allclose(interpret_kernel(out, {"A": a, "B": b})["C"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.unit
def test_an_epilogue_split_into_full_and_partial_tiles_fuses_when_it_writes_its_output_whole():
    """The epilogue nest in two pieces (rows 0:3 and 3:4, as separate_full_tiles splits
    a partial tile): fused when its output is written whole by one statement (``whole``,
    from the definition), left alone otherwise (nothing then says the pieces cover it)."""
    a, b = RNG.standard_normal((4, 6)).astype(np.float32), RNG.standard_normal((6, 10)).astype(np.float32)
    bias = RNG.standard_normal(10).astype(np.float32)
    piece = """    for c4 in {} {{
      for c5 in 0:10 vectorize(16) {{
        Y(c4, c5) = max(C(c4, c5) + D(c5), 0.0)
      }}
    }}
"""
    split = EPILOGUE.replace("""  for c4 in 0:4 {
    for c5 in 0:10 vectorize(16) {
      Y(c4, c5) = max(C(c4, c5) + D(c5), 0.0)
    }
  }
""", "  for c6 in 0:1 {\n" + piece.format("0:3") + piece.format("3:4") + "  }\n")
    kernel = parse_kernel(split)
    assert fuse_epilogues(kernel) == kernel
    out = fuse_epilogues(kernel, frozenset({"Y", "C"}))
    assert "for c6" not in str(out) and "max(acc(1, c2)" in str(out)
    got = interpret_kernel(out, {"A": a, "B": b, "D": bias})["Y"]
    np.testing.assert_allclose(got, np.maximum(a @ b + bias, 0), rtol=1e-5, atol=1e-6)


@pytest.mark.unit
def test_an_epilogue_in_sibling_nests_of_full_and_partial_tiles_fuses():
    """The epilogue as two nests side by side at the kernel's top (rows 0:3, then the
    partial tile 3:4, as separate_full_tiles leaves a row tile that does not divide):
    both go into the blocks when one statement writes Y whole."""
    a, b = RNG.standard_normal((4, 6)).astype(np.float32), RNG.standard_normal((6, 10)).astype(np.float32)
    bias = RNG.standard_normal(10).astype(np.float32)
    nest = """  for c4 in {} {{
    for c5 in 0:10 vectorize(16) {{
      Y(c4, c5) = max(C(c4, c5) + D(c5), 0.0)
    }}
  }}
"""
    split = EPILOGUE.replace(nest.format("0:4"), nest.format("0:3") + nest.format("3:4"))
    kernel = parse_kernel(split)
    assert str(kernel).count("Y(c4, c5) = max") == 2 and fuse_epilogues(kernel) == kernel
    out = fuse_epilogues(kernel, frozenset({"Y", "C"}))
    assert "Y(c4, c5)" not in str(out) and "max(acc(1, c2)" in str(out), str(out)
    got = interpret_kernel(out, {"A": a, "B": b, "D": bias})["Y"]
    np.testing.assert_allclose(got, np.maximum(a @ b + bias, 0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("m", [126, 197, 200])
def test_a_product_whose_rows_leave_a_partial_tile_applies_its_epilogue_in_the_blocks(m):
    """Natively, rows that leave a partial cache tile (200 in tiles of 64): the epilogue,
    split like the product into full and partial tiles, still runs in the blocks."""
    mm = pf.define("def f(float(M,K) A, float(K,N) B, float(N) D) -> (Y, T) {\n"
                   "  T(m, n) +=! A(m, k) * B(k, n)\n  Y(m, n) = max(T(m, n) + D(n), 0.0)\n}",
                   target="host").f
    a, b = RNG.standard_normal((m, 64)).astype(np.float32), RNG.standard_normal((64, 256)).astype(np.float32)
    d = RNG.standard_normal(256).astype(np.float32)
    spec = mm.specialize(a, b, d)
    assert "max(acc" in spec.stages["loops"] and "max(T(" not in spec.stages["loops"], spec.stages["loops"]
    y, t = spec(a, b, d)
    np.testing.assert_allclose(t, a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y, np.maximum(a @ b + d, 0), rtol=1e-4, atol=1e-4)


def test_a_small_product_takes_register_blocks_and_keeps_its_epilogue():
    """A product too small for cache tiles whose plain schedule would gather B's rows
    vectorizes n in register blocks (the default heuristics), which store at the kernel's
    top: the epilogue still applies there, and the product comes back too."""
    from polyfuse.scheduler.heuristics import default_options
    src = ("def f(float(4,16) A, float(16,24) B, float(24) D) -> (Y, T) {\n"
           "  T(m, n) +=! A(m, k) * B(k, n)\n  Y(m, n) = max(T(m, n) + D(n), 0.0)\n}")
    assert default_options(parse_definition(src), {}, DEFAULT_MACHINE).register_tile
    dot = "def g(float(4,16) A, float(24,16) B) -> (T) { T(m, n) +=! A(m, k) * B(n, k) }"
    assert not default_options(parse_definition(dot), {}, DEFAULT_MACHINE).register_tile   # dot products
    a, b = RNG.standard_normal((4, 16)).astype(np.float32), RNG.standard_normal((16, 24)).astype(np.float32)
    d = RNG.standard_normal(24).astype(np.float32)
    spec = pf.define(src, target="host").f.specialize(a, b, d)
    assert "max(acc" in spec.stages["loops"]
    y, t = spec(a, b, d)
    np.testing.assert_allclose(t, a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, np.maximum(a @ b + d, 0), rtol=1e-5, atol=1e-5)


# a symbolic kernel's rows (M) after unroll-and-jam: full blocks of 6 rows, then the rows
# the last tile leaves as a loop of unknown trips inside the reduction
SYMBOLIC_MM = "def mm(float(M, 16) A, float(16, 40) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"


def _symbolic_jammed(source: str = SYMBOLIC_MM, sizes: dict[str, int] | None = None) -> LoopKernel:
    from polyfuse.frontends.loop_ir import parse_kernel as parse
    from polyfuse.scheduler.heuristics import default_options
    d = parse_definition(source)
    sizes = sizes or {"M": 40}
    options = default_options(d, sizes, DEFAULT_MACHINE, frozenset(sizes))
    stages: dict[str, str] = {}
    schedule_definition(d, sizes, options, stages, set(), machine=DEFAULT_MACHINE, symbolic=frozenset(sizes))
    return parse(stages["loops:unroll_and_jam"])


@pytest.mark.unit
def test_rows_of_unknown_trips_become_blocks_of_four_two_and_one_summed_from_zero():
    """The rows a partial block leaves (``0:min(5, M - x) + 1`` inside the reduction) run
    outside it in register blocks of 4, 2 and 1 rows; the blocks of the full and partial
    tiles store C apart, so each starts at zero and stores its sums (the runtime's zeros
    of C go unread). Against the kernel before the pass, on the interpreter, at every
    remainder of M."""
    before = _symbolic_jammed()
    initialized: set[str] = set()
    after = promote_register_blocks(before, frozenset({"C"}), initialized)
    text = str(after)
    assert {"6", "4", "2", "1"} <= set(re.findall(r"local float32\((\d+), \d+\) acc", text)), text
    assert initialized == {"C"} and "C(c" in text and "= C(" not in text, text
    b = RNG.standard_normal((16, 40)).astype(np.float32)
    for m in (1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 40, 41, 45):
        a = RNG.standard_normal((m, 16)).astype(np.float32)
        want = interpret_kernel(before, {"A": a, "B": b, "M": m})["C"]
        np.testing.assert_allclose(want, a @ b, rtol=1e-5, atol=1e-5)
        got = np.full((m, 40), np.nan, np.float32)   # never read: every element stored
        interpret_kernel(after, {"A": a, "B": b, "M": m, "C": got})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.unit
def test_columns_of_unknown_trips_become_blocks_of_whole_vectors():
    """A partial tile of a symbolic number of columns (``0:min(63, N - x) + 1``
    vectorized) runs outside the reduction in blocks of 64, 32 and 16 columns summed in
    registers, then the last, partial vector as it was; rows and columns both partial
    take both. Against the kernel before the pass, on the interpreter."""
    source = "def mm(float(M, 16) A, float(16, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
    before = _symbolic_jammed(source, {"M": 40, "N": 200})
    after = promote_register_blocks(before, frozenset({"C"}))
    shapes = set(re.findall(r"local float32\((\d+, \d+)\) acc", str(after)))
    assert {"6, 64", "6, 32", "6, 16", "4, 16", "1, 32"} <= shapes, shapes
    for m, n in ((1, 1), (5, 15), (7, 16), (13, 47), (9, 113), (6, 64)):
        a = RNG.standard_normal((m, 16)).astype(np.float32)
        b = RNG.standard_normal((16, n)).astype(np.float32)
        want = interpret_kernel(before, {"A": a, "B": b, "M": m, "N": n})["C"]
        np.testing.assert_allclose(want, a @ b, rtol=1e-5, atol=1e-5)
        got = interpret_kernel(after, {"A": a, "B": b, "M": m, "N": n})["C"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.unit
@pytest.mark.parametrize("change, apart", [
    ((), True),
    (("for c10 in 0:2 {", "for c10 in 0:3 {"), False),           # a full tile's rows reach past its step
    (("0:2 * floordiv(M, 2) step 2", "0:2 * floordiv(M, 2) + 1 step 2"), False),  # ends at no multiple
    (("C(c1 + c10, c2) = 2.0", "C(c10, c2) = 2.0"), False),        # the partial tile's rows not its own
    (("in 0:min(1, M - c1 - 1) + 1", "in 2 * floordiv(M - c1, 2):min(1, M - c1 - 1) + 1"), True),  # from >= 0
    (("in 0:min(1, M - c1 - 1) + 1", "in 2 * floordiv(c1 - M, 2):min(1, M - c1 - 1) + 1"), False),  # from < 0
])
def test_full_and_partial_tiles_of_a_symbolic_loop_store_apart(change, apart):
    from polyfuse.frontends.loop_ir import parse_kernel as parse
    from polyfuse.scheduler.loop_passes.register_blocks import _split_apart
    text = """kernel k(out float32(M, 8) C, int64 M) {
  for c1 in 0:2 * floordiv(M, 2) step 2 {
    for c10 in 0:2 {
      for c2 in 0:8 {
        C(c1 + c10, c2) = 1.0
      }
    }
  }
  for c1 in 2 * floordiv(M, 2):M step 2 {
    for c10 in 0:min(1, M - c1 - 1) + 1 {
      for c2 in 0:8 {
        C(c1 + c10, c2) = 2.0
      }
    }
  }
}"""
    kernel = parse(text.replace(*change) if change else text)
    assert _split_apart(kernel.body[0], kernel.body[1], "C") is apart


@pytest.mark.unit
@pytest.mark.parametrize("rows, fused", [("0:M", True), ("1:M", False), ("0:M - 1", False)])
def test_an_epilogue_over_symbolic_rows_runs_in_the_blocks_where_it_covers_the_output(rows, fused):
    """An epilogue nest of a symbolic kernel (extents that read M) applies in the register
    blocks' stores when its loops run each index from 0 to its extent; one that leaves
    rows out keeps its nest. Against numpy on the interpreter either way."""
    from polyfuse.frontends.loop_ir import parse_kernel as parse
    promoted = str(promote_register_blocks(_symbolic_jammed(), frozenset({"C"})))
    head, rest = promoted.split("\n", 1)
    head = head.replace("out float32(M, 40) C,", "in float32(40) D, out float32(M, 40) Y, out float32(M, 40) C,")
    text = head + "\n" + rest[:-2] + f"""  for q4 in {rows} {{
    for q5 in 0:40 vectorize(16) {{
      Y(q4, q5) = max(C(q4, q5) + D(q5), 0.0)
    }}
  }}
}}"""
    out = fuse_epilogues(parse(text), frozenset({"C", "Y"}))
    assert ("for q4" not in str(out)) is fused
    b, d = RNG.standard_normal((16, 40)).astype(np.float32), RNG.standard_normal(40).astype(np.float32)
    for m in (1, 5, 13):
        a = RNG.standard_normal((m, 16)).astype(np.float32)
        got = interpret_kernel(out, {"A": a, "B": b, "D": d, "M": m})["Y"]
        want = np.maximum(a @ b + d, 0)
        first = int(rows.startswith("1"))
        last = m - int(rows.endswith("- 1"))
        np.testing.assert_allclose(got[first:last], want[first:last], rtol=1e-5, atol=1e-5)
