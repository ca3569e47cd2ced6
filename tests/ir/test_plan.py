"""The Plan IR between lowering and runtime: what plan_graph makes, how it prints, what the
verifier refuses, and that the runtime runs exactly what the plan says."""

import dataclasses

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.driver import compile_graph
from polyfuse.errors import IRVerificationError
from polyfuse.frontends.plan_text import parse_plan
from polyfuse.ir.graph import Constant, Graph, Node, TensorType, Value
from polyfuse.ir.plan import KernelStep, LoopStep, Plan, Role, ViewStep, plan_memory
from polyfuse.ir.types import DType
from polyfuse.lowering.plan import plan_graph

F32 = DType.FLOAT32
RNG = np.random.default_rng(7)


def mlp() -> tuple[Graph, dict[str, np.ndarray]]:
    """x -> Gemm -> Relu -> Reshape -> Gemm -> y, and a folded constant branch."""
    w1 = RNG.standard_normal((8, 4)).astype(np.float32)
    w2 = RNG.standard_normal((3, 8)).astype(np.float32)
    b = RNG.standard_normal((3,)).astype(np.float32)
    g = Graph("mlp", (Value("x", TensorType(F32, ("n", 4))),),
              (Value("y", TensorType(F32, ("n", 3))), Value("x_out", TensorType(F32, ("n", 4)))),
              (Node("Gemm", "fc1", ("x", "w1"), ("h",), (("transB", 1),)),
               Node("Relu", "relu", ("h",), ("r",)),
               Node("Reshape", "flat", ("r", "shape"), ("f",)),
               Node("Neg", "negb", ("b",), ("nb",)),          # reads only constants: folds
               Node("Gemm", "fc2", ("f", "w2", "nb"), ("y",), (("transB", 1),)),
               Node("Identity", "copy", ("x",), ("x_out",))),
              (Constant("w1", w1), Constant("w2", w2), Constant("b", b),
               Constant("shape", np.array([-1, 8], np.int64))), 17)
    return g, {"w1": w1, "w2": w2, "b": b}


@pytest.mark.unit
def test_plan_graph_lowers_for_concrete_shapes():
    g, w = mlp()
    plan = plan_graph(g, {"x": (5, 4)})
    assert isinstance(plan, Plan)
    kinds = [(type(st).__name__, st.label) for st in plan.steps]
    assert kinds == [("KernelStep", "fc1"), ("KernelStep", "relu"), ("ViewStep", "flat"),
                     ("KernelStep", "fc2"), ("ViewStep", "copy")]
    assert plan.types["h"] == TensorType(F32, (5, 8)) and plan.types["y"] == TensorType(F32, (5, 3))
    np.testing.assert_array_equal(plan.constants["nb"], -w["b"])       # folded at compile time
    assert "b" not in plan.constants                                   # read by nothing that runs
    assert plan.roles["x"] is Role.INPUT and plan.roles["y"] is Role.OUTPUT
    assert plan.roles["x_out"] is Role.INOUT and plan.roles["w1"] is Role.CONSTANT
    assert plan.roles["h"] is Role.TEMP
    # h (160 bytes, 192 aligned) is still read by the step defining r; f views r; the
    # outputs have arrays of their own
    assert plan.memory.roots["f"] == "r" and "y" not in plan.memory.offsets
    assert plan.memory.offsets == {"h": 0, "r": 192} and plan.memory.arena_bytes == 384
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.steps = ()   # type: ignore[misc]


@pytest.mark.unit
def test_plan_prints_buffers_steps_and_definitions():
    g, _ = mlp()
    plan = plan_graph(g, {"x": (2, 4)})
    text = str(plan)
    steps, *kernels = text.split("\n\n")
    assert steps == """\
plan @mlp(%x: float32[2, 4]) -> (%y: float32[2, 3] out, %x_out: float32[2, 4] inout) {
  arena 128 bytes (naive 192)
  const %w1: float32[8, 4]
  const %w2: float32[3, 8]
  const %nb: float32[3]
  (%h: float32[2, 8] @arena+0) = k(%x, %w1)  // fc1
  (%r: float32[2, 8] @arena+64) = k(%h)  // relu
  %f: float32[2, 8] = view %r  // flat
  (%y: float32[2, 3]) = k(%f, %w2, %nb)  // fc2
  %x_out: float32[2, 4] = view %x  // copy
}"""
    # the kernels' TC follows the steps, and the whole text parses back
    assert [k.splitlines()[:2] for k in kernels] == [
        ["// fc1", "def k(float32(2, 4) A, float32(8, 4) B) -> (float32(2, 8) Y) {"],
        ["// relu", "def k(float32(2, 8) X0) -> (float32(2, 8) Y) {"],
        ["// fc2", "def k(float32(2, 8) A, float32(3, 8) B, float32(3) C) -> (float32(2, 3) Y) {"]]
    assert str(parse_plan(text, plan.constants)) == text


