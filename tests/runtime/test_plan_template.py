"""Plan templates: after two plans of a model that differ only in sizes, a new shape is
planned by evaluating sizes (:mod:`polyfuse.runtime.plan_template`). A decoder step with
a growing past, its positions, causal mask and a length computed from the input shapes:
outputs against onnxruntime at every shape, the planner not called once a template
exists, and each templated plan equal, buffer by buffer and kernel by kernel, to the
plan the planner makes for that shape."""

import dataclasses
import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper

import polyfuse as pf
from polyfuse.ir.steps import KernelStep, ViewStep
from polyfuse.lowering import plan as planning
from tests.onnx.ort_compare import onnxruntime_outputs
from tests.onnx.test_models import make_model

RNG = np.random.default_rng(11)
node = helper.make_node
WIDTH = 16
VOCAB = 50
POSITIONS = 64


def decoder_step():
    """Token and position embeddings (positions past .. past + seq, a Range of values
    the shapes give), the rows concatenated after a past, causal scores, a softmax, and
    the result divided by the total length (a value of the shapes read as data)."""
    init = {"E": RNG.standard_normal((VOCAB, WIDTH)).astype(np.float32),
            "P": RNG.standard_normal((POSITIONS, WIDTH)).astype(np.float32),
            "one": np.array(1, np.int64), "zero": np.array(0, np.int64), "axis1": np.array([1], np.int64),
            "i0": np.array(1, np.int64), "i1": np.array(1, np.int64), "low": np.float32(-1e9)}
    nodes = [node("Shape", ["ids"], ["ids_shape"]), node("Gather", ["ids_shape", "i0"], ["seq"], axis=0),
             node("Shape", ["past"], ["past_shape"]), node("Gather", ["past_shape", "i1"], ["plen"], axis=0),
             node("Add", ["plen", "seq"], ["total"]),
             node("Range", ["plen", "total", "one"], ["positions"]),
             node("Gather", ["P", "positions"], ["pos"], axis=0),
             node("Gather", ["E", "ids"], ["tok"], axis=0), node("Add", ["tok", "pos"], ["x"]),
             node("Concat", ["past", "x"], ["kv"], axis=1),
             node("Transpose", ["kv"], ["kvt"], perm=[0, 2, 1]), node("MatMul", ["x", "kvt"], ["scores"]),
             node("Unsqueeze", ["positions", "axis1"], ["rows"]),
             node("Range", ["zero", "total", "one"], ["cols"]),
             node("LessOrEqual", ["cols", "rows"], ["causal"]),
             node("Where", ["causal", "scores", "low"], ["masked"]),
             node("Softmax", ["masked"], ["p"], axis=-1), node("MatMul", ["p", "kv"], ["att"]),
             node("Cast", ["total"], ["length"], to=TensorProto.FLOAT), node("Div", ["att", "length"], ["z"])]
    return make_model(nodes, {"ids": (TensorProto.INT64, ["batch", "seq"]),
                              "past": (TensorProto.FLOAT, ["batch", "past", WIDTH])},
                      {"z": (TensorProto.FLOAT, ["batch", "seq", WIDTH]),
                       "kv": (TensorProto.FLOAT, ["batch", "total", WIDTH])}, init)


def feed(batch, seq, past):
    return {"ids": RNG.integers(0, VOCAB, (batch, seq)).astype(np.int64),
            "past": RNG.standard_normal((batch, past, WIDTH)).astype(np.float32)}


def check(model, compiled, shape):
    f = feed(*shape)
    got = compiled.run(f)
    for name, want in zip(("z", "kv"), onnxruntime_outputs(model, f)):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5)


FIRST = [(2, 3, 4), (2, 5, 9), (3, 4, 6), (2, 7, 3), (4, 2, 8), (3, 6, 5)]
LATER = [(2, 6, 20), (3, 2, 2), (2, 9, 31), (4, 4, 5), (2, 2, 50)]


