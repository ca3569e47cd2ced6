"""The public entry points: ``define``, ``compile`` (and ``compile_graph``) and ``einsum``."""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from polyfuse.autotune.lookup import Tuning
from polyfuse.autotune.records import Records
from polyfuse.errors import ArgumentError, DTypeError, FrontendError, ModelError
from polyfuse.frontends.einsum import einsum_source
from polyfuse.frontends.tc import parse
from polyfuse.ir.graph import Graph
from polyfuse.ir.profile import Profile
from polyfuse.ir.types import DType
from polyfuse.runtime.kernel import Kernel, KernelModule, check_target
from polyfuse.lowering.calibration import QuantizeOptions
from polyfuse.runtime.model import MAX_PLANS, CompiledModel
from polyfuse.runtime.profiling import ModelSource, beside
from polyfuse.runtime.saved_programs import ModelStore, files_digest, known_digest
from polyfuse.scheduler.options import MappingOptions, check_options
from polyfuse.scheduler.pipeline import Usage
from polyfuse.targets import Device, Target


SIZES = ("specialized", "symbolic")
MATMUL_PRECISIONS = ("ieee", "tf32")   # how float32 contractions may round (define's precision)


def define(source: str, *, target: str | Target = "reference",
           options: MappingOptions | None = None,
           tuning_records: str | os.PathLike | Records | None = None,
           sizes: str = "specialized", precision: str = "ieee") -> KernelModule:
    """Compile the TC definitions in ``source`` for ``target``.

    Returns a module whose definitions are attributes: ``define(src).mm(A, B)``.
    Targets: ``"reference"`` (numpy interpreter), ``"x86"``, ``"aarch64"``, ``"cuda"``,
    ``"host"`` (this machine's CPU). ``options`` fixes the schedule of native targets;
    else ``tuning_records`` (a file ``polyfuse tune`` wrote) gives the best tuned options
    for each shape (or those of the nearest tuned shapes), else a heuristic chooses.
    ``sizes``: ``"specialized"`` compiles a kernel for each set of sizes it is called
    at; ``"symbolic"`` (CPU targets this machine runs) compiles one kernel, at the first call, whose sizes
    are parameters: later calls at other sizes run it without compiling (with the first
    call's options; see :attr:`~polyfuse.runtime.kernel.Kernel.symbolic_sizes`).
    ``precision``: ``"ieee"`` computes float32 products exactly (FFMA on the GPU);
    ``"tf32"`` lets float32 contractions on ``cuda`` run on the tensor cores, their
    operands rounded to TF32 (10-bit fractions, as the ``tf32`` builtin rounds; sums stay
    float32), as torch's ``allow_tf32``. CPU targets compute exactly either way;
    bfloat16 and float16 operands use the tensor cores always.
    """
    if not isinstance(source, str):
        raise ArgumentError(f"define() takes TC source text, got {type(source).__name__}")
    _check_sizes(sizes)
    _check_matmul_precision(precision)
    tgt, options = _checked(target, options, "define()")
    module = parse(source)
    records = Records.open(tuning_records)
    tuning = None if records is None else Tuning(records)
    return KernelModule({d.name: Kernel(d, tgt, source, options, tuning, Usage(precision=precision),
                                        symbolic=sizes == "symbolic")
                         for d in module.definitions})


PRECISIONS = ("float32", "tf32", "bf16", "int8")


def _check_sizes(sizes: object) -> None:
    if sizes not in SIZES:
        raise ArgumentError(f"sizes must be one of {', '.join(map(repr, SIZES))}, got {sizes!r}")


def _check_matmul_precision(precision: str) -> None:
    if precision not in MATMUL_PRECISIONS:
        raise ArgumentError(f"precision must be one of {', '.join(map(repr, MATMUL_PRECISIONS))}, "
                            f"got {precision!r}")