def test_the_runtime_runs_the_plan():
    g, w = mlp()
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    want = np.maximum(x @ w["w1"].T, 0) @ w["w2"].T - w["b"]
    for target in ("reference", "host"):
        model = compile_graph(g, target)
        y, x_out = model(x)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(x_out, x)
        assert model.plan_for().plan.steps == plan_graph(g, {"x": (5, 4)}).steps
        assert model.dump("plan") == str(plan_graph(g, {"x": (5, 4)}))


@pytest.mark.unit
def test_dump_names_the_plan_stage():
    g, _ = mlp()
    model = compile_graph(g, "reference", input_shapes={"x": (1, 4)})
    assert model.dump("plan").startswith("plan @mlp(%x: float32[1, 4])")
    with pytest.raises(pf.ArgumentError, match="stages: groups, plan, comprehension, kernels"):
        model.dump("nonsense")


def broken(plan: Plan, **changes) -> Plan:
    return dataclasses.replace(plan, **changes)


@pytest.mark.unit
def test_the_verifier_refuses_broken_plans():
    g, _ = mlp()
    plan = plan_graph(g, {"x": (3, 4)})
    plan.verify()
    steps = list(plan.steps)
    with pytest.raises(IRVerificationError, match="reads 'r' before any step defines it"):
        broken(plan, steps=(steps[0], steps[2], steps[1], *steps[3:])).verify()
    with pytest.raises(IRVerificationError, match="defines 'h' a second time"):
        broken(plan, steps=(steps[0], steps[0], *steps[1:])).verify()
    with pytest.raises(IRVerificationError, match="output 'y' is never defined"):
        broken(plan, steps=tuple(steps[:3])).verify()
    fc1 = steps[0]
    assert isinstance(fc1, KernelStep)
    with pytest.raises(IRVerificationError, match="takes 2 arguments"):
        broken(plan, steps=(dataclasses.replace(fc1, inputs=("x",)), *steps[1:])).verify()
    with pytest.raises(IRVerificationError, match="buffer 'h' is float32\\[3, 9\\]"):
        broken(plan, types={**plan.types, "h": TensorType(F32, (3, 9))}).verify()
    with pytest.raises(IRVerificationError, match="'x' is float64"):
        broken(plan, types={**plan.types, "x": TensorType(DType.FLOAT64, (3, 4))}).verify()
    flat = steps[2]
    assert isinstance(flat, ViewStep)
    with pytest.raises(IRVerificationError, match="changes the storage"):
        broken(plan, steps=(*steps[:2], dataclasses.replace(flat, shape=(3, 7)), *steps[3:])).verify()
    with pytest.raises(IRVerificationError, match="at offset 1 reads outside its storage"):
        broken(plan, steps=(*steps[:2], dataclasses.replace(flat, offset=1), *steps[3:])).verify()
    # two values live at once in the same bytes of the arena
    offsets = dict.fromkeys(plan.memory.offsets, 0)
    with pytest.raises(IRVerificationError, match="live at the same time and overlap"):
        broken(plan, memory=dataclasses.replace(plan.memory, offsets=offsets)).verify()
    with pytest.raises(IRVerificationError, match="outside the arena"):
        broken(plan, memory=dataclasses.replace(plan.memory, arena_bytes=64)).verify()


