"""Callable kernels: what ``polyfuse.define`` returns.

A :class:`Kernel` is one TC ``def`` for one target. Calling it checks the arguments,
specializes the definition to their shapes and dtypes (cached), and runs it. A
:class:`SpecializedKernel` keeps the text of every stage it went through. A kernel made
with ``symbolic`` (``define(..., sizes="symbolic")``) compiles once, at its first call,
code whose sizes are parameters; each specialization then binds the sizes to that code
(:class:`SizesBound`, see :attr:`Kernel.symbolic_sizes`).

``kernel(*args, out=arrays)`` writes the results into the caller's arrays and returns
them (TC's in-place form; see :mod:`polyfuse.runtime.outputs`). A definition whose
reduction without ``!`` accumulates into an output (``C(m,n) += ...`` as its first
writer) must be called that way: TC takes such outputs' initial contents from the caller.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Protocol

import numpy as np

from polyfuse.errors import AccessRangeError, ArgumentError, ShapeError, TargetError
from polyfuse.ir.comprehension import Definition
from polyfuse.ir.comprehension_interpreter import interpret
from polyfuse.ir.limits import check_tensor_size
from polyfuse.ir.symbolic import evaluate_int
from polyfuse.ir.sizes import bind_sizes
from polyfuse.runtime import outputs as given_outputs
from polyfuse.runtime.arguments import BoundArguments, bind_arguments, check_scalars
from polyfuse.scheduler.model import SYMBOLIC_MAX, initial_outputs, skipped_inits
from polyfuse.scheduler.bounds import check_accesses
from polyfuse.scheduler.options import MappingOptions, check_options
from polyfuse.scheduler.pipeline import SymbolicSignatures, Usage
from polyfuse.targets import BACKENDS, Codegen, Device, Target

Executable = Callable[[Mapping[str, object]], dict[str, np.ndarray]]

SPECIALIZATIONS = 64   # the specializations (sizes, dtypes) a Kernel keeps at hand, most recent first
# ... one compiled for symbolic sizes (binding another costs milliseconds, and a model's
# plans keep the ones they run: more would only hold IR for the garbage collector to scan)
SYMBOLIC_SPECIALIZATIONS = 8


class Tuning(Protocol):
    """What the runtime asks the autotuner (``polyfuse.autotune.lookup.Tuning``): the
    tuned options of a definition called with arrays of these shapes and dtypes, and the
    tuning task of such a call (what ``CompiledModel.tasks`` lists)."""

    def options(self, definition: Definition, arrays: Sequence[np.ndarray],
                target: Target) -> MappingOptions | None: ...

    def task(self, definition: Definition, arrays: Sequence[np.ndarray], target: Target,
             label: str = "") -> Any: ...


Builder = Callable[[Definition, Mapping[str, int], Target, "MappingOptions | None", dict[str, str],
                    Usage], Executable]


def _build_reference(d: Definition, sizes: Mapping[str, int], target: Target,
                     options: MappingOptions | None, stages: dict[str, str],
                     usage: Usage = Usage()) -> Executable:
    check_accesses(d, sizes)  # the refusals of the native targets, before anything runs
    return lambda values: interpret(d, values, sizes)


def _build_cpu(d: Definition, sizes: Mapping[str, int], target: Target,
               options: MappingOptions | None, stages: dict[str, str],
               usage: Usage = Usage()) -> Executable:
    from polyfuse.runtime import cpu  # loads LLVM and the native runtime
    return cpu.build(d, sizes, target, options, stages, usage)


def _build_cuda(d: Definition, sizes: Mapping[str, int], target: Target,
                options: MappingOptions | None, stages: dict[str, str],
                usage: Usage = Usage()) -> Executable:
    from polyfuse.runtime import cuda  # loads NVRTC; the driver only when a kernel runs
    return cuda.build(d, sizes, target, options, stages, usage.precision)


# what builds a kernel for each code generator of the backend registry
CODEGEN_BUILDERS: dict[Codegen, Builder] = {
    Codegen.INTERPRETER: _build_reference,
    Codegen.LLVM: _build_cpu,
    Codegen.CUDA: _build_cuda,
}

# target name -> builder(definition, sizes, target, options, stages to fill, constant
# parameters) -> executable
BUILDERS: dict[str, Builder] = {name: CODEGEN_BUILDERS[b.codegen] for name, b in BACKENDS.items()}


def check_target(target: Target) -> None:
    """Refuse a target polyfuse cannot compile for, or a CPU or feature LLVM does not know."""
    if target.name not in BUILDERS:
        raise TargetError(
            f"target '{target.name}' has no code generator in this version of polyfuse yet; "
            f"available: {', '.join(BUILDERS)}")
    if target.backend.cpus and (target.cpu or target.features):   # names LLVM must know
        from polyfuse.targets.cpu import target_machine
        target_machine(target)


def compiles_symbolic(target: Target) -> bool:
    """Whether kernels for ``target`` can be compiled for symbolic sizes: CPU code this
    process runs (code run under qemu is called at fixed shapes)."""
    if target.backend.codegen is not Codegen.LLVM:
        return False
    from polyfuse.targets.cpu import runs_natively
    return runs_natively(target)


class Stages(dict):
    """Stage name -> text. A stage costly to print and seldom read (a CPU kernel's
    assembly) is registered with :meth:`later` and printed the first time it is read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._later: dict[str, Callable[[], str]] = {}

    def later(self, name: str, make: Callable[[], str]) -> None:
        self._later[name] = make

    def __missing__(self, name: str) -> str:
        make = self._later.pop(name, None)
        if make is None:
            raise KeyError(name)
        self[name] = text = make()
        return text

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self, name) or name in self._later

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def printed(self) -> dict[str, str]:
        """Every stage's text, those registered with :meth:`later` printed now."""
        return {name: self[name] for name in [*self.keys(), *self._later]}


