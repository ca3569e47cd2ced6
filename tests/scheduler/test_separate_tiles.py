"""separate_full_tiles, filecheck style: tile loops whose tiles do not divide the extent
split into full tiles (constant inner bounds) and the rest; the result prints as
expected, parses back, and computes what the kernel before it does."""

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.frontends.loop_ir import parse_kernel
from polyfuse.ir.loops import For, walk_stmts
from polyfuse.ir.loops_interpreter import interpret_kernel
from polyfuse.ir.comprehension import Literal
from polyfuse.scheduler.loop_passes import separate_full_tiles
from polyfuse.scheduler.options import MappingOptions
from polyfuse.ir.machine import DEFAULT_MACHINE

RNG = np.random.default_rng(11)

TILED = """kernel scale(in float32(10, 7) A, out float32(10, 7) B) {
  for c0 in 0:10 step 4 {
    for c1 in 0:7 step 4 {
      for c2 in 0:min(3, 0 - c0 + 9) + 1 {
        for c3 in 0:min(3, 0 - c1 + 6) + 1 {
          B(c0 + c2, c1 + c3) = A(c0 + c2, c1 + c3) * 2.0
        }
      }
    }
  }
}"""

SEPARATED = """kernel scale(in float32(10, 7) A, out float32(10, 7) B) {
  for c0 in 0:8 step 4 {
    for c1 in 0:4 step 4 {
      for c2 in 0:4 {
        for c3 in 0:4 {
          B(c0 + c2, c1 + c3) = A(c0 + c2, c1 + c3) * 2.0
        }
      }
    }
    for c1 in 4:7 step 4 {
      for c2 in 0:4 {
        for c3 in 0:3 {
          B(c0 + c2, c1 + c3) = A(c0 + c2, c1 + c3) * 2.0
        }
      }
    }
  }
  for c0 in 8:10 step 4 {
    for c1 in 0:4 step 4 {
      for c2 in 0:2 {
        for c3 in 0:4 {
          B(c0 + c2, c1 + c3) = A(c0 + c2, c1 + c3) * 2.0
        }
      }
    }
    for c1 in 4:7 step 4 {
      for c2 in 0:2 {
        for c3 in 0:3 {
          B(c0 + c2, c1 + c3) = A(c0 + c2, c1 + c3) * 2.0
        }
      }
    }
  }
}"""


@pytest.mark.unit
def test_full_tiles_get_constant_bounds_and_the_last_tile_its_own():
    before = parse_kernel(TILED)
    after = separate_full_tiles(before)
    assert str(after) == SEPARATED
    assert parse_kernel(SEPARATED) == after
    a = RNG.standard_normal((10, 7)).astype(np.float32)
    np.testing.assert_array_equal(interpret_kernel(after, {"A": a})["B"], a * 2)
    np.testing.assert_array_equal(interpret_kernel(before, {"A": a})["B"], a * 2)


@pytest.mark.unit
def test_divided_extents_and_untiled_loops_are_left_alone():
    text = TILED.replace("10", "8").replace("0 - c0 + 9", "0 - c0 + 7").replace("7)", "8)") \
        .replace("0:7 step", "0:8 step").replace("0 - c1 + 6", "0 - c1 + 7")
    out = str(separate_full_tiles(parse_kernel(text)))
    assert "min(" not in out and out.count("for c0") == 1 and out.count("for c1") == 1
    plain = "kernel f(in float32(5) A, out float32(5) B) {\n  for c0 in 0:5 {\n    B(c0) = A(c0)\n  }\n}"
    assert str(separate_full_tiles(parse_kernel(plain))) == plain