def test_later_shapes_are_planned_from_the_template():
    model = decoder_step()
    compiled = pf.compile(model, target="host")
    for shape in FIRST:
        check(model, compiled, shape)
    planned = compiled.plan_counts["planned"]
    assert planned <= len(FIRST)
    for shape in LATER:
        check(model, compiled, shape)
    assert compiled.plan_counts == {"planned": planned, "templated": len(FIRST) + len(LATER) - planned, "loaded": 0}


def test_a_templated_shape_is_checked_as_the_planner_checks_it(monkeypatch):
    """The template program's checks, made forms of the template's sizes checked all at
    once, hold exactly where the checks of each buffer and view hold (at sizes of every
    sign), and refuse a shape over the tensor limit with the planner's error: at sizes
    whose numbers fit int64 and at sizes whose numbers need Python's integers."""
    from polyfuse.errors import IRVerificationError
    from polyfuse.ir.limits import MAX_TENSOR_BYTES_VARIABLE

    model = decoder_step()
    compiled = pf.compile(model, target="host")
    for shape in FIRST:
        check(model, compiled, shape)
    template, program = next((t, p) for _, t, p in compiled._templates._templates if p is not None)
    assert program.views   # (views that change: their forms are checked)
    for values in itertools.product(range(-2, 9), repeat=len(template.buckets)):
        numbers = program.numbers.at(list(values))
        try:
            program._refuse(numbers)
        except (pf.errors.ShapeError, IRVerificationError):
            assert not program._holds(numbers), values
        except AssertionError:
            assert program._holds(numbers), values
    monkeypatch.setenv(MAX_TENSOR_BYTES_VARIABLE, "1000000")
    for past in (10 ** 5, 2 ** 40):   # (the second past's bytes leave int64)
        values = template.values_at({"ids": (2, 3), "past": (2, past, WIDTH)})
        with pytest.raises(pf.errors.SizeLimitError, match="over the limit"):
            program.lay_out(values)
    with pytest.raises(pf.errors.SizeLimitError, match="over the limit"):
        compiled.run(feed(2, 3, 10 ** 5))


def test_a_templated_shape_without_compiled_code_is_instantiated(monkeypatch):
    """Where a symbolic kernel has no code compiled for a templated shape's sizes (its
    accesses check differently than at any size it ran at), the template program gives
    way: the plan is instantiated and its kernels built, and the results hold."""
    from polyfuse.runtime.kernel import Kernel
    from polyfuse.runtime.template_program import TemplatedPlan

    model = decoder_step()
    compiled = pf.compile(model, target="host")
    for shape in FIRST:
        check(model, compiled, shape)
    program = next(p for _, _, p in compiled._templates._templates if p is not None and p.symbolic)
    if program.picks is not None:
        program.picks.known.clear()
    for c in program.symbolic:
        c.codes.clear()
    monkeypatch.setattr(Kernel, "compiled_at", lambda self, sizes, shapes: None)
    batch, seq, past = LATER[0]
    found = compiled._templates.find({"ids": (batch, seq), "past": (batch, past, WIDTH)}, ())
    assert found is not None and not isinstance(found, TemplatedPlan)
    check(model, compiled, LATER[0])


def test_a_second_plan_probes_for_a_template(monkeypatch):
    """At the second plan of a kind (its kernels then symbolic), the model plans made-up
    shapes of the kind too (plans only: nothing compiled), enough to fit a template: the
    third shape is templated."""
    calls = []
    plan_graph = planning.plan_graph
    monkeypatch.setattr(planning, "plan_graph", lambda *a, **k: calls.append(a[1]) or plan_graph(*a, **k))
    model = decoder_step()
    compiled = pf.compile(model, target="host")
    for shape in [(2, 3, 4), (2, 5, 9), (2, 8, 17), (2, 4, 40)]:
        check(model, compiled, shape)
    assert compiled.plan_counts == {"planned": 2, "templated": 2, "loaded": 0}
    probes = [c for c in calls if c not in ({"ids": (2, 3), "past": (2, 4, WIDTH)}, {"ids": (2, 5), "past": (2, 9, WIDTH)})]
    assert len(probes) == 2 and all(c["ids"][0] == 2 and c["past"][1] > 9 for c in probes)


