"""The generated CUDA C run on the CPU, for tests on machines without a GPU.

:class:`EmulatedDevice` stands in for :class:`polyfuse.targets.cuda_driver.Device`:
memory is host memory, copies are ``memmove``, and a launch runs the kernel's CUDA C
text itself, compiled by the host's C++ compiler with a small header that gives it
CUDA's built-ins: each block of the grid in turn, each thread of the block a
``std::thread``, ``__shared__`` arrays one per block, ``__syncthreads()`` a
``std::barrier`` of the block's threads. It checks what the interpreter of the GPU IR
cannot: the CUDA C text (types, indexing, helper functions), the launch shapes and the
runtime's argument passing, zeroing and copies, through the same ``CudaExecutable``
calls a GPU would see.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from polyfuse.scheduler.gpu_mapping import DeviceLimits

CXX = shutil.which("g++") or shutil.which("c++")

PRELUDE = r"""
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>
#include <math.h>
struct pf_dim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local pf_dim3 threadIdx, blockIdx;
static pf_dim3 blockDim, gridDim;
static thread_local std::barrier<>* pf_block_barrier;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static
static inline void __syncthreads() { pf_block_barrier->arrive_and_wait(); }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
static inline float pf_emulated_h2f(unsigned short h) { _Float16 x; std::memcpy(&x, &h, 2); return (float)x; }
static inline unsigned short pf_emulated_f2h(float f) { _Float16 x = (_Float16)f; unsigned short h; std::memcpy(&h, &x, 2); return h; }
"""

# a launch: every block in turn, the block's threads at once
LAUNCHER = r"""
extern "C" void pf_launch_{name}(void** a, unsigned grid, unsigned bx, unsigned by, unsigned bz) {{
{unpack}
  gridDim = {{grid, 1, 1}};
  blockDim = {{bx, by, bz}};
  for (unsigned b = 0; b < grid; ++b) {{
    std::barrier<> barrier(bx * by * bz);
    std::vector<std::thread> threads;
    for (unsigned z = 0; z < bz; ++z) for (unsigned y = 0; y < by; ++y) for (unsigned x = 0; x < bx; ++x)
      threads.emplace_back([&, x, y, z] {{
        threadIdx = {{x, y, z}};
        blockIdx = {{b, 0, 0}};
        pf_block_barrier = &barrier;
        {name}({args});
      }});
    for (auto& t : threads) t.join();
  }}
}}
"""

_SIGNATURE = re.compile(r'extern "C" __global__ void __launch_bounds__\(\d+\) (\w+)\(([^)]*)\)')
# the inline PTX of the half-precision conversions, replaced by the host's _Float16
_HALF_HELPERS = re.compile(r"__device__ __forceinline__ (float pf_h2f|unsigned short pf_f2h)\(([\w ]+)\) \{\n[^\n]*\n")


def emulated_source(cuda: str) -> str:
    """The kernels of ``cuda`` with a launcher ``pf_launch_NAME`` for each."""
    body = _HALF_HELPERS.sub(
        lambda m: f"{m.group(1)}({m.group(2)}) {{ return pf_emulated_{m.group(1).split('pf_')[1]}"
                  f"({m.group(2).split()[-1]}); }}\n", cuda)
    launchers = []
    for name, params in _SIGNATURE.findall(cuda):
        unpack, args = [], []
        for k, param in enumerate(p.strip() for p in params.split(",") if p.strip()):
            ctype = param.rsplit(" ", 1)[0].replace("__restrict__", "").strip()
            unpack.append(f"  using T{k} = {ctype};")
            args.append(f"*reinterpret_cast<T{k}*>(a[{k}])")
        launchers.append(LAUNCHER.format(name=name, unpack="\n".join(unpack), args=", ".join(args)))
    return PRELUDE + body + "".join(launchers)


class EmulatedDevice:
    """Device 0 as the CUDA runtime sees it, emulated on the CPU (see the module doc)."""

    name = "CPU emulation"
    limits = DeviceLimits()

    def __init__(self, sources: dict[bytes, str]) -> None:
        self.sources = sources              # cubin -> its CUDA C
        self.memory: dict[int, np.ndarray] = {}
        self.libraries: list[ctypes.CDLL] = []
        self.launches: list[tuple[str, int, tuple[int, int, int]]] = []
        self._dir = Path(tempfile.mkdtemp(prefix="polyfuse-cuda-emulation-"))

    def activate(self) -> None:
        pass

    def load(self, cubin: bytes, names: list[str]) -> tuple[object, dict[str, object]]:
        source = emulated_source(self.sources[cubin])
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        cpp, lib = self._dir / f"{digest}.cpp", self._dir / f"{digest}.so"
        if not lib.exists():
            cpp.write_text(source)
            done = subprocess.run([CXX, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread",
                                   "-fno-fast-math", "-ffp-contract=off", str(cpp), "-o", str(lib)],
                                  capture_output=True, text=True)
            assert done.returncode == 0, done.stderr[-3000:]
        library = ctypes.CDLL(str(lib))
        self.libraries.append(library)
        return library, {n: getattr(library, f"pf_launch_{n}") for n in names}

    def allocate(self, nbytes: int) -> int:
        buffer = np.full(max(1, nbytes), 0xA5, np.uint8)    # not zero: unwritten bytes show
        self.memory[buffer.ctypes.data] = buffer
        return buffer.ctypes.data

    def free(self, pointer: int) -> None:
        del self.memory[pointer]

    def upload(self, pointer: int, host: np.ndarray) -> None:
        ctypes.memmove(pointer, host.ctypes.data, host.nbytes)

    def download(self, host: np.ndarray, pointer: int) -> None:
        ctypes.memmove(host.ctypes.data, pointer, host.nbytes)

    def copy(self, destination: int, source: int, nbytes: int) -> None:
        ctypes.memmove(destination, source, nbytes)

    def zero(self, pointer: int, nbytes: int) -> None:
        ctypes.memset(pointer, 0, nbytes)

    def launch(self, function, name: str, grid: int, block: tuple[int, int, int], params: list) -> None:  # noqa: ANN001
        limits = self.limits
        assert 1 <= grid <= limits.max_grid and 1 <= block[0] * block[1] * block[2] <= limits.max_threads
        self.launches.append((name, grid, block))
        pointers = (ctypes.c_void_p * max(1, len(params)))(*[ctypes.addressof(p) for p in params])
        function(pointers, ctypes.c_uint(grid), *(ctypes.c_uint(b) for b in block))

    def synchronize(self, what: str) -> None:
        pass

    def wait_for(self, stream: int) -> None:
        pass