@pytest.mark.unit
def test_memory_plan_reuses_dead_buffers():
    """A chain of equal-sized kernels needs two buffers of the arena, not one per value."""
    n = 6
    g = Graph("chain", (Value("x", TensorType(F32, (16, 16))),), (Value(f"v{n}", TensorType(F32, (16, 16))),),
              tuple(Node("Relu", f"r{k}", (f"v{k - 1}" if k > 1 else "x",), (f"v{k}",)) for k in range(1, n + 1)),
              (), 17)
    plan = plan_graph(g, {"x": (16, 16)})
    assert plan.memory.naive_bytes == n * 1024
    assert plan.memory.arena_bytes == 2 * 1024
    assert plan_memory(plan.steps, plan.types, {f"v{n}"}) == plan.memory


@pytest.mark.unit
def test_each_node_is_lowered_and_parsed_once(monkeypatch):
    """A fusion group that does not fuse (its second member folds to a view) lowers its
    first member once; a lowering whose TC does not compile is an error naming the node."""
    from polyfuse.lowering import ops
    calls: list[str] = []
    relu = ops.OPS["Relu"]

    def counted(ctx):
        calls.append(ctx.node.name)
        return relu(ctx)
    monkeypatch.setitem(ops.OPS, "Relu", counted)
    g = Graph("g", (Value("x", TensorType(F32, (2, 3))),), (Value("y", TensorType(F32, (6,))),),
              (Node("Relu", "r", ("x",), ("t",), (), "g0"),
               Node("Reshape", "flat", ("t", "shape"), ("y",), (), "g0")),
              (Constant("shape", np.array([6], np.int64)),), 17)
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(compile_graph(g, "reference")(x), np.maximum(x, 0).reshape(6))
    assert calls == ["r"]

    monkeypatch.setitem(ops.OPS, "Relu", lambda ctx: ops.TCKernel("def f(float(N) A) -> (B) { B(i) = A(i) + }", (0,)))
    with pytest.raises(pf.CodegenError, match="node 'r' \\(Relu\\): its lowering made TC that does not compile"):
        plan_graph(g, {"x": (2, 3)})


def swap_loop() -> Graph:
    """(a, b) = (a + b, a * 2) for int64(sum(n)) iterations: a LoopStep, its trip count
    computed before it."""
    f4 = TensorType(F32, (4,))
    scalar = {"i": TensorType(DType.INT64, ()), "c": TensorType(DType.BOOL, ())}
    body = Graph("body", (Value("i", scalar["i"]), Value("c", scalar["c"]), Value("a", f4), Value("b", f4)),
                 (Value("c_out", scalar["c"]), Value("a_out", f4), Value("b_out", f4)),
                 (Node("Identity", "keep", ("c",), ("c_out",)), Node("Add", "add", ("a", "b"), ("a_out",)),
                  Node("Mul", "twice", ("a", "two"), ("b_out",))),
                 (Constant("two", np.array(2.0, np.float32)),), 17)
    return Graph("swap", (Value("x", f4), Value("n", TensorType(DType.INT64, (80,)))),
                 (Value("y", f4), Value("z", f4)),
                 (Node("ReduceSum", "trips", ("n",), ("m",), (("keepdims", 0),)),
                  Node("Loop", "loop", ("m", "", "x", "x"), ("y", "z"), (("body", body),))), (), 17)


def test_a_loop_the_data_bounds_is_a_loop_step():
    plan = plan_graph(swap_loop(), {"x": (4,), "n": (80,)})
    loop = plan.steps[1]
    assert isinstance(loop, LoopStep) and plan.tail is None
    assert (loop.trip, loop.initial, loop.carried) == ("m", ("x", "x"), ("y", "z"))
    assert [st.label for st in loop.body.steps] == ["loop/keep", "loop/add", "loop/twice"]
    lines = str(plan).splitlines()
    assert lines[3].startswith("  loop (%y: float32[4] = %x, %z: float32[4] = %x) trip %m counter ")
    assert lines[4].startswith("    %loop/c_out: bool[] = view")
    assert lines[7:9] == ["    next %loop/c_out carry (%loop/a_out, %loop/b_out)", "  }"]
    # the trip count is read by every iteration: its storage outlives the body's values
    trip = plan.memory.offsets["m"]
    assert all(plan.memory.offsets[v] != trip for st in loop.body.steps for v in st.defines
               if v in plan.memory.offsets)
    x, n = RNG.standard_normal(4).astype(np.float32), np.zeros(80, np.int64)
    n[0] = 3
    a, b = x.copy(), x.copy()
    for _ in range(3):
        a, b = a + b, a * 2
    for target in ("reference", "host"):
        y, z = compile_graph(swap_loop(), target)(x, n)
        np.testing.assert_allclose(y, a, rtol=1e-6)
        np.testing.assert_allclose(z, b, rtol=1e-6)