def test_a_size_of_one_is_planned():
    """A size of 1 broadcasts: its own bucket, planned (and then correct)."""
    model = decoder_step()
    compiled = pf.compile(model, target="host")
    for shape in FIRST:
        check(model, compiled, shape)
    for shape in [(2, 1, 7), (1, 3, 7), (2, 4, 1)]:
        before = compiled.plan_counts["planned"]
        check(model, compiled, shape)
        assert compiled.plan_counts["planned"] == before + 1


def templated_shapes():
    """A model planned at FIRST, then each of LATER's shapes and its plan from the
    templates: ``(model, compiled, shape, shapes, templated)``."""
    model = decoder_step()
    compiled = pf.compile(model, target="host")
    for shape in FIRST:
        check(model, compiled, shape)
    for batch, seq, past in LATER:
        shapes = {"ids": (batch, seq), "past": (batch, past, WIDTH)}
        templated = compiled._templates.find(shapes, ())
        assert templated is not None
        yield model, compiled, (batch, seq, past), shapes, templated


def test_template_plans_equal_the_planners():
    for _, compiled, _, shapes, templated in templated_shapes():
        want = compiled._planner.plan(shapes, {})
        got = templated.plan
        assert dict(got.types) == dict(want.types)
        assert got.constants.keys() == want.constants.keys()
        for name, array in want.constants.items():
            np.testing.assert_array_equal(got.constants[name], array)
        assert [type(s) for s in got.steps] == [type(s) for s in want.steps]
        for st, w, kernel in zip(got.steps, want.steps, templated.kernels):
            assert (st.label, st.inputs, st.defines) == (w.label, w.inputs, w.defines)
            if isinstance(st, ViewStep):
                assert (st.shape, st.offset) == (w.shape, w.offset)
            else:
                assert isinstance(st, KernelStep)
                assert str(kernel.definition) == str(w.definition)   # the kernel at its sizes is the lowering's
        got.verify()


def test_values_of_the_shapes_that_kernels_read_are_computed_by_kernels():
    """The position rows (a Gather of the shapes' Range) are not folded into a constant
    of each plan: a kernel computes them, so plans differ only in sizes."""
    model = decoder_step()
    compiled = pf.compile(model, target="host")
    check(model, compiled, (2, 3, 4))
    plan = compiled._latest_plan("test").plan
    assert "pos" not in plan.constants and "positions" not in plan.constants
    assert any(st.label == "Gather_1" or "pos" in st.defines for st in plan.steps)
    assert all(a.size <= 64 or a.dtype.kind == "f" for a in plan.constants.values())
    memo = compiled._planner.memo
    assert {"pos", "positions", "length"} <= memo.unfolded   # computed by kernels
    assert "total" in memo.needed and "total" not in memo.unfolded   # a Range's limit: folded again


def test_named_input_shapes_compile_ahead_of_the_first_call():
    """``input_shapes`` with names where sizes are left open: the model compiles its
    kernels for symbolic sizes and makes its plan templates when it is compiled, for the
    names at 2 or more and for each name at 1 (a size of 1 is a kind of its own): every
    later shape of those kinds is then a template's plan with no kernel built; two names
    at 1 make a kind planned when a call brings it."""
    from polyfuse.runtime import cpu

    def built():
        return cpu.STATS["compiled"] + cpu.STATS["disk"] + cpu.STATS["memory"]
    model = decoder_step()
    compiled = pf.compile(model, target="host", input_shapes={"ids": ("batch", "seq"), "past": ("batch", "past", WIDTH)})
    assert compiled.plan_counts == {"planned": 4, "templated": 0, "loaded": 0}   # (the names at 16, then each at 1)
    assert "int64 S0" in compiled.dump("loops")   # compiled for symbolic sizes
    before = built()
    shapes = [(2, 3, 4), (3, 5, 9), (2, 40, 7), (5, 2, 2), (1, 3, 3), (1, 9, 20), (4, 1, 6), (3, 7, 1)]
    for shape in shapes:
        check(model, compiled, shape)
    assert compiled.plan_counts == {"planned": 4, "templated": len(shapes), "loaded": 0}
    assert built() == before
    check(model, compiled, (1, 1, 3))
    assert compiled.plan_counts["planned"] == 5


