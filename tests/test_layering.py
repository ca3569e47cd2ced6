"""polyfuse's imports follow its layers: ``ir <- frontends, lowering <- scheduler <- targets
<- runtime <- autotune <- cli`` (docs/DESIGN.md), with no import circle.

The import graph is read statically (``ast``) from every module under ``polyfuse/``, with
imports at module level (run when the module is imported) apart from those inside
functions (run when the function is called) and those under ``if TYPE_CHECKING:`` (never
run, but a reader still follows them). None of the three kinds may go against the layers
or close a circle.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polyfuse
import pytest

ROOT = Path(polyfuse.__file__).parent

# Each top-level part of the package and its layer: a module may import modules of its own
# layer or lower ones. errors and version sit with ir: every layer raises errors, and the
# disk cache and tuning records note the version.
# _native is the runtime's C++ extension; torch is the PyTorch face (torch.compile backend,
# TC definitions as torch ops), beside the ONNX backend.
LAYERS = {"errors": 0, "version": 0, "ir": 0, "frontends": 1, "lowering": 1, "scheduler": 2,
          "targets": 3, "runtime": 4, "_native": 4, "autotune": 5, "driver": 6, "backend": 6,
          "torch": 6, "cli": 6, "__main__": 6, "__init__": 6}
# lower layers a part must not import all the same (importer prefix, imported prefix):
# runtime executes what lowering made, and only the ONNX face may load onnx
FORBIDDEN = (("runtime", "lowering"), ("runtime", "frontends"), ("lowering", "frontends.onnx"))

# third-party packages only some parts may import (at module level or in functions)
OWNERS = {"onnx": ("frontends.onnx", "frontends.onnx_schema", "frontends.onnx_quantize", "backend"), "onnxruntime": (),
          "torch": ("frontends.torch", "torch"), "islpy": ("scheduler",),
          "llvmlite": ("targets",), "cuda": ("targets",)}


@dataclass(frozen=True)
class Imports:
    """One module's imports of other polyfuse modules (named without "polyfuse.") and of
    the third-party packages in OWNERS."""

    top: frozenset[str]           # at module level
    local: frozenset[str]         # only inside functions
    typing: frozenset[str]        # only under `if TYPE_CHECKING:`
    external: frozenset[str]      # third-party packages, anywhere


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) or "polyfuse"


def modules() -> dict[str, Path | None]:
    """Every module: its source, or None for an extension module."""
    found: dict[str, Path | None] = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
    for p in ROOT.rglob("*.so"):
        found.setdefault(module_name(p.with_name(p.name.split(".")[0])), None)
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING" or \
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _imported(node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    """The names ``node`` imports: ``from A import b`` names A.b when that is a module
    (A's ``__init__`` runs too, but that is A's own import), else A."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert not node.level, "polyfuse imports absolutely"
    package = node.module or ""
    return [f"{package}.{a.name}" if f"{package}.{a.name}".removeprefix("polyfuse.") in known
            else package for a in node.names]


