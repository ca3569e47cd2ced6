"""The planner's comprehension passes: each kernel step's definition after every pass it
went through, printed as the ``comprehension:<pass>`` stages, each computing what numpy
computes (the comprehension interpreter is the oracle's runner)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from polyfuse.driver import compile_graph
from polyfuse.errors import ArgumentError, IRVerificationError
from polyfuse.frontends.graph_text import parse_graph
from polyfuse.ir.comprehension import Literal, walk
from polyfuse.ir.comprehension_interpreter import interpret
from polyfuse.ir.passes import Pass
from polyfuse.lowering.kernel_passes import run_definition_passes, started
from polyfuse.frontends.tc import parse

pytestmark = pytest.mark.unit

GRAPH = """\
graph g(%x: float32[4, 6]) -> (%y: float32[4, 6]) opset 17 {
  %c = constant float32[] [2.5]
  %a = Mul(%x, %c)  # scale
  %y = Relu(%a)  # relu
}"""


def test_each_kernel_keeps_its_definition_after_every_comprehension_pass():
    model = compile_graph(parse_graph(GRAPH), "reference", passes=True)
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    expected = np.maximum(x * np.float32(2.5), 0)
    np.testing.assert_allclose(model.run({"x": x})["y"], expected)

    (step,) = model.plan_for().plan.kernels
    assert [name for name, _ in step.history] == ["input", "inline_pointwise", "inline_scalars"]
    assert step.history[-1][1] is step.definition
    composed, pointwise, scalars = (d for _, d in step.history)
    assert len(composed.statements) == 2 and len(pointwise.statements) == 1   # the product inlined
    assert len(pointwise.params) == 2 and len(scalars.params) == 1            # 2.5 became a literal
    assert any(isinstance(e, Literal) and e.value == 2.5 for e in walk(scalars.statements[0].rhs))
    constant = {pointwise.params[1].name: np.array(2.5, np.float32)}
    for d in (composed, pointwise, scalars):
        given = {d.params[0].name: x} | {n: a for n, a in constant.items() if n in {p.name for p in d.params}}
        np.testing.assert_allclose(interpret(d, given, {})[d.outputs[0].name], expected)

    assert model.dump("comprehension") == f"// {step.label}\n{composed}"
    assert model.dump("comprehension:inline_pointwise") == f"// {step.label}\n{pointwise}"
    assert model.dump("comprehension:inline_scalars") == f"// {step.label}\n{scalars}"
    with pytest.raises(ArgumentError, match="comprehension:inline_pointwise, comprehension:inline_scalars"):
        model.dump("comprehension:to_channels_last")


def test_a_pass_leaving_a_broken_definition_is_named():
    d = parse("def f(float(N) A) -> (B) { B(i) = A(i) + 1.0 }").definitions[0]

    def undeclared(d):   # writes a tensor the definition does not declare
        return replace(d, statements=tuple(replace(s, tensor="C") for s in d.statements))

    with pytest.raises(IRVerificationError, match="in comprehension pass 'undeclared' on definition 'f'"):
        run_definition_passes(started(d), (Pass("undeclared", undeclared),))
    history = run_definition_passes(started(d), (Pass("same", lambda d: d),))
    assert [n for n, _ in history] == ["input", "same"]
