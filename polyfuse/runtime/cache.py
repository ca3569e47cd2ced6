"""The on-disk cache of compiled kernels, so a second process does not recompile.

A kernel is keyed by everything its code depends on: the canonical text of the
definition, the sizes, the target (with the host CPU and its features), the mapping
options, the polyfuse version and a hash of polyfuse's sources. An entry is two files
under the cache directory: ``<key>.o`` (the object code) and ``<key>.json`` (a line with
the SHA-256 of both files' contents, then the buffer layout and stage texts as JSON,
with the entry format and the layout record's schema: see :mod:`polyfuse.ir.serialize`,
which saves every field of the layout's dataclass and checks each when loading).
Both are written to a temporary name and renamed, so concurrent processes never see
half a file. An entry whose digest does not match (a truncated, emptied or overwritten
file, or the two files of different writers), or that does not parse, is ignored and
rebuilt: object code is checked before it is ever handed to the linker. So is an entry
of another format or schema, or whose record lacks a field or holds a value of the
wrong kind.

Other files of the cache (programs linked for an emulator, under ``bin/``) keep a
SHA-256 of their contents beside them (:func:`checked_file`) and are rebuilt when it
does not match. Compiled models' programs and constants (under ``models/`` and
``constants/``) are :mod:`polyfuse.runtime.saved_programs`'.

In one process, each kernel is fetched and compiled once: a thread asking for a kernel
another thread is making waits for it; a kernel already in memory is returned without
waiting. A kernel stays in memory (:class:`Resident`) while anything uses it (a model's
plan, a defined kernel) and, unused, while it is among the :data:`RECENT` kernels
fetched last; then its code is unloaded, and a later request loads it from the disk.
Different kernels compile side by side in two stages: scheduling, under
:data:`SCHEDULING` (isl), and code generation, under :data:`CODEGEN` (LLVM and the JIT),
so one kernel's machine code is made while the next is scheduled (isl's and LLVM's
state is shared by every kernel and is not safe to use from two threads at once).

The directory is ``$POLYFUSE_CACHE_DIR`` if set (empty or ``0`` turns the disk cache
off), else ``$XDG_CACHE_HOME/polyfuse`` or ``~/.cache/polyfuse``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Generic, TypeVar

from polyfuse.ir.serialize import decode, encode, schema

T = TypeVar("T")
L = TypeVar("L")

FORMAT = 5   # 5: cuda kernels keep ptxas's resource report among their stages
SCHEDULING = threading.RLock()   # isl, and the scheduling around it: one kernel at a time
CODEGEN = threading.RLock()      # LLVM, NVRTC and the JIT: one kernel at a time
_MAKING = threading.Lock()       # guards _KEYS
_KEYS: dict[str, threading.Lock] = {}   # a lock per kernel being fetched
RECENT = 256                     # kernels kept in memory unused (see Resident)


class Resident(Generic[T]):
    """The kernels in this process's memory, by key: each while something else holds
    it, and the :data:`RECENT` fetched last whether or not anything does (so a kernel
    asked for again soon after its last user went is not loaded again)."""

    def __init__(self) -> None:
        self._live: weakref.WeakValueDictionary[str, T] = weakref.WeakValueDictionary()
        self._recent: OrderedDict[str, T] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> T | None:
        found = self._live.get(key)
        if found is not None:
            self._keep(key, found)
        return found

    def __setitem__(self, key: str, kernel: T) -> None:
        self._live[key] = kernel
        self._keep(key, kernel)

    def _keep(self, key: str, kernel: T) -> None:
        with self._lock:
            self._recent[key] = kernel
            self._recent.move_to_end(key)
            while len(self._recent) > RECENT:
                self._recent.popitem(last=False)

    def values(self) -> list[T]:
        return list(self._live.values())

    def clear(self) -> None:
        """Forget every kernel (as a new process would have none)."""
        with self._lock:
            self._recent.clear()
            self._live.clear()


def cache_dir() -> Path | None:
    env = os.environ.get("POLYFUSE_CACHE_DIR")
    if env is not None:
        return None if env in ("", "0") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "polyfuse"


@functools.cache
def code_fingerprint() -> str:
    """A hash of polyfuse's own sources: a changed compiler never reuses old kernels."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


# the files the cache writes: kernel entries (and their temporary names while written)
# and, under bin/, programs linked for an emulator with their digests
_ENTRY = re.compile(r"[0-9a-f]{40}\.(o|json)(\..+)?")
_PROGRAM = re.compile(r"[A-Za-z0-9_.+:-]+-[0-9a-f]{32}(\.sha256)?(\..+\.tmp)?")
# compiled models (polyfuse.runtime.saved_programs): under models/, their records; under
# constants/, the constants' bytes named by their sha256
_MODEL = re.compile(r"(stat-)?[0-9a-f]{40}(-[0-9a-f]{32})?\.json(\..+)?")
_CONSTANT = re.compile(r"[0-9a-f]{64}(\..+)?")


def cache_files() -> list[Path]:
    """The files of the disk cache (kernel entries, linked programs): only those the
    cache writes, whatever else the directory holds; none where the cache is off."""
    root = cache_dir()
    if root is None or not root.is_dir():
        return []
    files = [p for p in root.iterdir() if _ENTRY.fullmatch(p.name) and p.is_file()]
    for folder, pattern in (("bin", _PROGRAM), ("models", _MODEL), ("constants", _CONSTANT)):
        if (root / folder).is_dir():
            files += [p for p in (root / folder).iterdir() if pattern.fullmatch(p.name) and p.is_file()]
    return sorted(files)