def compile(model: Any, *, target: str | Target = "reference",
            input_shapes: dict[str, tuple[int, ...]] | None = None,
            tuning_records: str | os.PathLike | Records | None = None,
            options: MappingOptions | None = None, precision: str = "float32",
            profile: str | os.PathLike | Profile | None = None,
            quantization: QuantizeOptions | None = None, max_plans: int = MAX_PLANS,
            sizes: str = "symbolic") -> CompiledModel:
    """Compile a model for ``target``: an ONNX model (path, bytes or ``ModelProto``), or
    a PyTorch ``ExportedProgram`` (``torch.export.export``) or ``.pt2`` file
    (``torch.export.save``).

    The result runs with ``model.run({name: array})`` or ``model(*arrays)``; shapes are
    taken from the first call for each set of input shapes, or fixed by ``input_shapes``.
    ``tuning_records`` gives each kernel its best tuned options, as for :func:`define`.
    ``precision="int8"`` quantizes an ONNX model first, calibrated from ``profile`` (a
    :class:`~polyfuse.ir.profile.Profile` of this model, or its file) as ``quantization``
    says (:class:`~polyfuse.lowering.calibration.QuantizeOptions`): the QDQ model
    ``polyfuse quantize`` writes, whose products then run on integers.
    ``precision="bf16"`` multiplies by constant weights (MatMul, Gemm, Conv) on bfloat16
    operands with float32 sums, the weights rounded at compile time; the rest stays
    float32 (:mod:`polyfuse.lowering.bfloat16`). ``precision="tf32"`` lets float32
    contractions on ``cuda`` run on the tensor cores, their operands rounded to TF32
    (``define``'s ``precision="tf32"``); CPU targets compute them exactly.
    ``max_plans``: how many plans (one per set of input shapes) the model keeps, the
    least recently used dropped first with the memory it alone holds (``model.max_plans``
    changes it later).
    ``sizes``: ``"symbolic"`` (CPU targets this machine runs) compiles the first shape's
    kernels for its sizes; planned at another shape, a kernel whose text differs only in
    sizes (a batch, a sequence length) is compiled once more with those sizes as
    parameters, and every later shape it fits runs that kernel without compiling
    (:mod:`polyfuse.runtime.generalize`). ``"specialized"`` compiles kernels for each
    shape's sizes.
    """
    tgt, options = _checked(target, options, "compile()")
    _check_sizes(sizes)
    _check_precision(model, precision, profile, quantization)
    matmul_precision = "tf32" if precision == "tf32" else "ieee"
    if is_torch_program(model):
        graph, stages = _optimized(_front_end(model), precision)
        return _compiled(graph, tgt, options, input_shapes, tuning_records, stages, None, max_plans,
                         matmul_precision, sizes)
    from polyfuse.frontends.onnx_quantize import quantize
    if precision == "int8":
        model = quantize(model, profile, quantization or QuantizeOptions())  # type: ignore[arg-type]
    records = Records.open(tuning_records)
    settings = _store_settings(tgt, options, precision, sizes, records, input_shapes)
    path = Path(model) if isinstance(model, (str, os.PathLike)) else None
    known = known_digest(path) if path is not None and settings is not None else None
    if known is not None and path is not None and settings is not None and not _named(input_shapes):
        store = ModelStore(known, settings)
        saved = store.model()
        if saved is not None:   # compiled before: the front end runs when a plan is not saved
            deferred = _DeferredPlanner(path.resolve(), precision, known)   # (the same file, wherever the cwd)
            return CompiledModel(deferred, tgt, options=options, input_shapes=input_shapes,
                                 stages=_DeferredStages(deferred), tuning=Tuning(records), source=deferred.source,
                                 max_plans=max_plans, precision=matmul_precision, sizes=sizes, store=store,
                                 io=(tuple(v.value() for v in saved.inputs), tuple(v.value() for v in saved.outputs)),
                                 value_inputs=saved.value_inputs)
    planner, stages, source, digest = _onnx_front_end(model, precision)
    return CompiledModel(planner, tgt, options=options, input_shapes=input_shapes, stages=stages,
                         tuning=Tuning(records), source=source, max_plans=max_plans, precision=matmul_precision,
                         sizes=sizes,
                         store=ModelStore(known or digest, settings) if settings is not None and digest else None)


def _onnx_front_end(model: Any, precision: str, expected: str | None = None
                    ) -> tuple[Any, dict[str, object], ModelSource, Future[str] | None]:
    """An ONNX model's planner (its graph through the front end and the graph passes),
    the texts of its stages, its source and a future of the digest its saved programs
    are keyed by (None where they cannot be: tensors in external files of a model not
    given by its path). ``expected``: that digest, known before (an error where the
    model's files no longer match it)."""
    from polyfuse.frontends.onnx import read_model
    from polyfuse.frontends.onnx_quantize import model_digest
    from polyfuse.lowering.plan import GraphPlanner
    proto, data, external = read_model(model)   # (a file read once: the front end's and the digest's)
    path = Path(model) if isinstance(model, (str, os.PathLike)) else None
    hashed = beside(model_digest, data)
    del data
    digest = beside(files_digest, hashed, path, external) if path is not None or not external else None
    # (the files' stat unchanged since their digest was remembered, after reading them:
    # what was read is what was hashed, without waiting for the hash)
    if expected is not None and not (path is not None and known_digest(path) == expected) \
            and (digest is None or digest.result() != expected):
        raise ModelError(f"the model {'file ' + repr(str(path)) + ' ' if path else ''}changed after "
                         "polyfuse.compile() read it; compile it again")
    graph = _front_end(proto)
    source = ModelSource(graph, hashed)
    graph, stages = _optimized(graph, precision)
    return GraphPlanner(graph), _shown(graph, stages), source, digest