def test_copies_are_bounded():
    """Six tiled dimensions would make 64 copies; the pass stops at MAX_COPIES."""
    from polyfuse.scheduler.loop_passes.separate_tiles import MAX_COPIES
    src = "def f(float(A,B,C,D,E,F) X) -> (Y) { Y(a,b,c,d,e,f) = X(a,b,c,d,e,f) + 1 }"
    opts = MappingOptions(tile_sizes=(2, 2, 2, 2, 2, 2), fix_sizes=True)
    k = pf.define(src, target="host", options=opts).f
    x = RNG.standard_normal((3, 3, 3, 3, 3, 3)).astype(np.float32)
    spec = k.specialize(x)
    np.testing.assert_array_equal(k(x), x + 1)
    copies = spec.stages["loops"].count("Y(")
    assert 1 < copies <= MAX_COPIES


@pytest.mark.parametrize("n", [1, 17, 100, 130])
def test_matmuls_whose_tiles_do_not_divide_the_sizes(n):
    """The heuristic's tiles (64 x 256 x 128, 4-row blocks of 16 lanes) on sizes they do
    not divide: the full tiles' innermost loops have literal bounds, results are numpy's."""
    k = pf.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
                  target="host").mm
    a = RNG.standard_normal((n + 3, n)).astype(np.float32)
    b = RNG.standard_normal((n, n + 5)).astype(np.float32)
    np.testing.assert_allclose(k(a, b), a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.unit
def test_matmul_1040_full_tiles_are_constant():
    from polyfuse.frontends.tc import parse_definition
    from polyfuse.scheduler.heuristics import default_options
    from polyfuse.scheduler.pipeline import schedule_definition
    d = parse_definition("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
    sizes = {"M": 1040, "N": 1040, "K": 1040}
    stages: dict[str, str] = {}
    kernel = schedule_definition(d, sizes, default_options(d, sizes, DEFAULT_MACHINE), stages)
    inner = [s for s in walk_stmts(kernel.body) if isinstance(s, For) and s.vector > 1]
    assert len(inner) > 1
    assert isinstance(inner[0].hi, Literal) and inner[0].hi.value == 64   # the first: a full tile
    assert "loops:separate_full_tiles" in stages


@pytest.mark.unit
def test_parallel_loops_keep_every_iteration_on_the_threads():
    """Two parallel loops would run one after the other, the shorter with idle threads:
    a parallel loop stays one loop whose body picks the full-tile version or the other."""
    before = parse_kernel(TILED.replace("  for c0 in 0:10 step 4", "  parallel for c0 in 0:10 step 4"))
    after = separate_full_tiles(before)
    out = str(after)
    assert out.count("parallel for c0 in 0:10 step 4") == 1 and "if c0 < 8 {" in out
    assert "min(" not in out
    assert "for c2 in 0:4 {" in out and "for c2 in 0:2 {" in out
    assert parse_kernel(out) == after
    a = RNG.standard_normal((10, 7)).astype(np.float32)
    np.testing.assert_array_equal(interpret_kernel(after, {"A": a})["B"], a * 2)


@pytest.mark.parametrize("m, rows, left", [(50, 6, 2), (197, 6, 5), (45, 4, 1)])
def test_row_blocks_that_do_not_divide_the_rows(m, rows, left):
    """197 rows (ViT's tokens) and 50 take blocks of 6, 45 (fewer than 48) blocks of 4:
    the full blocks are jammed, and so are the rows left over (50 = 8 x 6 + 2, 197 = 32 x
    6 + 5), while a single row left over (45 = 11 x 4 + 1) runs alone; results are numpy's."""
    k = pf.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
                  target="host").mm
    a = RNG.standard_normal((m, 300)).astype(np.float32)
    b = RNG.standard_normal((300, 256)).astype(np.float32)
    spec = k.specialize(a, b)
    assert f"register_tile=({rows}, " in spec.stages["options"]
    assert "(c7 + 3), " in spec.stages["loops"]   # a jammed block of 4 or 6 rows
    jammed = f"for c7 in 0:{left} step {left} {{" if left > 1 else "for c7 in 0:1 {"
    assert jammed in spec.stages["loops"]   # the rows left, jammed (or one alone)
    np.testing.assert_allclose(k(a, b), a @ b, rtol=1e-4, atol=1e-4)