@dataclass(frozen=True)
class SpecializedKernel:
    """A kernel fixed to concrete sizes and dtypes; ``stages`` maps stage name -> text."""

    definition: Definition          # with every size bound
    sizes: dict[str, int]
    target: Target
    stages: dict[str, str]
    run: Executable = field(repr=False)
    unbound: Definition | None = field(default=None, repr=False, compare=False)

    @cached_property
    def output_shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(evaluate_int(s, {}) for s in t.shape) for t in self.definition.outputs)

    @cached_property
    def started_outputs(self) -> frozenset[str]:
        """Outputs a caller's ``out=`` array must be zeroed for: a covering ``+=!``
        compiles without its init (the definition it was built from says)."""
        source = self.unbound if self.unbound is not None else self.definition
        return frozenset(source.statements[k].tensor for k in skipped_inits(source))

    @property
    def output_dtypes(self) -> tuple[np.dtype, ...]:
        return tuple(t.dtype.numpy for t in self.definition.outputs)

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        out = _take_out(self.definition, kwargs)
        bound = bind_arguments(self.definition, args, kwargs)
        if out is not None:
            return self.run_into(bound.values, out)
        _refuse_without_out(self.definition)
        return _results(self.definition, self.run(bound.values))

    def run_into(self, values: Mapping[str, Any], out: object) -> Any:
        """Run on the bound argument ``values`` writing into the arrays of ``out`` (checked
        first); returns them."""
        d = self.definition
        given = given_outputs.bind_outputs(d, self.output_shapes, out, values,
                                           device=self.target.backend.device is Device.GPU)
        given_outputs.zero([a for n, a in given.items() if n in self.started_outputs])
        self.run({**values, **given})
        objects = given_outputs.given_arrays(d, out)
        return objects[0] if len(objects) == 1 else objects


def _take_out(d: Definition, kwargs: dict[str, Any]) -> object | None:
    """Remove and return ``out=`` (unless a parameter is named ``out``)."""
    if "out" not in kwargs or any(p.name == "out" for p in d.params):
        return None
    return kwargs.pop("out")


def _refuse_without_out(d: Definition) -> None:
    needed = initial_outputs(d)
    if needed:
        names = ", ".join(t.name for t in d.outputs)
        raise ArgumentError(
            f"{d.name}: output{'s' if len(needed) > 1 else ''} {', '.join(repr(n) for n in needed)} "
            f"start{'' if len(needed) > 1 else 's'} from the caller's contents (a reduction without "
            f"'!' accumulates into {'them' if len(needed) > 1 else 'it'}): pass the output"
            f"{'s' if len(d.outputs) > 1 else ''} with out= ({d.name}(..., out="
            f"{names if len(d.outputs) == 1 else '(' + names + ')'})), or write the reduction "
            f"with '!' to start from its identity")


