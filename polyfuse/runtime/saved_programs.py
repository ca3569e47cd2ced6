"""Compiled models on the disk: a later process runs a model's plans without its front
end, planning, packing or compiling (what OpenVINO's model cache does for its blobs).

``polyfuse.compile`` of an ONNX model keys the model (:class:`ModelStore`) by the sha256
of its bytes (and of its external data files) and by every setting of the compile its
programs depend on: the target with the host CPU's features, the mapping options, the
precision, ``sizes``, the tuning records, polyfuse's version and a hash of its sources.
Each plan the planner makes that runs as one native program is saved under that key and
the plan's own (its input shapes, and the values of the inputs it is specialized to),
in the disk cache's directory (:func:`polyfuse.runtime.cache.cache_dir`); a plan made
from a plan template (:mod:`polyfuse.runtime.plan_template`) is not, so a model meeting
a new shape on every call saves a few plans, not one per shape:

* ``models/<model>.json``: the model's inputs and outputs (names, element types,
  shapes with their named dimensions) and the inputs whose values its plans take;
* ``models/<model>-<plan>.json``: the plan's program
  (:class:`~polyfuse.runtime.program.ProgramLayout`): its calls, each naming its
  kernel's entry in the kernel cache, their arguments, the code, the arena's size, the
  results, and the constants, each by the sha256 of its bytes;
* ``constants/<sha256>``: a constant's bytes (weights packed as the kernels read them),
  shared by every plan and model that holds the same bytes.

A later ``compile`` of the same model finds its record and returns at once: the front
end runs when something first needs the graph (a shape with no saved plan, ``dump``,
...). A call at saved shapes loads the program: kernels from the kernel cache, constants
from their files. Everything else is as in a model compiled from scratch: at a shape
with no saved plan, the plans loaded so far are planned again first, in the order they
were used, so the kernels later shapes share (:mod:`polyfuse.runtime.generalize`) and
the plan templates are those the first process made (their kernels come from the
kernel cache).

Records carry a digest line, as the kernel cache's entries do; a record that does not
match or parse, a constant file of the wrong size, a kernel entry gone: each is a miss
(the plan is made again), never trusted. Constant files are named by their contents
and written whole under a temporary name, then renamed. A plan is saved on a thread of
its own after its first call returns, at the lowest priority (on Linux), in pieces
between the model's calls (:class:`Calls`); the process waits for pending saves at exit
(:func:`flush` waits for them now).

**Knowing a file without reading it.** A model file's path and ``stat`` (size, times,
inode; those of its external data files too) map to its digest
(``models/stat-<path>.json``), as git's index does, so a warm ``compile`` reads no
weights. A changed file is hashed again; a file changed less than :data:`SETTLE`
seconds before it was hashed is not remembered (a change within the file system's
timestamp resolution could keep its times).
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from polyfuse.errors import RecordError
from polyfuse.ir.graph import TensorType, Value
from polyfuse.ir.serialize import decode, encode, schema
from polyfuse.ir.types import DType
from polyfuse.runtime import cache
from polyfuse.runtime.instructions import (Copy, Increment, Instruction, Jump, JumpIfAtLeast, JumpUnless, Run,
                                           Set)
from polyfuse.runtime.program import CONSTANT, Call, ProgramLayout, Tensor

FORMAT = 1
SETTLE = 2.0   # seconds a file's times must lie in the past for its digest to be remembered


@dataclass(frozen=True)
class SavedValue:
    """A model input or output: its element type and shape (a size as digits, a named
    dimension after ``$``)."""

    name: str
    dtype: str
    shape: tuple[str, ...]

    @staticmethod
    def of(v: Value) -> SavedValue:
        return SavedValue(v.name, v.type.dtype.value, tuple(str(d) if isinstance(d, int) else f"${d}"
                                                              for d in v.type.shape))

    def value(self) -> Value:
        dims = tuple(d[1:] if d.startswith("$") else int(d) for d in self.shape)
        return Value(self.name, TensorType(DType(self.dtype), dims))


@dataclass(frozen=True)
class SavedModel:
    inputs: tuple[SavedValue, ...]
    outputs: tuple[SavedValue, ...]
    value_inputs: tuple[str, ...]   # the inputs whose values plans are specialized to


@dataclass(frozen=True)
class SavedTensor:
    name: str
    shape: tuple[int, ...]
    dtype: str                      # numpy's dtype.str


@dataclass(frozen=True)
class SavedConstant:
    name: str
    shape: tuple[int, ...]
    dtype: str
    digest: str                     # its file under constants/


@dataclass(frozen=True)
class SavedCall:
    label: str
    kernel: str                     # its entry in the kernel cache
    args: tuple[tuple[int, str, int], ...]   # (base, index as text, offset)
    zero: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class SavedInstruction:
    op: str                                  # the class of polyfuse.runtime.instructions
    places: tuple[tuple[int, str, int], ...]  # its location fields, in order
    numbers: tuple[int, ...]                 # its other fields, in order


@dataclass(frozen=True)
class SavedProgram:
    inputs: tuple[SavedTensor, ...]
    outputs: tuple[SavedTensor, ...]
    slots: tuple[SavedTensor, ...]
    results: tuple[tuple[str, str, str], ...]
    calls: tuple[SavedCall, ...]
    constants: tuple[SavedConstant, ...]
    arena_bytes: int
    code: tuple[SavedInstruction, ...]


_INSTRUCTIONS = {cls.__name__: cls for cls in (Run, Copy, Set, Increment, Jump, JumpUnless, JumpIfAtLeast)}
_PLACES = frozenset({"dst", "src", "row", "counter", "cond", "limit"})   # fields that are locations


def _place(location: tuple[int, Any, int]) -> tuple[int, str, int]:
    base, index, offset = location
    return (base, str(index), offset)


def _location(place: tuple[int, str, int]) -> tuple[int, Any, int]:
    base, index, offset = place
    return (base, index if base == CONSTANT else int(index), offset)


def _saved_instruction(ins: Instruction) -> SavedInstruction:
    places, numbers = [], []
    for f in dataclasses.fields(ins):
        v = getattr(ins, f.name)
        if f.name in _PLACES:
            if v is not None:
                places.append(_place(v))
        else:
            numbers.append(int(v))
    return SavedInstruction(type(ins).__name__, tuple(places), tuple(numbers))


def _instruction(saved: SavedInstruction) -> Instruction:
    kind = _INSTRUCTIONS.get(saved.op)
    if kind is None:
        raise RecordError(f"no instruction {saved.op!r}")
    places, numbers = iter(saved.places), iter(saved.numbers)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(kind):
        if f.name in _PLACES:
            place = next(places, None)
            fields[f.name] = None if place is None else _location(place)
        else:
            fields[f.name] = next(numbers)
    return kind(**fields)   # type: ignore[no-any-return]


def _dtype(text: str) -> np.dtype:
    dtype = np.dtype(text)
    if dtype.str != text or dtype.hasobject:
        raise RecordError(f"dtype {text!r} cannot be saved")
    return dtype


# ---------------------------------------------------------------- constants

_DIGESTS: dict[int, str] = {}             # a constant's digest, by id while it lives
_LOADED: weakref.WeakValueDictionary[str, np.ndarray] = weakref.WeakValueDictionary()   # by digest
_LOCK = threading.Lock()


class Calls:
    """The model calls running in this process, which the saving thread waits out: it
    reads and writes constants in pieces of :data:`PIECE` bytes, each when no call has
    run for :data:`QUIET` seconds (streaming a model's weights through memory beside
    its kernels slowed BERT's calls 2.7x on two cores), or, after :data:`PATIENCE`
    seconds of waiting in one save, at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._last = 0.0

    def __enter__(self) -> None:
        with self._lock:
            self._running += 1

    def __exit__(self, *_: object) -> None:
        with self._lock:
            self._running -= 1
            self._last = time.monotonic()

    def quiet(self) -> bool:
        with self._lock:
            return self._running == 0 and time.monotonic() - self._last >= QUIET


CALLS = Calls()
PIECE = 4 << 20
QUIET = 0.002
PATIENCE = 10.0


class _Pace:
    """One save's waiting for quiet moments (see :class:`Calls`)."""

    def __init__(self) -> None:
        self.waited = 0.0

    def pieces(self, array: np.ndarray) -> Iterator[memoryview]:
        view = np.ascontiguousarray(array).data.cast("B")
        for start in range(0, max(len(view), 1), PIECE):
            while self.waited < PATIENCE and not CALLS.quiet():
                time.sleep(QUIET)
                self.waited += QUIET
            yield view[start:start + PIECE]


def _constant_digest(array: np.ndarray, pace: _Pace) -> str:
    """The sha256 of ``array``'s bytes, computed once while it lives."""
    key = id(array)
    with _LOCK:
        found = _DIGESTS.get(key)
    if found is None:
        h = hashlib.sha256()
        for piece in pace.pieces(array):
            h.update(piece)
        found = h.hexdigest()
        with _LOCK:
            _DIGESTS[key] = found
        weakref.finalize(array, _DIGESTS.pop, key, None)
    return found


def _save_constant(root: Path, name: str, array: np.ndarray, pace: _Pace) -> SavedConstant:
    digest = _constant_digest(array, pace)
    path = root / "constants" / digest
    if not (path.is_file() and path.stat().st_size == array.nbytes):
        path.parent.mkdir(exist_ok=True)   # (in the cache's folder: one removed meanwhile stays so)
        cache.atomic_write(path, pace.pieces(array))
    return SavedConstant(name, tuple(int(d) for d in array.shape), array.dtype.str, digest)


def _load_constant(root: Path, saved: SavedConstant) -> np.ndarray | None:
    """The constant's file mapped into memory (read-only; the pages of the file system's
    cache, shared by every process that maps it), or the array loaded already; None where
    its file is gone or of another size."""
    found = _LOADED.get(saved.digest)
    dtype = _dtype(saved.dtype)
    if found is not None and found.dtype == dtype and found.shape == saved.shape:
        return found
    nbytes = math.prod(saved.shape) * dtype.itemsize
    try:
        with open(root / "constants" / saved.digest, "rb") as f:
            if os.fstat(f.fileno()).st_size != nbytes:
                return None
            array = np.memmap(f, dtype, "r", shape=saved.shape) if nbytes else np.zeros(saved.shape, dtype)
    except (OSError, ValueError):
        return None
    _LOADED[saved.digest] = array
    return array


# ---------------------------------------------------------------- files known by stat

def _stat(path: Path) -> list[int]:
    s = path.stat()
    return [s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino, s.st_dev]


def _memo_path(root: Path, path: Path) -> Path:
    return root / "models" / f"stat-{hashlib.sha256(os.fsencode(path.resolve())).hexdigest()[:40]}.json"


def known_digest(path: Path) -> str | None:
    """The digest :func:`remember_digest` kept for the model file ``path`` (with its
    external data files), if none of them changed since."""
    root = cache.cache_dir()
    if root is None:
        return None
    try:
        text = cache.read_checked(_memo_path(root, path))
        if text is None:
            return None
        memo = json.loads(text)
        for name, stat in memo["files"]:
            if _stat(path.parent / name if name else path) != stat:
                return None
        return str(memo["digest"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remember_digest(path: Path, external: Iterable[str], digest: str) -> None:
    """Keep ``digest`` for ``path`` and its ``external`` data files (names relative to
    its folder) while their stat stays the same; skipped for files changed less than
    :data:`SETTLE` seconds ago, and where the cache cannot be written."""
    root = cache.cache_dir()
    if root is None:
        return
    try:
        files: list[tuple[str, list[int]]] = [("", _stat(path)), *((name, _stat(path.parent / name))
                                                                   for name in external)]
        if max(max(stat[1], stat[2]) for _, stat in files) > (time.time() - SETTLE) * 1e9:
            return
        memo = _memo_path(root, path)
        memo.parent.mkdir(parents=True, exist_ok=True)
        cache.write_checked(memo, json.dumps({"files": files, "digest": digest}).encode())
    except OSError:
        pass


def files_digest(hashed: Future[str], path: Path | None, external: Iterable[str]) -> str:
    """The digest a model's saved programs are keyed by: the sha256 of its ONNX bytes
    (``hashed``), and of its ``external`` data files (beside ``path``) where it has some;
    remembered for ``path`` (:func:`known_digest`)."""
    digest = hashed.result()
    external = list(external)
    if external:
        assert path is not None
        h = hashlib.sha256(digest.encode())
        for name in external:
            with open(path.parent / name, "rb") as f:
                h.update(b"\0" + name.encode() + b"\0" + hashlib.file_digest(f, "sha256").digest())
        digest = h.hexdigest()
    if path is not None:
        remember_digest(path, external, digest)
    return digest


# ---------------------------------------------------------------- a model's records

_SAVER: ThreadPoolExecutor | None = None
_PENDING: set[Future[None]] = set()


def flush() -> None:
    """Wait for the saves started so far."""
    with _LOCK:
        pending = list(_PENDING)
    wait(pending)


def _later(fn: Callable[[], None]) -> None:
    """``fn()`` on the saving thread (errors of a cache that cannot be written are
    dropped there: the cache is never an error)."""
    global _SAVER
    with _LOCK:
        if _SAVER is None:
            _SAVER = ThreadPoolExecutor(1, thread_name_prefix="polyfuse-save", initializer=_background)
            atexit.register(flush)
        done = _SAVER.submit(fn)
        _PENDING.add(done)
    done.add_done_callback(lambda f: _PENDING.discard(f))


def _background() -> None:
    """The saving thread yields to every other (its hashing and writing would slow the
    model's kernels running beside it on a machine of few cores)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)   # (Linux: this thread alone)
    except (AttributeError, OSError):
        pass


class ModelStore:
    """One model's records on the disk (see the module docstring): ``digest`` (or a
    future of it) names the model's bytes, ``settings`` the compile's."""

    def __init__(self, digest: str | Future[str], settings: Iterable[str]) -> None:
        self._digest = digest
        self._settings = tuple(settings)
        self._key: str | None = None

    @property
    def key(self) -> str:
        if self._key is None:
            digest = self._digest if isinstance(self._digest, str) else self._digest.result()
            self._key = cache.kernel_key(f"model format={FORMAT}", digest, *self._settings)
        return self._key

    def _path(self, root: Path | None, plan: str | None = None) -> Path | None:
        if root is None:
            return None
        return root / "models" / (f"{self.key}.json" if plan is None else f"{self.key}-{plan}.json")

    def model(self) -> SavedModel | None:
        """The model's record, or None where none was saved (or it does not read)."""
        return self._read(self._path(cache.cache_dir()), SavedModel)

    def load(self, plan: tuple, target: Any) -> ProgramLayout | None:
        """The program saved for ``plan`` (a model's plan key: shapes and values), its
        kernels loaded for ``target``; None where anything it needs is missing."""
        from polyfuse.runtime.cpu import saved_executable
        root = cache.cache_dir()
        saved = self._read(self._path(root, _plan_name(plan)), SavedProgram)
        if saved is None or root is None:
            return None
        try:
            constants: dict[str, np.ndarray] = {}
            for c in saved.constants:
                array = _load_constant(root, c)
                if array is None:
                    return None
                constants[c.name] = array
            executables = [saved_executable(c.kernel, target) for c in saved.calls]
            if any(e is None for e in executables):
                return None

            def tensor(t: SavedTensor) -> Tensor:
                return Tensor(t.name, t.shape, _dtype(t.dtype))
            calls = [Call(c.label, exe, exe.stages, tuple(_location(a) for a in c.args), c.zero)
                     for c, exe in zip(saved.calls, executables)]
            results = [(name, how, what if how == "constant" else int(what)) for name, how, what in saved.results]
            return ProgramLayout([tensor(t) for t in saved.inputs], [tensor(t) for t in saved.outputs],
                                 [(t.shape, _dtype(t.dtype)) for t in saved.slots], results, calls,
                                 constants,
                                 saved.arena_bytes, [_instruction(i) for i in saved.code])
        except (RecordError, ValueError, TypeError, StopIteration):
            return None

    def save(self, plan: tuple, layout: ProgramLayout, inputs: Iterable[Value], outputs: Iterable[Value],
             value_inputs: Iterable[str]) -> None:
        """Save ``layout``, the program of ``plan``, and the model's record, on the saving
        thread; nothing where the program cannot be saved (a call not of the kernel
        cache, a constant of objects)."""
        keys = [str(getattr(c.executable, "key", None) or "") for c in layout.calls]
        try:   # (every dtype one a saved record names exactly, objects excluded)
            for dtype in [t.dtype for t in (*layout.inputs, *layout.outputs)] + [d for _, d in layout.slots] + \
                    [a.dtype for a in layout.constants.values()]:
                _dtype(np.dtype(dtype).str)
        except RecordError:
            return
        if not all(keys):
            return
        record = SavedModel(tuple(map(SavedValue.of, inputs)), tuple(map(SavedValue.of, outputs)),
                            tuple(sorted(value_inputs)))
        calls = tuple(SavedCall(c.label, k, tuple(_place(a) for a in c.args), tuple(c.zero))
                      for c, k in zip(layout.calls, keys))
        code = tuple(_saved_instruction(i) for i in layout.code)
        constants = dict(layout.constants)
        root = cache.cache_dir()   # (the folder now, whatever the environment says when saving)
        model, program = self._path(root), self._path(root, _plan_name(plan))
        if root is None or model is None or program is None:
            return

        def save() -> None:
            pace = _Pace()
            try:
                saved = SavedProgram(
                    tuple(SavedTensor(t.name, t.shape, t.dtype.str) for t in layout.inputs),
                    tuple(SavedTensor(t.name, t.shape, t.dtype.str) for t in layout.outputs),
                    tuple(SavedTensor("", tuple(s), np.dtype(d).str) for s, d in layout.slots),
                    tuple((name, how, str(what)) for name, how, what in layout.results),
                    calls, tuple(_save_constant(root, n, a, pace) for n, a in constants.items()),
                    layout.arena_bytes, code)
                self._write(program, saved)
                self._write(model, record)
            except (OSError, RecordError, TypeError):
                pass
        _later(save)

    @staticmethod
    def _write(path: Path, record: Any) -> None:
        path.parent.mkdir(exist_ok=True)
        meta = {"format": FORMAT, "schema": schema(type(record)), "record": encode(record)}
        cache.write_checked(path, json.dumps(meta).encode())

    @staticmethod
    def _read(path: Path | None, kind: Any) -> Any:
        if path is None:
            return None
        text = cache.read_checked(path)
        if text is None:
            return None
        try:
            meta = json.loads(text)
            if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("schema") != schema(kind):
                return None
            return decode(kind, meta["record"])
        except (ValueError, KeyError):   # RecordError is a ValueError
            return None


def _plan_name(plan: tuple) -> str:
    """A plan key (``((name, shape), ...), ((name, bytes), ...)``) as a file name part."""
    return hashlib.sha256(repr(plan).encode()).hexdigest()[:32]