def read_imports(name: str, path: Path, known: set[str]) -> Imports:
    found: dict[str, set[str]] = {"top": set(), "local": set(), "typing": set()}

    def visit(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for stmt in child.body:
                    visit(ast.Module([stmt], []), "typing")
                for stmt in child.orelse:
                    visit(ast.Module([stmt], []), kind)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                found[kind].update(_imported(child, known))
            inner = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            visit(child, "local" if inner and kind == "top" else kind)

    visit(ast.parse(path.read_text(), str(path)), "top")

    def ours(names: set[str]) -> frozenset[str]:
        return frozenset(n.removeprefix("polyfuse.") for n in names
                         if n == "polyfuse" or n.startswith("polyfuse.")) - {name}

    top = ours(found["top"])
    local = ours(found["local"]) - top
    every = found["top"] | found["local"] | found["typing"]
    return Imports(top, local, ours(found["typing"]) - top - local,
                   frozenset(n.split(".")[0] for n in every if n.split(".")[0] in OWNERS))


@functools.cache
def import_graph() -> dict[str, Imports]:
    found = modules()
    known = set(found)
    empty = Imports(frozenset(), frozenset(), frozenset(), frozenset())
    return {name: read_imports(name, path, known) if path else empty
            for name, path in found.items()}


def _part(module: str) -> str:
    return module.split(".")[0] if module != "polyfuse" else "__init__"


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def allowed(importer: str, imported: str) -> bool:
    """Whether ``importer`` may import ``imported`` (the package itself is the top layer)."""
    return LAYERS[_part(imported)] <= LAYERS[_part(importer)] and \
        not any(_within(importer, a) and _within(imported, b) for a, b in FORBIDDEN)


KINDS = ("top", "local", "typing")


def inversions(graph: dict[str, Imports], kind: str) -> set[tuple[str, str]]:
    """The imports of one kind ("top", "local", "typing") that go against the layers."""
    return {(m, t) for m, imports in graph.items() for t in getattr(imports, kind)
            if not allowed(m, t)}


def circles(graph: dict[str, Imports], kinds: tuple[str, ...]) -> set[frozenset[str]]:
    """The import circles (strongly connected components of more than one module) through
    imports of ``kinds``."""
    edges = {m: sorted(t for k in kinds for t in getattr(i, k) if t in graph)
             for m, i in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()
    for root in sorted(edges):   # Tarjan's algorithm, iterative
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        work = [(root, iter(edges[root]))]
        while work:
            node, successors = work[-1]
            for w in successors:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    work.append((w, iter(edges[w])))
                    break
                if w in stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while not component or w != node:
                        w = stack.pop()
                        component.add(w)
                    if len(component) > 1:
                        found.add(frozenset(component))
    return found


def foreign_imports(graph: dict[str, Imports]) -> set[tuple[str, str]]:
    """Third-party packages imported outside the parts that own them (docs/DESIGN.md)."""
    return {(m, p) for m, i in graph.items() for p in i.external
            if not any(_within(m, owner) for owner in OWNERS[p])}


def report() -> str:
    """Every inversion and circle, as text (``python -c 'import tests.test_layering as t;
    print(t.report())'``)."""
    g = import_graph()
    lines = [f"{kind} import against the layers: {m} -> {t}" for kind in KINDS
             for m, t in sorted(inversions(g, kind))]
    for n in range(1, len(KINDS) + 1):
        lines += [f"circle through {'+'.join(KINDS[:n])} imports: {', '.join(sorted(c))}"
                  for c in sorted(circles(g, KINDS[:n]), key=sorted)]
    lines += [f"{p} imported by {m}" for m, p in sorted(foreign_imports(g))]
    return "\n".join(lines)


# the one third-party import outside its owner: the runtime links a program's kernels with
# llvmlite's linker (runtime/link.py, for bundles and emulated programs)
ALLOWED_FOREIGN = {("runtime.link", "llvmlite")}


@pytest.mark.unit
def test_graph_reading():
    """The checker sees imports of each kind where they are."""
    g = import_graph()
    assert "lowering.ops.elementwise" in g and "_native" in g
    assert "frontends.onnx_schema" in g["lowering.ops"].top
    assert "runtime.native" in g["runtime.cpu"].top
    assert "runtime.cross" in g["runtime.bundle"].local
    assert "targets.target" in g["targets.cpu"].typing
    assert g["frontends.onnx"].external == {"onnx"}
    assert allowed("runtime.cpu", "targets.cpu") and not allowed("targets.cpu", "runtime.native")
    assert not allowed("lowering.ops", "frontends.onnx") and allowed("lowering.ops", "frontends.einsum")
    assert circles({"a": Imports(frozenset({"b"}), frozenset(), frozenset(), frozenset()),
                    "b": Imports(frozenset({"a"}), frozenset(), frozenset(), frozenset()),
                    "c": Imports(frozenset({"a"}), frozenset(), frozenset(), frozenset())},
                   ("top",)) == {frozenset({"a", "b"})}


@pytest.mark.unit
def test_imports_follow_the_layers():
    g = import_graph()
    for kind in KINDS:
        wrong = inversions(g, kind)
        assert not wrong, f"{kind} imports against the layers (docs/DESIGN.md): {sorted(wrong)}"


@pytest.mark.unit
def test_no_import_circle():
    """Not even through imports inside functions or under TYPE_CHECKING."""
    g = import_graph()
    for n in range(1, len(KINDS) + 1):
        found = circles(g, KINDS[:n])
        assert not found, f"import circles through {'+'.join(KINDS[:n])} imports: " \
            f"{[sorted(c) for c in found]}"


def test_loop_passes_import_only_the_ir():
    """A loop pass (a module of scheduler/loop_passes) builds on the IR alone: no pass
    imports another pass or the scheduler's other parts (what a pass needs from them, the
    pipeline gives it as arguments), and nothing outside the scheduler imports a pass's
    module."""
    g = import_graph()
    passes = {m for m in g if m.startswith("scheduler.loop_passes.")}
    assert len(passes) >= 8
    for m in passes:
        imports = g[m].top | g[m].local | g[m].typing
        wrong = {t for t in imports if not (t.split(".")[0] in ("ir", "errors"))}
        assert not wrong, f"{m} imports {sorted(wrong)}: loop passes import only polyfuse.ir"
    users = {(m, t) for m, i in g.items() if not m.startswith("scheduler")
             for t in i.top | i.local | i.typing if t in passes}
    assert not users, f"modules outside the scheduler import loop passes' modules: {sorted(users)}"


@pytest.mark.unit
def test_runtime_executes_plans_without_the_layers_above():
    """The runtime imports neither the lowering, the front ends nor the autotuner: plans
    and tuning arrive from the driver."""
    g = import_graph()
    for m, i in g.items():
        if _within(m, "runtime"):
            bad = {t for t in i.top | i.local | i.typing
                   if any(_within(t, p) for p in ("lowering", "frontends", "autotune"))}
            assert not bad, (m, bad)


@pytest.mark.unit
def test_runtime_reaches_the_lowering_only_through_the_planner():
    """The runtime runs Plans; for shapes it has no plan for, and for data-dependent
    control flow, it asks the one object of the re-planning protocol
    (``polyfuse.ir.plan.Planner``) it is given. No closure that makes plans is handed to
    it: no runtime module takes a callable returning a Plan or a planner, and a compiled
    model refuses a bare planning function."""
    import functools
    import re

    from polyfuse.errors import ArgumentError
    from polyfuse.frontends.graph_text import parse_graph
    from polyfuse.lowering.plan import GraphPlanner, plan_graph
    from polyfuse.runtime.model import CompiledModel
    from polyfuse.targets import Target

    planning = re.compile(r"\bPlan(ner|ning)?\b")
    found = []
    for m, path in modules().items():
        if path is None or not _within(m, "runtime"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("Callable") and \
                    planning.search(ast.unparse(node.slice)):
                found.append(f"{m}:{node.lineno} {ast.unparse(node)}")
    assert not found, f"runtime modules take planning callables: {found}"

    g = parse_graph("graph g(%x: float32[2, 3]) -> (%y: float32[2, 3]) opset 17 {\n  %y = Relu(%x)  # r\n}")
    reference = Target.parse("reference")
    with pytest.raises(ArgumentError, match="Planner"):
        CompiledModel(functools.partial(plan_graph, g), reference)   # type: ignore[arg-type]
    model = CompiledModel(GraphPlanner(g), reference)
    x = np.arange(-3.0, 3.0, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(model.run({"x": x})["y"], np.maximum(x, 0))


@pytest.mark.unit
def test_third_party_packages_stay_with_their_owners():
    assert foreign_imports(import_graph()) <= ALLOWED_FOREIGN


@pytest.mark.unit
def test_lowering_does_not_import_the_onnx_front_end():
    g = import_graph()
    for m, i in g.items():
        if _within(m, "lowering"):
            assert not any(_within(t, "frontends.onnx") for t in i.top | i.local | i.typing), m


def test_import_polyfuse_loads_neither_onnx_nor_torch():
    """In a fresh process: TC users do not pay for onnx (compile() loads it when called)."""
    code = ("import sys, polyfuse\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'onnx', 'onnxruntime', 'torch'}))\n"
            "polyfuse.define('def f(float(N) A) -> (B) { B(i) = A(i) }')\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'onnx', 'onnxruntime', 'torch'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "[]"]
    assert out.stderr == ""