@pytest.mark.unit
def test_the_verifier_refuses_broken_loops():
    plan = plan_graph(swap_loop(), {"x": (4,), "n": (80,)})
    loop = plan.steps[1]
    assert isinstance(loop, LoopStep)

    def with_loop(**changes) -> Plan:
        return broken(plan, steps=(plan.steps[0], dataclasses.replace(loop, **changes)))
    body = loop.body
    # b's next value taken from a's buffer, which the copy before it has overwritten
    with pytest.raises(IRVerificationError, match="'z' is copied from 'y', the buffer of another"):
        with_loop(body=dataclasses.replace(body, results=(body.results[0], body.results[1], "y"))).verify()
    with pytest.raises(IRVerificationError, match="its trip count 'x' is float32\\[4\\]"):
        with_loop(trip="x").verify()
    with pytest.raises(IRVerificationError, match="its body gives 3 results for 1 initial and 2 carried"):
        with_loop(initial=("x",)).verify()
    with pytest.raises(IRVerificationError, match="its block gives 'nowhere'"):
        with_loop(body=dataclasses.replace(body, results=("nowhere", *body.results[1:]))).verify()
    # a value of the body is not seen after the loop (it may have run no iteration)
    with pytest.raises(IRVerificationError, match="reads 'loop/a_out' before any step defines it"):
        broken(plan, steps=(*plan.steps, ViewStep("after", "loop/a_out", "w", (4,))),
               types={**plan.types, "w": TensorType(F32, (4,))}).verify()
    offsets = {**plan.memory.offsets, "loop/a_out": plan.memory.offsets["m"]}
    with pytest.raises(IRVerificationError, match="live at the same time and overlap"):
        broken(plan, memory=dataclasses.replace(plan.memory, offsets=offsets)).verify()


def test_constants_are_kept_on_cache_lines_for_the_kernels_reading_them():
    """numpy puts large arrays 16 bytes past a cache line; a graph's constants, the
    arrays a plan computes at compile time (a conv's repacked weights) and what the
    kernels are given are copied to 64-byte boundaries (each vector load of a weight
    would otherwise straddle two lines), with their values, dtypes and shapes."""
    raw = np.zeros(4 * 300 + 64, np.uint8)
    start = (16 - raw.ctypes.data) % 64   # 16 bytes past a line
    w = raw[start:start + 4 * 300].view(np.float32).reshape(20, 15)
    w[...] = RNG.standard_normal((20, 15))
    assert w.ctypes.data % 64 == 16
    c = Constant("w", w)
    assert c.array.ctypes.data % 64 == 0 and c.array.shape == (20, 15) and c.array.dtype == np.float32
    np.testing.assert_array_equal(c.array, w)
    assert Constant("s", np.array(["a", "bc"], object)).array.dtype == object   # strings as they are
    x = RNG.standard_normal((1, 15, 6, 6)).astype(np.float32)
    g = Graph("conv", (Value("x", TensorType(F32, (1, 15, 6, 6))),), (Value("y", TensorType(F32, (1, 20, 6, 6))),),
              (Node("Conv", "conv", ("x", "w"), ("y",), ()),), (Constant("w", w.reshape(20, 15, 1, 1)),), 17)
    model = compile_graph(g, "host", passes=True)
    got = model.run({"x": x})["y"]
    np.testing.assert_allclose(got, np.einsum("nchw,mc->nmhw", x, w), rtol=1e-4, atol=1e-5)
    plan = model._latest_plan("x")
    assert all(a.ctypes.data % 64 == 0 for a in plan.plan.constants.values() if a.nbytes)
    assert all(a.ctypes.data % 64 == 0 for a in plan.program.layout.constants.values() if a.nbytes >= 64)