def embeddings():
    """Three embedding tables looked up as BERT's are (words and token types by (batch,
    seq) ids, positions by a Range of seq): one plan's three gathers differ only in
    sizes, which the seq the plans change is not among."""
    init = {"E": RNG.standard_normal((VOCAB, WIDTH)).astype(np.float32),
            "T": RNG.standard_normal((2, WIDTH)).astype(np.float32),
            "P": RNG.standard_normal((POSITIONS, WIDTH)).astype(np.float32),
            "zero": np.array(0, np.int64), "one": np.array(1, np.int64), "i1": np.array(1, np.int64),
            "axis0": np.array([0], np.int64)}
    nodes = [node("Shape", ["ids"], ["shape"]), node("Gather", ["shape", "i1"], ["seq"], axis=0),
             node("Range", ["zero", "seq", "one"], ["positions"]),
             node("Unsqueeze", ["positions", "axis0"], ["rows"]),
             node("Gather", ["E", "ids"], ["tok"], axis=0), node("Gather", ["T", "types"], ["typ"], axis=0),
             node("Gather", ["P", "rows"], ["pos"], axis=0), node("Add", ["tok", "typ"], ["both"]),
             node("Add", ["both", "pos"], ["z"])]
    return make_model(nodes, {"ids": (TensorProto.INT64, ["batch", "seq"]),
                              "types": (TensorProto.INT64, ["batch", "seq"])},
                      {"z": (TensorProto.FLOAT, ["batch", "seq", WIDTH])}, init)


def test_compiling_ahead_keeps_one_plan_s_alike_texts_to_the_templates_across_plans():
    """Kernels of one plan that differ only in sizes share a kernel for symbolic sizes
    (Generalizer.alike) in a model's first plan only: compiled ahead, the three gathers
    must generalize over the sizes the plans change (seq), or no plan template is made
    and every later shape is planned and compiles a kernel (as it once did)."""
    from polyfuse.runtime import cpu

    def built():
        return cpu.STATS["compiled"] + cpu.STATS["disk"] + cpu.STATS["memory"]
    model = embeddings()
    names = {"ids": ("batch", "seq"), "types": ("batch", "seq")}
    compiled = pf.compile(model, target="host", input_shapes=names)
    planned, before = compiled.plan_counts["planned"], built()
    for batch, seq in [(2, 5), (3, 11), (2, 30), (4, 7)]:
        f = {"ids": RNG.integers(0, VOCAB, (batch, seq)).astype(np.int64),
             "types": RNG.integers(0, 2, (batch, seq)).astype(np.int64)}
        np.testing.assert_allclose(compiled.run(f)["z"], onnxruntime_outputs(model, f)[0], rtol=1e-6)
    assert compiled.plan_counts["planned"] == planned and built() == before
    first = pf.compile(model, target="host")   # at the first call, the three share one kernel
    f = {"ids": RNG.integers(0, VOCAB, (3, 9)).astype(np.int64), "types": RNG.integers(0, 2, (3, 9)).astype(np.int64)}
    np.testing.assert_allclose(first.run(f)["z"], onnxruntime_outputs(model, f)[0], rtol=1e-6)
    plan = first.plan_for()
    gathers = [g for st, g in zip(plan.plan.kernels, plan.generic or [None] * len(plan.plan.kernels))
               if st.definition.statements[0].rhs is not None and "Gather" in st.label]
    assert len(gathers) == 3 and len({id(g.kernel) for g in gathers if g is not None}) == 1