def clear() -> int:
    """Remove every file of the disk cache (:func:`cache_files`); how many were removed.
    Processes running now keep the kernels they loaded; later ones compile again."""
    removed = 0
    for path in cache_files():
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass   # another process removed it
    return removed


def kernel_key(*parts: str) -> str:
    from polyfuse.version import __version__
    h = hashlib.sha256()
    for p in (f"format={FORMAT}", f"polyfuse={__version__}", code_fingerprint(), *parts):
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def load(key: str, kind: type[L]) -> tuple[bytes, L, dict[str, str]] | None:
    """The object code, layout (a record of type ``kind``) and stage texts stored under
    ``key``, or None when there is no entry, it is damaged (its digest does not match), or
    its record is not one this polyfuse reads (another format or schema, fields missing
    or of the wrong kind): such an entry is rebuilt, never trusted."""
    root = cache_dir()
    if root is None:
        return None
    try:
        digest, _, text = (root / f"{key}.json").read_bytes().partition(b"\n")
        obj = (root / f"{key}.o").read_bytes()
    except OSError:
        return None
    if digest != _digest(obj, text):
        return None
    try:
        meta = json.loads(text)
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("schema") != schema(kind):
            return None
        return obj, decode(kind, meta["layout"]), decode(dict[str, str], meta["stages"])
    except (ValueError, KeyError):   # RecordError is a ValueError
        return None


def store(key: str, obj: bytes, layout: Any, stages: dict[str, str]) -> None:
    """Save an entry: the object code, and its layout (a dataclass record) and stage
    texts with the format and the layout's schema. A cache that cannot be written is
    skipped, never an error."""
    root = cache_dir()
    if root is None:
        return
    meta = {"format": FORMAT, "schema": schema(type(layout)), "layout": encode(layout),
            "stages": encode(stages)}
    text = json.dumps(meta).encode()
    try:
        root.mkdir(parents=True, exist_ok=True)
        atomic_write(root / f"{key}.o", obj)
        atomic_write(root / f"{key}.json", _digest(obj, text) + b"\n" + text)
    except OSError:
        pass


def write_checked(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (whole, under a temporary name first) after a line with
    its digest, which :func:`read_checked` checks."""
    atomic_write(path, _digest(b"", data) + b"\n" + data)


def read_checked(path: Path) -> bytes | None:
    """What :func:`write_checked` wrote to ``path``; None where the file is missing or its
    contents do not match their digest."""
    try:
        digest, _, data = path.read_bytes().partition(b"\n")
    except OSError:
        return None
    return data if digest == _digest(b"", data) else None


def _digest(obj: bytes, text: bytes) -> bytes:
    h = hashlib.sha256()
    for part in (obj, text):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest().encode()


def checked_file(path: Path, make: Callable[[Path], None], spare: Path) -> Path:
    """``path``, a file of the cache that is not a kernel entry (a linked program):
    made by ``make(partial)`` when it is missing, or when its contents no longer match
    the digest kept beside it (``<path>.sha256``). Where the cache cannot be written,
    the file is made in the folder ``spare`` instead (and that path returned)."""
    digest = path.with_name(path.name + ".sha256")
    try:
        if digest.read_bytes() == hashlib.sha256(path.read_bytes()).hexdigest().encode():
            return path
    except OSError:
        pass
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        writable = os.access(path.parent, os.W_OK)
    except OSError:
        writable = False
    if not writable:
        path, digest = spare / path.name, spare / digest.name
    partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    make(partial)
    data = partial.read_bytes()
    os.replace(partial, path)
    try:
        atomic_write(digest, hashlib.sha256(data).hexdigest().encode())
    except OSError:
        pass   # rebuilt next time
    return path


def atomic_write(path: Path, data: bytes | memoryview | Iterable[bytes | memoryview]) -> None:
    """``data`` (or its pieces, in order) written to ``path`` under a temporary name, then
    renamed: a reader sees the whole file or none."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    try:
        with os.fdopen(fd, "wb") as f:
            for piece in (data,) if isinstance(data, (bytes, memoryview)) else data:
                f.write(piece)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fetch(key: str, memory: Resident[T] | dict[str, T], stats: dict[str, int], kind: type[L],
          from_disk: Callable[[bytes, L, dict[str, str]], T], compile: Callable[[], T] | None) -> T | None:
    """The kernel under ``key``: from ``memory`` (this process), else from the disk
    (``from_disk(object, layout, stages)``, the layout a record of type ``kind``), else
    ``compile()`` (which stores it; without ``compile``, None); ``stats`` counts where
    kernels came from (``memory``, ``disk``, ``compiled``)."""
    found = memory.get(key)
    if found is None:
        with _MAKING:
            making = _KEYS.setdefault(key, threading.Lock())
        try:
            with making:
                found = memory.get(key)   # another thread may have made it while this one waited
                if found is None:
                    hit = load(key, kind)
                    if hit is None and compile is None:
                        return None
                    found = memory[key] = from_disk(*hit) if hit is not None else compile()  # type: ignore[misc]
                    _count(stats, "disk" if hit is not None else "compiled")
                    return found
        finally:
            with _MAKING:
                _KEYS.pop(key, None)   # later askers find the kernel in memory
    _count(stats, "memory")
    return found


def _count(stats: dict[str, int], where: str) -> None:
    with _MAKING:
        stats[where] += 1