class _DeferredPlanner:
    """The planner (:class:`~polyfuse.ir.plan.Planner`) of an ONNX model whose front end
    runs when first asked: a model compiled before, whose saved programs run without it
    (:mod:`polyfuse.runtime.saved_programs`). ``digest``: the model's, when it was saved
    (its files must still match)."""

    def __init__(self, model: Any, precision: str, digest: str) -> None:
        self._args = (model, precision, digest)
        self._made: tuple[Any, dict[str, object], ModelSource] | None = None
        self._lock = threading.Lock()

    def made(self) -> tuple[Any, dict[str, object], ModelSource]:
        """The planner, the stages' texts and the source, from the front end run once."""
        if self._made is None:
            with self._lock:
                if self._made is None:
                    self._made = _onnx_front_end(*self._args)[:3]
        return self._made

    @property
    def graph(self) -> Graph:
        return self.made()[0].graph   # type: ignore[no-any-return]

    def plan(self, shapes: Mapping[str, tuple[int, ...]], values: Mapping[str, np.ndarray]) -> Any:
        return self.made()[0].plan(shapes, values)

    def subgraph(self, graph: Graph, passes: bool) -> Any:
        return self.made()[0].subgraph(graph, passes)

    def definition(self, source: str, sizes: tuple[str, ...] = ()) -> Any:
        return self.made()[0].definition(source, sizes)

    def source(self) -> ModelSource:
        return self.made()[2]


class _DeferredStages(Mapping[str, object]):
    """The texts of a deferred model's stages before planning (``dump``), when first read."""

    def __init__(self, planner: _DeferredPlanner) -> None:
        self._planner = planner

    def __getitem__(self, stage: str) -> object:
        return self._planner.made()[1][stage]

    def __iter__(self) -> Iterator[str]:
        return iter(self._planner.made()[1])

    def __len__(self) -> int:
        return len(self._planner.made()[1])


def _named(input_shapes: object) -> bool:
    """Whether ``input_shapes`` names a dimension (the model is then compiled ahead)."""
    return isinstance(input_shapes, Mapping) and any(
        isinstance(d, str) for s in input_shapes.values() if isinstance(s, (tuple, list)) for d in s)


def _store_settings(target: Target, options: MappingOptions | None, precision: str, sizes: str,
                    records: Records | None, input_shapes: object) -> list[str] | None:
    """What a model's saved programs depend on besides its bytes (the input shapes too: a
    plan's program depends on the plans the model made before, and those given ahead
    are among them); None where programs are not saved (the disk cache off, code this
    process does not run natively)."""
    from polyfuse.runtime.cache import cache_dir
    from polyfuse.targets.cpu import runs_natively, target_description
    if cache_dir() is None or not target.backend.cpus or target.backend.device is Device.GPU \
            or not runs_natively(target):
        return None
    tuned = "" if records is None else hashlib.sha256(repr(records.records).encode()).hexdigest()
    shapes = repr(sorted(input_shapes.items(), key=str)) if isinstance(input_shapes, Mapping) else repr(input_shapes)
    return [str(target), target_description(target), repr(options), precision, sizes, tuned, shapes]


def _check_precision(model: Any, precision: str, profile: object, quantization: object) -> None:
    """``precision`` known, and a profile (and quantization options) given exactly when int8
    asks for one."""
    if precision not in PRECISIONS:
        raise ArgumentError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, "
                            f"got {precision!r}")
    if precision == "int8":
        if profile is None:
            raise ArgumentError("precision='int8' needs profile=: the ranges of the model's "
                                "tensors, from model.profile_ranges(feeds) on the float model "
                                "or `polyfuse profile`")
        if is_torch_program(model):
            raise ArgumentError("precision='int8' quantizes ONNX models; export the program "
                                "to ONNX first")
    elif profile is not None or quantization is not None:
        raise ArgumentError("profile= and quantization= calibrate precision='int8'; "
                            f"this compile asks for {precision}")
    if quantization is not None and not isinstance(quantization, QuantizeOptions):
        raise ArgumentError(f"quantization must be a QuantizeOptions, got "
                            f"{type(quantization).__name__}")


def is_torch_program(model: Any) -> bool:
    """Whether ``model`` is a torch ``ExportedProgram`` or names a ``.pt2`` file (known
    without importing torch)."""
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model).endswith(".pt2")
    return type(model).__name__ == "ExportedProgram" and type(model).__module__.startswith("torch")