def _results(d: Definition, outputs: dict[str, np.ndarray]) -> np.ndarray | tuple[np.ndarray, ...]:
    values = tuple(outputs[t.name] for t in d.outputs)
    return values[0] if len(values) == 1 else values


def _call_signature(args: tuple) -> tuple:
    """What argument checking depends on: array shapes and dtypes (and, for arrays of
    other libraries such as torch or CuPy, their type and device), scalar types."""
    return tuple((a.shape, a.dtype) if type(a) is np.ndarray else _foreign_signature(a) for a in args)


def _foreign_signature(a: Any) -> object:
    shape = getattr(a, "shape", None)
    if shape is None:
        return type(a)
    return (type(a), tuple(shape), str(getattr(a, "dtype", "")), str(getattr(a, "device", "")))


class Kernel:
    """One TC definition compiled for one target; call it with numpy arrays."""

    def __init__(self, definition: Definition, target: Target, source: str,
                 options: MappingOptions | None = None, tuning: Tuning | None = None,
                 usage: Usage = Usage(), symbolic: bool = False) -> None:
        """``usage``: what the caller promises (:class:`~polyfuse.scheduler.pipeline.Usage`):
        parameters whose values every call shares (a model's weights), which CPU kernels
        may read from copies packed ahead of time, and outputs it never reads.
        ``symbolic``: compile once for every size (see :meth:`symbolic_sizes`)."""
        check_target(target)
        self.symbolic = symbolic
        self._symbolic_options: MappingOptions | None = None   # a symbolic kernel's, from its first call
        self._symbolic_runs: dict[str, Executable] = {}   # its code per symbolic_signature
        self.usage = usage
        self.definition = definition
        self.target = target
        self.source = source
        self.options = check_options(options, "Kernel()")
        self.tuning = tuning        # tuned options per shape when none are given
        # the latest SPECIALIZATIONS specializations, by signature (older ones come back
        # from the compiled-kernel caches, in memory or on disk, when called again)
        self._cache: OrderedDict[tuple, SpecializedKernel] = OrderedDict()
        self._cache_lock = threading.Lock()
        # positional calls whose argument types, shapes and dtypes were checked before
        self._checked: dict[tuple, SpecializedKernel] = {}
        self._names = tuple(p.name for p in definition.params)
        self._sizes = frozenset(definition.sizes)   # (a walk of the whole definition: once)
        self._needs_out = bool(initial_outputs(definition))

    @property
    def name(self) -> str:
        return self.definition.name

    def __repr__(self) -> str:
        params = ", ".join(p.name for p in self.definition.params)
        outs = ", ".join(t.name for t in self.definition.outputs)
        return f"<polyfuse.Kernel {self.name}({params}) -> ({outs}) target={self.target}>"

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        out = _take_out(self.definition, kwargs)
        if out is None and self._needs_out:
            _refuse_without_out(self.definition)
        if not kwargs:
            key = _call_signature(args)
            kernel = self._checked.get(key)
            if kernel is not None:  # the fast path: same kinds of arguments as an earlier call
                values = check_scalars(self.definition, dict(zip(self._names, args)))
                if out is not None:
                    return kernel.run_into(values, out)
                return _results(self.definition, kernel.run(values))
        bound = bind_arguments(self.definition, args, kwargs)
        kernel = self._specialized(bound)
        if not kwargs and len(self._checked) < 64:
            self._checked[key] = kernel
        if out is not None:
            return kernel.run_into(bound.values, out)
        return _results(self.definition, kernel.run(bound.values))

    def specialize(self, *args: Any, **kwargs: Any) -> SpecializedKernel:
        """The kernel specialized to the shapes and dtypes of these arguments (``out=``
        is ignored: the results' shapes follow from the arguments)."""
        _take_out(self.definition, kwargs)
        return self._specialized(bind_arguments(self.definition, args, kwargs))

    def specialize_at(self, sizes: Mapping[str, int], *args: Any) -> SpecializedKernel:
        """:meth:`specialize`, with ``sizes`` that no argument's shape fixes (an output's
        extent the caller knows, as a plan knows a Range's length) given; a size an
        argument fixes must agree (else a ShapeError)."""
        bound = bind_arguments(self.definition, args)
        for name, value in sizes.items():
            if bound.sizes.get(name, value) != value:
                raise ShapeError(f"{self.name}: size {name} is {bound.sizes[name]} from the arguments, "
                                 f"not {value}")
        missing = self._sizes - set(bound.sizes) - set(sizes)
        if missing:
            raise ShapeError(f"{self.name}: sizes {sorted(missing)} are fixed by no argument; give them")
        return self._specialized(BoundArguments(bound.values, {**sizes, **bound.sizes}))

    def _specialized(self, bound: BoundArguments) -> SpecializedKernel:
        key = (bound.signature(), tuple(sorted(bound.sizes.items())))
        with self._cache_lock:
            kernel = self._cache.get(key)
            if kernel is not None:
                self._cache.move_to_end(key)
                return kernel
        options = self.options
        if options is None and self.tuning is not None and not self.definition.scalars:
            arrays = [bound.values[t.name] for t in self.definition.inputs]
            options = self.tuning.options(self.definition, arrays, self.target)
        kernel = self._build(bound.sizes, options)
        limit = SYMBOLIC_SPECIALIZATIONS if self.symbolic_sizes else SPECIALIZATIONS
        with self._cache_lock:
            self._cache[key] = kernel
            while len(self._cache) > limit:
                self._cache.popitem(last=False)
        return kernel

    @property
    def symbolic_sizes(self) -> frozenset[str]:
        """The sizes a compiled kernel of this definition leaves unknown: with
        ``symbolic``, on a CPU target this machine runs, every size of the definition (not one named like a
        parameter, whose value the kernel takes under that name). A call at new values
        of them binds the sizes and checks the accesses (milliseconds) and runs the code
        compiled at the first call, unless those checks differ (an access proven inside
        its tensor at one size but not at another): such sizes get a kernel of their
        own, compiled once. A size of 0 or above
        :data:`~polyfuse.scheduler.model.SYMBOLIC_MAX` gets a specialized kernel."""
        if not self.symbolic or not compiles_symbolic(self.target):
            return frozenset()
        return self._sizes - set(self._names)

    def compiled_at(self, sizes: Mapping[str, int], shapes: tuple[tuple[int, ...], ...]) -> SizesBound | None:
        """The code compiled earlier for symbolic sizes that runs at ``sizes`` (every size
        of the definition, its outputs then of ``shapes``: the caller checked both against
        its buffers), bound to them; None where there is none yet (a size outside the
        symbolic range, or accesses checked differently than at any size before)."""
        symbolic = self._signatures.symbolic   # (symbolic_sizes, read once)
        if not symbolic or not all(1 <= sizes[n] <= SYMBOLIC_MAX for n in symbolic):
            return None
        exe = self._symbolic_runs.get(self._signatures(dict(sizes)))
        return None if exe is None else SizesBound(exe, {n: sizes[n] for n in symbolic}, shapes)

    def signature_forms(self, sizes: Mapping[str, int]) -> tuple[frozenset[str], tuple, list] | None:
        """Where :meth:`compiled_at` picks code by affine forms at the values of
        ``sizes``' other sizes (:meth:`SymbolicSignatures.forms
        <polyfuse.scheduler.pipeline.SymbolicSignatures.forms>`): the symbolic sizes,
        the forms that, all >= 0, make the code depend only on which outputs need zeros,
        and those outputs' forms; None where it does not."""
        symbolic = self._signatures.symbolic
        forms = self._signatures.forms(dict(sizes)) if symbolic else None
        return None if forms is None else (symbolic, *forms)

    @cached_property
    def _signatures(self) -> SymbolicSignatures:
        """The symbolic signature of each size this kernel is bound at."""
        return SymbolicSignatures(self.definition, self.symbolic_sizes)

    def _build(self, sizes: dict[str, int], options: MappingOptions | None) -> SpecializedKernel:
        specialized = bind_sizes(self.definition, sizes)
        shapes = tuple(tuple(evaluate_int(s, {}) for s in t.shape) for t in specialized.outputs)
        for t, extents in zip(specialized.outputs, shapes):
            if any(e < 0 for e in extents):
                raise ShapeError(
                    f"{self.name}: output '{t.name}' would have shape {extents} for sizes "
                    f"{sizes}: the inputs are too small for the statement that writes it")
            # a shift by 2**62 asks for more memory than any machine has
            check_tensor_size(f"{self.name}: output '{t.name}'", t.dtype, extents)
        stages = Stages({"source": self.source})
        stages.later("comprehension", lambda: str(self.definition))
        stages.later("specialized", lambda: str(specialized))
        try:
            symbolic = self.symbolic_sizes
            if symbolic and all(1 <= sizes[n] <= SYMBOLIC_MAX for n in symbolic):
                run = self._build_symbolic(sizes, shapes, options, stages, symbolic)
            else:
                run = BUILDERS[self.target.name](self.definition, sizes, self.target, options, stages,
                                                 self.usage)
        except AccessRangeError as e:
            raise e.with_source(self.source) from None
        return SpecializedKernel(specialized, dict(sizes), self.target, stages, run, self.definition)

    def _build_symbolic(self, sizes: dict[str, int], shapes: tuple[tuple[int, ...], ...],
                        options: MappingOptions | None, stages: dict[str, str],
                        symbolic: frozenset[str]) -> Executable:
        """The kernel for the ``symbolic`` sizes, with the options of the first call (the
        heuristic's for its sizes, unless given or tuned), bound to ``sizes`` (at which
        its outputs have ``shapes``)."""
        from polyfuse.runtime import cpu
        from polyfuse.scheduler.heuristics import default_options
        from polyfuse.targets.cpu import machine
        with self._cache_lock:
            if self._symbolic_options is None:
                self._symbolic_options = replace(
                    options or default_options(self.definition, sizes, machine(self.target), symbolic),
                    fix_sizes=False)
            chosen = self._symbolic_options
        # the code for these sizes' signature: compiled (or read from disk) once per kernel
        signature = self._signatures(sizes)
        with self._cache_lock:
            exe = self._symbolic_runs.get(signature)
        if exe is None:
            exe = cpu.build(self.definition, sizes, self.target, chosen, stages, self.usage, symbolic)
            with self._cache_lock:
                self._symbolic_runs[signature] = exe
        else:
            cpu.staged(exe, stages, self.target)
        return SizesBound(exe, {n: sizes[n] for n in symbolic}, shapes)