def test_named_input_shapes_need_symbolic_sizes():
    with pytest.raises(pf.errors.ShapeError, match="symbolic"):
        pf.compile(decoder_step(), target="host", sizes="specialized", input_shapes={"ids": ("batch", "seq")})


def test_compiling_ahead_says_where_the_model_refuses_the_named_sizes():
    model = make_model([helper.make_node("Reshape", ["x", "s"], ["y"])], {"x": (TensorProto.FLOAT, ["n"])},
                       {"y": (TensorProto.FLOAT, [2, 5])}, {"s": np.array([2, 5], np.int64)})
    with pytest.raises(pf.errors.ShapeError, match="compiling ahead plans each named input dimension .n. at 16"):
        pf.compile(model, target="host", input_shapes={"x": ("n",)})
    compiled = pf.compile(model, target="host", input_shapes={"x": (10,)})   # sizes: planned as given
    x = RNG.standard_normal(10).astype(np.float32)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], x.reshape(2, 5))


def test_a_templated_shape_runs_a_program_laid_out_from_the_template():
    """Issue 36: at a templated shape the program's layout is the template's base layout
    with its numbers changed (template_program), not the instance's plan laid out again:
    the same code, sizes, zeroed bytes, shapes and arena offsets as a layout of the
    instantiated plan, its memory placed as the planner places it, the native program
    the base's patched to exactly what its calls make, and outputs against onnxruntime."""
    from polyfuse.ir.plan import plan_memory
    from polyfuse.runtime.model import _NativeProgram
    from polyfuse.runtime.program import ProgramLayout
    from polyfuse.runtime.template_program import TemplatedPlan

    for model, compiled, shape, _, templated in templated_shapes():
        assert isinstance(templated, TemplatedPlan)
        fast, full = templated.layout, ProgramLayout.of(templated.instance)
        assert (fast.inputs, fast.outputs, fast.slots, fast.arena_bytes) == \
            (full.inputs, full.outputs, full.slots, full.arena_bytes)
        for a, b in zip(fast.calls, full.calls, strict=True):
            assert a.executable.jit.address == b.executable.jit.address
            assert sorted(a.zero) == sorted(b.zero)
            for (where, index, offset), (w, i, o), held in zip(a.args, b.args, a.holds, strict=True):
                assert where == w
                if held is not None and held.startswith("<size>"):
                    assert fast.constants[index][offset // 8] == full.constants[i][o // 8]
                else:
                    assert (index, offset) == (i, o)
        # the native program runs is the base's patched: the one its calls would make
        program = templated.native.describe()
        assert program == _NativeProgram(fast).program.describe()
        assert [(fn, sorted(zero)) for fn, _, zero in program] == \
            [(fn, sorted(zero)) for fn, _, zero in _NativeProgram(full).program.describe()]
        plan = templated.plan
        plan.verify()   # live values never overlap
        assert plan.memory == plan_memory(plan.steps, plan.types, set(plan.outputs))   # the planner's placement
        check(model, compiled, shape)
    assert "%kv: float32[2, 52, 16]" in compiled.dump("plan")   # the instance, made when read
    # each symbolic kernel's shapes are proven its buffers' at every size (so calls skip
    # binding them); a size one off is refused by the same proof
    # a bundle links each kernel's own code: of the instance, not the template's program
    assert not isinstance(compiled.plan_for({"ids": (2, 2), "past": (2, 50, WIDTH)}), TemplatedPlan)
    programs = [p for _, _, p in compiled._templates._templates if p is not None]
    assert programs and all(c.proven for p in programs for c in p.symbolic)
    program = next(p for p in programs if p.symbolic)
    c = program.symbolic[0]
    name, slot = next(iter(c.given.items()))
    off = (slot + 1) if isinstance(slot, int) else (slot[0] + 1, slot[1])
    assert not program._agree(dataclasses.replace(c, given={**c.given, name: off}))