def _front_end(model: Any) -> Graph:
    """The graph IR of a model, read by the front end its kind asks for."""
    if is_torch_program(model):
        from polyfuse.frontends.torch import from_exported
        return from_exported(model)
    from polyfuse.frontends.onnx import to_graph
    from polyfuse.ir.graph import SUBGRAPH_ATTRS
    from polyfuse.lowering.ops import OPS
    return to_graph(model, set(OPS) | set(SUBGRAPH_ATTRS))


def _optimized(graph: Graph, precision: str = "float32") -> tuple[Graph, dict[str, object]]:
    """``graph`` after the graph passes for ``precision``, and its text after each pass."""
    from polyfuse.lowering.graph_passes import PassManager, graph_passes
    passes = PassManager(graph_passes(precision), verify=True, keep=True)
    graph = passes.run(graph)
    return graph, dict(passes.graphs)


def compile_graph(graph: Graph, target: str | Target = "reference", *,
                  options: MappingOptions | None = None,
                  input_shapes: dict[str, tuple[int, ...]] | None = None,
                  tuning_records: str | os.PathLike | Records | None = None,
                  stages: Mapping[str, object] | None = None,
                  passes: bool = False, max_plans: int = MAX_PLANS, precision: str = "ieee",
                  sizes: str = "symbolic") -> CompiledModel:
    """Compile a graph of the graph IR for ``target``: as it is, or with ``passes`` after
    the graph passes ``compile`` runs. The stages ``dump`` shows are ``stages`` (the graph
    after each pass that made it), then ``groups``, ``plan`` and the kernels'.
    ``precision`` as :func:`define` takes it, ``sizes`` as :func:`compile`."""
    _check_matmul_precision(precision)
    _check_sizes(sizes)
    tgt, options = _checked(target, options, "compile()")
    if passes:
        graph, made = _optimized(graph)
        stages = {**(stages or {}), **made}
    return _compiled(graph, tgt, options, input_shapes, tuning_records, stages or {}, None, max_plans, precision,
                     sizes)


def _checked(target: str | Target, options: MappingOptions | None,
             caller: str) -> tuple[Target, MappingOptions | None]:
    """The target parsed and known to have a code generator, and the options checked."""
    options = check_options(options, caller)
    tgt = Target.parse(target)
    check_target(tgt)
    return tgt, options


def _shown(graph: Graph, stages: Mapping[str, object]) -> dict[str, object]:
    """The texts of a model's stages before planning: ``stages``, then the fusion groups."""
    from polyfuse.lowering.fusion import describe_groups
    return {**stages, "groups": describe_groups(graph) or "(no fusion groups)"}


def _compiled(graph: Graph, target: Target, options: MappingOptions | None,
              input_shapes: dict[str, tuple[int, ...]] | None,
              tuning_records: str | os.PathLike | Records | None,
              stages: Mapping[str, object], source: ModelSource | None = None,
              max_plans: int = MAX_PLANS, precision: str = "ieee", sizes: str = "symbolic") -> CompiledModel:
    from polyfuse.lowering.plan import GraphPlanner
    return CompiledModel(GraphPlanner(graph), target, options=options, input_shapes=input_shapes,
                         stages=_shown(graph, stages), tuning=Tuning(Records.open(tuning_records)), source=source,
                         max_plans=max_plans, precision=precision, sizes=sizes)


@functools.lru_cache(maxsize=256)
def _einsum_kernel(source: str, target: Target) -> Kernel:
    return define(source, target=target).einsum


def einsum(subscripts: str, *operands: Any, target: str | Target = "reference") -> np.ndarray:
    """``np.einsum(subscripts, *operands)`` computed by a generated TC definition."""
    arrays = []
    for k, op in enumerate(operands):
        if not isinstance(op, (np.ndarray, np.generic)):
            raise ArgumentError(f"einsum: operand {k} must be a numpy array, got {type(op).__name__}")
        arrays.append(np.asarray(op))
    dtypes = []
    for k, a in enumerate(arrays):
        dt = DType.from_numpy(a.dtype)
        if dt is None:
            raise DTypeError(f"einsum: operand {k} has dtype {a.dtype}, which polyfuse does not support")
        dtypes.append(dt)
    source = einsum_source(subscripts, dtypes, [a.ndim for a in arrays])
    try:
        kernel = _einsum_kernel(source, Target.parse(target))
    except FrontendError as err:
        raise ArgumentError(f"einsum: cannot compute '{subscripts}': {err.message}") from None
    return kernel(*arrays)  # type: ignore[return-value]
