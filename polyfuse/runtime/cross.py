"""Running code built for a CPU this process cannot run (aarch64 on an x86 machine).

A program (one kernel, or every kernel of a model's plan; see
:mod:`polyfuse.runtime.program`) becomes an object file through
:func:`polyfuse.runtime.link.link_program`, is linked with a small C runner
(``native/runner.c``) by the target's C compiler (``aarch64-linux-gnu-gcc``), and runs
under ``qemu-aarch64 -cpu CPU`` with the CPU the code was generated for, tensors
passed through files. Compiling needs none of this: without the tools, running
raises a :class:`~polyfuse.errors.TargetError` that names what to install.
Executables are cached on disk beside the kernels (or in a temporary directory when
the disk cache is off).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import shutil
import struct
import subprocess
import tempfile
import weakref
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from polyfuse.errors import BoundsError, TargetError
from polyfuse.ir.types import DType
from polyfuse.runtime import cache
from polyfuse.runtime.arguments import abi_scalar
from polyfuse.runtime.program import Layout, ProgramLayout, Tensor
from polyfuse.targets import Target
from polyfuse.targets.target import host_name

RUNNER = Path(__file__).parent / "native" / "runner.c"
IO_MAGIC = 0x31304F4946594C50  # "PLYFIO01", as runner.c expects
IO_SEEDED = 0x32304F4946594C50  # "PLYFIO02": the outputs' initial contents follow the inputs
ENTRY = "polyfuse_entry"

# CPUs qemu-user emulates by name; others run as "max" (every feature qemu has)
QEMU_CPUS = frozenset({"a64fx", "cortex-a35", "cortex-a53", "cortex-a57", "cortex-a72",
                       "cortex-a76", "neoverse-n1", "neoverse-v1", "neoverse-n2"})
RUN_TIMEOUT_S = 600


@functools.cache
def _tool(name: str) -> str | None:
    return shutil.which(name)


def c_compiler(target: Target) -> list[str]:
    """The command of a C compiler making code for ``target``; a ``TargetError`` says
    what to install when there is none."""
    host = os.uname().machine
    native = _runs_here(target)
    arch = target.backend.triple.split("-")[0]
    cross = f"{arch}-linux-gnu-gcc"
    names = ["cc", "gcc"] if native else []
    names += [cross] if arch != host else []
    for name in names:
        path = _tool(name)
        if path:
            return [path]
    raise TargetError(f"building {target} programs on this {host} machine needs a C compiler "
                      + ("(cc or gcc) on PATH" if native else
                         f"({cross}; on Debian/Ubuntu: apt-get install -y gcc-{arch.replace('_', '-')}-linux-gnu)"))


def _runs_here(target: Target) -> bool:
    """Whether this machine's CPU is of ``target``'s architecture."""
    try:
        return host_name() == target.name
    except TargetError:   # a CPU polyfuse has no target for
        return False


def runner_prefix(target: Target) -> list[str]:
    """The command prefix that runs ``target``'s programs here: empty when they run
    natively, else qemu-user for the CPU the code was made for."""
    if _runs_here(target):
        return []
    host = os.uname().machine
    qemu = _tool(f"qemu-{target.name}")
    if qemu is None:
        raise TargetError(f"running {target} code on this {host} machine needs qemu-user "
                          "(on Debian/Ubuntu: apt-get install -y qemu-user "
                          "gcc-aarch64-linux-gnu); compiling works without it "
                          "(kernel.specialize(...), bundles)")
    return [qemu, "-cpu", _qemu_cpu(target), "-L", f"/usr/{target.name}-linux-gnu"]


def _qemu_cpu(target: Target) -> str:
    """The CPU qemu emulates for ``target``: the one named, where qemu knows it and the
    spec adds no features beyond those that chose it (``aarch64+sve``: an A64FX); else
    "max" (``aarch64+i8mm`` is a Neoverse N1 with I8MM, which no CPU qemu names has)."""
    backend = target.backend
    chosen = {f for f, cpu in backend.feature_cpus if cpu == target.cpu}
    added = set(target.features) - set(backend.features) - chosen
    return target.cpu if target.cpu in QEMU_CPUS and not added else "max"


class CrossProgram:
    """A program for ``target`` run through the runner: compiled when made, linked on
    the first run, then each run is one process."""

    def __init__(self, layout: ProgramLayout, target: Target) -> None:
        from polyfuse.runtime.link import link_program
        from polyfuse.targets.cpu import target_machine
        self.layout = layout
        self.target = target
        self.labels = [c.label for c in layout.calls]
        self.weights, offsets = layout.weights()
        module = link_program(layout, target, ENTRY, offsets)
        self.object = target_machine(target).emit_object(module)
        self._dir = Path(tempfile.mkdtemp(prefix="polyfuse-cross-"))
        weakref.finalize(self, shutil.rmtree, self._dir, True)
        self._executable: Path | None = None

    def executable(self) -> Path:
        """The linked runner (made once, cached on disk by its object's digest)."""
        if self._executable is None:
            runner_prefix(self.target)   # its error names both packages
            cc = c_compiler(self.target)
            digest = hashlib.sha256(self.object + RUNNER.read_bytes() + " ".join(cc).encode())
            folder = cache.cache_dir()
            folder = folder / "bin" if folder is not None else self._dir
            path = folder / f"{self.target.name}-{digest.hexdigest()[:32]}"

            def link(partial: Path) -> None:
                obj = self._dir / "program.o"
                obj.write_bytes(self.object)
                compile_c(cc, [str(RUNNER), str(obj)], partial, self.target)
            path = cache.checked_file(path, link, self._dir)   # rebuilt when missing or damaged
            (self._dir / "weights.bin").write_bytes(self.weights)
            self._executable = path
        return self._executable

    def run(self, env: Mapping[str, np.ndarray], times: np.ndarray | None = None) -> dict[str, np.ndarray]:
        if times is not None:
            raise TargetError(f"per-kernel times need code that runs in this process; code for "
                              f"{self.target} runs under qemu here, whose times say nothing of "
                              "an ARM CPU")
        arrays = [np.ascontiguousarray(env[t.name]) for t in self.layout.inputs]
        outputs = self.call(arrays)
        return dict(zip((t.name for t in self.layout.outputs), outputs))

    def call(self, arrays: list[np.ndarray],
             initial: list[np.ndarray] | None = None) -> list[np.ndarray]:
        """Run once on ``arrays`` (one per input, in order); the outputs in order.
        ``initial``: every output's starting contents (outputs given with ``out=``)."""
        exe = self.executable()
        prefix = runner_prefix(self.target)
        layout = self.layout
        io = self._dir / f"io-{os.getpid()}-{id(arrays)}.bin"
        head = [IO_MAGIC if initial is None else IO_SEEDED, len(arrays), len(layout.outputs),
                layout.arena_bytes]
        head += [a.nbytes for a in arrays] + [t.nbytes for t in layout.outputs]
        with open(io, "wb") as f:
            f.write(struct.pack(f"<{len(head)}Q", *head))
            for a in [*arrays, *(initial or [])]:
                f.write(a.tobytes())
        try:
            try:
                done = subprocess.run([*prefix, str(exe), str(self._dir / "weights.bin"), str(io)],
                                      capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise TargetError(f"the {self.target} program ({', '.join(self.labels)}) ran "
                                  f"longer than {RUN_TIMEOUT_S} s and was stopped") from None
            if done.returncode != 0:
                how = f"signal {-done.returncode}" if done.returncode < 0 else f"status {done.returncode}"
                raise TargetError(f"the {self.target} program ({', '.join(self.labels)}) stopped "
                                  f"with {how}: {done.stderr.strip()[-2000:]}")
            data = Path(f"{io}.out").read_bytes()
        finally:
            io.unlink(missing_ok=True)
            Path(f"{io}.out").unlink(missing_ok=True)
        status = struct.unpack_from("<q", data)[0]
        if status:
            raise BoundsError.in_kernel(self.labels[status - 1])
        results, offset = [], 8
        for t in layout.outputs:
            results.append(np.frombuffer(data, t.dtype, int(np.prod(t.shape, dtype=np.int64)),
                                         offset).reshape(t.shape).copy())
            offset += t.nbytes
        return results


def compile_c(cc: list[str], sources: list[str], output: Path, target: Target,
              flags: tuple[str, ...] = ()) -> None:
    """Compile and link C sources and objects with the target's compiler."""
    done = subprocess.run([*cc, "-O2", "-std=c11", *flags, *sources, "-o", str(output), "-lm"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise TargetError(f"{Path(cc[0]).name} could not build the {target} program: "
                          f"{done.stderr.strip()[-2000:]}")


class CrossExecutable:
    """One kernel compiled for a CPU this process cannot run: callable like the CPU
    runtime's executables (``values -> outputs``), each call one run under qemu."""

    def __init__(self, layout: Layout, stages: dict[str, str], obj: bytes, target: Target) -> None:
        self.layout = layout
        self.stages = stages
        self.object = obj     # the kernel alone, as a relocatable object
        self.target = target
        self._program: CrossProgram | None = None   # made at the first call
        self._seeded: CrossProgram | None = None    # zeroes nothing: for calls with out=

    def __call__(self, values: Mapping[str, object]) -> dict[str, np.ndarray]:
        """The outputs; outputs named in ``values`` (``out=``) are sent in with their
        contents and updated in place."""
        arrays = self.layout.arguments(values)
        scalars = [_scalar_slot(values[n]) for n in self.layout.scalars]
        names = [n for n, _, _, _ in self.layout.outputs]
        given = self.layout.given_outputs(values)
        if not given:
            if self._program is None:   # the kernel is specialized: every call has these shapes
                self._program = self._make(arrays, zero=True)
            outputs = self._program.call(arrays + scalars)
            return dict(zip(names, outputs))
        if self._seeded is None:
            self._seeded = self._make(arrays, zero=False)
        initial = [np.ascontiguousarray(given[n]) if n in given else np.zeros(shape, DType(dt).numpy)
                   for n, shape, dt, _ in self.layout.outputs]
        outputs = self._seeded.call(arrays + scalars, initial)
        for n, a in given.items():
            np.copyto(a, outputs[names.index(n)])
        return {n: given.get(n, a) for n, a in zip(names, outputs)}

    def _make(self, arrays: list[np.ndarray], zero: bool) -> CrossProgram:
        inputs = [Tensor(n, a.shape, a.dtype) for n, a in zip(self.layout.inputs, arrays)]
        layout = ProgramLayout.of_kernel(self, self.stages, inputs, list(self.layout.scalars))
        if not zero:   # the caller's outputs keep what the kernel does not write
            layout.calls = [dataclasses.replace(c, zero=()) for c in layout.calls]
        return CrossProgram(layout, self.target)


def _scalar_slot(value: object) -> np.ndarray:
    """A scalar as the kernel ABI's 8-byte slot: int64 for ints and bools, else double."""
    v = abi_scalar(value)
    return np.array(v, np.int64 if isinstance(v, (bool, int)) else np.float64)