class SizesBound:
    """A kernel compiled for symbolic sizes, called with the sizes of one call (the
    kernel's scalars of those names) and its outputs' shapes at them; its other
    attributes (``jit``, ``layout``, ``stages``) are the compiled kernel's."""

    def __init__(self, executable: Any, sizes: dict[str, int], shapes: tuple[tuple[int, ...], ...]) -> None:
        self.executable = executable
        self.sizes = sizes
        self.shapes = shapes

    def __call__(self, values: Mapping[str, object]) -> dict[str, np.ndarray]:
        return self.executable({**values, **self.sizes}, self.shapes)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["executable"], name)


class KernelModule:
    """The definitions of one TC source; each is an attribute (``mod.mm``) and an item."""

    def __init__(self, kernels: dict[str, Kernel]) -> None:
        self._kernels = kernels

    def __getattr__(self, name: str) -> Kernel:
        try:
            return self.__dict__["_kernels"][name]
        except KeyError:
            known = ", ".join(self.__dict__.get("_kernels", {}))
            raise AttributeError(f"no definition '{name}' in this module (defined: {known})") from None

    def __getitem__(self, name: str) -> Kernel:
        return getattr(self, name)

    def __iter__(self) -> Iterator[Kernel]:
        return iter(self._kernels.values())

    def __dir__(self) -> list[str]:
        return [*self._kernels, *super().__dir__()]

    def __repr__(self) -> str:
        return f"<polyfuse.KernelModule {', '.join(self._kernels)}>"
