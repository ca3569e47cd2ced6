"""What ptxas made of a cuda kernel, read without a GPU.

* :func:`resources`: each function's registers, shared memory, stack and spills, from the
  report ptxas writes when NVRTC compiles with ``--ptxas-options=-v`` (the ``ptxas``
  stage of a cuda kernel).
* :func:`disassemble`: the machine code (SASS) of a cubin, from NVIDIA's ``nvdisasm``
  (the ``nvidia-cuda-nvdisasm`` wheel, or one on ``PATH``).
* :func:`instruction_mix`: the instructions of each function, and those of its innermost
  loop (the shortest range a branch jumps back over that does more than branch), by opcode: what a kernel's inner
  loop does per iteration (``FFMA`` to ``LDS`` in a matmul, ``LDG.E.128`` for 128-bit
  global loads).

These are the static checks of GPU code that need no GPU: tests and
``benchmarks/gpu_static.py`` read them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from polyfuse.errors import TargetError


@dataclass(frozen=True, slots=True)
class Resources:
    """What one function uses per thread (registers, stack, spills) and per block
    (static shared memory, barriers)."""

    registers: int
    shared_bytes: int = 0
    barriers: int = 0
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, \d+ bytes cumulative stack size)?(?:, (\d+) bytes smem)?")


def resources(report: str) -> dict[str, Resources]:
    """Each entry function's resources, from ptxas's ``-v`` report."""
    found: dict[str, Resources] = {}
    name, frame = None, (0, 0, 0)
    for line in report.splitlines():
        if m := _ENTRY.search(line):
            name, frame = m.group(1), (0, 0, 0)
        elif (m := _FRAME.search(line)) and name is not None:
            frame = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _USED.search(line)) and name is not None:
            found[name] = Resources(int(m.group(1)), int(m.group(3) or 0), int(m.group(2) or 0), *frame)
    return found


def nvdisasm() -> str | None:
    """The path of ``nvdisasm``: from the ``nvidia-cuda-nvdisasm`` wheel, else ``PATH``."""
    try:
        import nvidia  # the namespace package of NVIDIA's CUDA wheels
    except ImportError:
        roots: list[str] = []
    else:
        roots = list(nvidia.__path__)
    for root in roots:
        for candidate in sorted(Path(root).glob("*/bin/nvdisasm")):
            if os.access(candidate, os.X_OK):
                return str(candidate)
    return shutil.which("nvdisasm")


def disassemble(cubin: bytes) -> str:
    """The SASS text of ``cubin`` (``nvdisasm -c``); a TargetError when nvdisasm is
    missing or refuses it."""
    tool = nvdisasm()
    if tool is None:
        raise TargetError("reading SASS needs nvdisasm: pip install nvidia-cuda-nvdisasm")
    with tempfile.TemporaryDirectory(prefix="polyfuse-sass-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        done = subprocess.run([tool, "-c", str(path)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise TargetError(f"nvdisasm failed ({done.returncode}): {done.stderr.strip()[:500]}")
    return done.stdout


@dataclass(frozen=True)
class Mix:
    """One function's instructions by opcode (``FFMA``, ``LDS.128``, ``LDG.E.128`` ...),
    all of them and those of its innermost loop (empty when it has no loop)."""

    function: str
    instructions: Counter[str]
    inner_loop: Counter[str]

    @staticmethod
    def count(ops: Counter[str], prefix: str) -> int:
        """How many of ``ops`` are ``prefix`` or ``prefix.<modifiers>``."""
        return sum(n for op, n in ops.items() if op == prefix or op.startswith(prefix + "."))


_FUNCTION = re.compile(r"^\s*\.text\.(\S+):\s*$")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):\s*$")
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
_BRANCH = re.compile(r"\bBRA\b[^;]*?(\.L_x_\d+)")


_PRODUCTS = {"FFMA", "DFMA", "HFMA2", "HMMA", "HGMMA"}


def instruction_mix(sass: str) -> dict[str, Mix]:
    """Each function's :class:`Mix` in the SASS text of :func:`disassemble`."""
    # per function, in order: its labels (at their positions among the instructions) and
    # its instructions' opcodes and branch targets
    labels: dict[str, dict[str, int]] = {}
    code: dict[str, list[tuple[str, str | None]]] = {}
    name = None
    for line in sass.splitlines():
        if m := _FUNCTION.match(line):
            name = m.group(1)
            labels.setdefault(name, {})
            code.setdefault(name, [])
        elif name is None:
            continue
        elif m := _LABEL.match(line):
            labels[name][m.group(1)] = len(code[name])
        elif m := _INSTRUCTION.search(line):
            branch = _BRANCH.search(line)
            code[name].append((m.group(2), branch.group(1) if branch else None))
    return {name: _mix(name, ops, labels[name]) for name, ops in code.items()}


def _mix(name: str, code: list[tuple[str, str | None]], labels: dict[str, int]) -> Mix:
    loops = [Counter(op for op, _ in code[labels[target]:k + 1]) for k, (_, target) in enumerate(code)
             if target is not None and labels.get(target, k + 1) <= k]   # branches back
    # the shortest loop that does products (else work: not the branch to itself that ends
    # every function), so a loop of copies beside the products is not taken for them
    working = [body for body in loops if sum(body.values()) > body["BRA"]]
    products = [body for body in working if any(op.split(".")[0] in _PRODUCTS for op in body)]
    inner = min(products or working, key=lambda body: sum(body.values())) if working else Counter()
    return Mix(name, Counter(op for op, _ in code), inner)
