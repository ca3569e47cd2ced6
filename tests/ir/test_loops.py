"""Loop IR: text round trip, verifier, and passes checked with the loop interpreter."""

from dataclasses import replace

import numpy as np
import pytest

from polyfuse.errors import IRVerificationError
from polyfuse.frontends.loop_ir import parse_kernel
from polyfuse.frontends.tc import parse, parse_definition
from polyfuse.ir.loops import For
from polyfuse.ir.loops_interpreter import interpret_kernel
from polyfuse.ir.loops_verify import verify_kernel
from polyfuse.scheduler.loop_passes.unroll_and_jam import unroll_and_jam
from polyfuse.runtime.arguments import bind_arguments
from polyfuse.scheduler.options import MappingOptions
from polyfuse.scheduler.pipeline import schedule_definition
from tests.tc_programs import PROGRAMS

pytestmark = pytest.mark.unit

OPTIONS = [MappingOptions(),
           MappingOptions(tile_sizes=(3, 5, 2), register_tile=(2, 2), unroll_jam=2, vector_width=8,
                          reorder_reductions=True)]


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_parse_of_print_is_identity(program):
    d = parse(program.source)[program.entry]
    sizes = bind_arguments(d, program.make_inputs(np.random.default_rng(0))).sizes
    for options in OPTIONS:
        kernel = schedule_definition(d, sizes, options)
        text = str(kernel)
        again = parse_kernel(text)
        assert again == kernel, text
        assert str(again) == text


MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def test_verifier_rejects_broken_kernels():
    k = schedule_definition(parse_definition(MM), {"M": 8, "K": 4, "N": 8}, MappingOptions())
    verify_kernel(k)
    loop = k.body[0]
    with pytest.raises(IRVerificationError, match="outside a loop"):
        verify_kernel(replace(k, body=(loop.body[0],)))  # the inner loop without the outer one
    with pytest.raises(IRVerificationError, match="not a writable buffer"):
        verify_kernel(parse_kernel(str(k).replace("  C(c0, c1) = acc1", "  A(c0, c1) = acc1")))


def test_unroll_and_jam_keeps_results():
    d = parse_definition(MM)
    sizes = {"M": 8, "K": 6, "N": 12}
    rng = np.random.default_rng(0)
    args = {"A": rng.standard_normal((8, 6)).astype(np.float32),
            "B": rng.standard_normal((6, 12)).astype(np.float32)}
    opts = MappingOptions(tile_sizes=(4, 6, 0), register_tile=(4, 6, 0), point_order=(2, 0, 1),
                          reorder_reductions=True)
    plain = schedule_definition(d, sizes, opts)
    jammed = unroll_and_jam(plain, 4)
    assert str(jammed) != str(plain)
    innermost = [s for s in _loops(jammed.body) if not any(isinstance(c, For) for c in s.body)]
    assert any(len(s.body) == 4 for s in innermost)
    np.testing.assert_allclose(interpret_kernel(jammed, args)["C"], args["A"] @ args["B"], rtol=1e-5)


def _loops(body):
    for s in body:
        if isinstance(s, For):
            yield s
            yield from _loops(s.body)
