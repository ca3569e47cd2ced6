"""The generated CUDA C run on the CPU, for tests on machines without a GPU.

:class:`EmulatedDevice` stands in for :class:`polyfuse.targets.cuda_driver.Device`:
memory is host memory, copies are ``memmove``, and a launch runs the kernel's CUDA C
text itself, compiled by the host's C++ compiler with a small header that gives it
CUDA's built-ins: each block of the grid in turn, each thread of the block a
``std::thread``, ``__shared__`` arrays one per block, ``__syncthreads()`` a
``std::barrier`` of the block's threads, a warp shuffle an exchange between two of them. It checks what the interpreter of the GPU IR
cannot: the CUDA C text (types, indexing, helper functions), the launch shapes and the
runtime's argument passing, zeroing and copies, through the same ``CudaExecutable``
calls a GPU would see.
"""

from __future__ import annotations

import atexit
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
#define __align__(n) __attribute__((aligned(n)))
static inline void __syncthreads() { pf_block_barrier->arrive_and_wait(); }
// a warp shuffle: every thread of the block reaches it alike (the GPU IR's rule), so each
// leaves its value in the block's slot, all meet, each reads its partner's, all meet again
static unsigned long long pf_shuffle_slots[1024];
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int offset) {
  static_assert(sizeof(T) <= sizeof(unsigned long long));
  unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  std::memcpy(&pf_shuffle_slots[tid], &v, sizeof(T));
  pf_block_barrier->arrive_and_wait();
  T r; std::memcpy(&r, &pf_shuffle_slots[tid ^ offset], sizeof(T));
  pf_block_barrier->arrive_and_wait();
  return r;
}
// __shfl_sync from lane ``src`` of the thread's warp (32 threads of consecutive indices)
template <class T> static inline T __shfl_sync(unsigned, T v, int src) {
  static_assert(sizeof(T) <= sizeof(unsigned long long));
  unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  std::memcpy(&pf_shuffle_slots[tid], &v, sizeof(T));
  pf_block_barrier->arrive_and_wait();
  T r; std::memcpy(&r, &pf_shuffle_slots[(tid & ~31u) + (src & 31)], sizeof(T));
  pf_block_barrier->arrive_and_wait();
  return r;
}
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
static inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
static inline long long __double_as_longlong(double d) { long long i; std::memcpy(&i, &d, 8); return i; }
static inline float pf_emulated_h2f(unsigned short h) { _Float16 x; std::memcpy(&x, &h, 2); return (float)x; }
static inline unsigned short pf_emulated_f2h(float f) { _Float16 x = (_Float16)f; unsigned short h; std::memcpy(&h, &x, 2); return h; }
""" + r"""
// CUDA's math functions that the host's libm lacks, computed in double
static double pf_erfcinv(double c) {  // Newton's method on log erfc, monotone from the right
  if (!(c >= 0 && c <= 2)) return NAN;
  if (c == 0) return INFINITY;
  if (c == 2) return -INFINITY;
  double l = c > 1 ? 2 - c : c, y = std::sqrt(std::fmax(-std::log(l * (2 - l)), 0.0)), t = std::log(l);
  for (int i = 0; i < 60; ++i) {
    double e = std::erfc(y);
    if (e <= 0) break;
    y -= (std::log(e) - t) / (-M_2_SQRTPI * std::exp(-y * y) / e);
  }
  return c > 1 ? -y : y;
}
static double pf_erfinv(double x) {
  double a = std::fabs(x), y = a / M_2_SQRTPI;
  if (a > 0.5) return std::copysign(pf_erfcinv(1 - a), x);
  for (int i = 0; i < 8; ++i) y -= (std::erf(y) - a) / (M_2_SQRTPI * std::exp(-y * y));
  return std::copysign(y, x);
}
static double pf_erfcx(double x) {
  if (x < 26) return std::exp(x * x) * std::erfc(x);
  double v = 1 / (2 * x * x);
  return (1 - v * (1 - 3 * v * (1 - 5 * v * (1 - 7 * v)))) / (x * std::sqrt(M_PI));
}
static double pf_sinpi(double x, bool cosine) {
  double r = std::fmod(cosine ? std::fabs(x) : x, 2.0), n = std::rint(2 * r), s = r - n / 2;
  double sn = std::sin(M_PI * s), cs = std::cos(M_PI * s);
  int q = ((int)n % 4 + 4) % 4;
  double v = cosine ? (q == 0 ? cs : q == 1 ? -sn : q == 2 ? -cs : sn)
                    : (q == 0 ? sn : q == 1 ? cs : q == 2 ? -sn : -cs);
  return v == 0 ? (cosine ? 0.0 : std::copysign(0.0, x)) : v;
}
static double pf_bessel_i(int n, double x) {
  if (x != x) return x;
  double a = std::fabs(x), v = a > 200 ? INFINITY : std::cyl_bessel_i((double)n, a);
  return n == 1 ? std::copysign(v, x) : v;
}
static double pf_norm(double a, double b, double c = 0, double d = 0) {
  if (std::isinf(a) || std::isinf(b) || std::isinf(c) || std::isinf(d)) return INFINITY;
  return std::sqrt(a * a + b * b + c * c + d * d);
}
#define PF_BOTH(name, params, value) \
  static inline double pf_emulated_##name params { return value; } \
  static inline float pf_emulated_##name##f params { return (float)(value); }
PF_BOTH(erfinv, (double x), pf_erfinv(x))
PF_BOTH(erfcinv, (double x), pf_erfcinv(x))
PF_BOTH(erfcx, (double x), pf_erfcx(x))
PF_BOTH(normcdf, (double x), 0.5 * std::erfc(-x / M_SQRT2))
PF_BOTH(normcdfinv, (double p), -M_SQRT2 * pf_erfcinv(2 * p))
PF_BOTH(sinpi, (double x), pf_sinpi(x, false))
PF_BOTH(cospi, (double x), pf_sinpi(x, true))
PF_BOTH(cyl_bessel_i0, (double x), pf_bessel_i(0, x))
PF_BOTH(cyl_bessel_i1, (double x), pf_bessel_i(1, x))
PF_BOTH(rcbrt, (double x), 1 / std::cbrt(x))
PF_BOTH(rhypot, (double x, double y), 1 / pf_norm(x, y))
PF_BOTH(norm3d, (double x, double y, double z), pf_norm(x, y, z))
PF_BOTH(rnorm3d, (double x, double y, double z), 1 / pf_norm(x, y, z))
PF_BOTH(norm4d, (double x, double y, double z, double w), pf_norm(x, y, z, w))
PF_BOTH(rnorm4d, (double x, double y, double z, double w), 1 / pf_norm(x, y, z, w))
static inline float pf_emulated_fdividef(float x, float y) { return x / y; }
"""
# CUDA's names for them, as macros so that no libm declaration can clash
PRELUDE += "".join(f"#define {name}{f} pf_emulated_{name}{f}\n" for name in (
    "erfinv erfcinv erfcx normcdf normcdfinv sinpi cospi cyl_bessel_i0 cyl_bessel_i1 rcbrt rhypot "
    "norm3d rnorm3d norm4d rnorm4d").split() for f in ("", "f")) + "#define fdividef pf_emulated_fdividef\n"

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


def _libraries() -> Path:
    """The folder this process builds emulated kernels in (one per process, so a kernel
    built for one test serves the next), removed when the process exits."""
    global _LIBRARIES
    if _LIBRARIES is None:
        _LIBRARIES = Path(tempfile.mkdtemp(prefix="polyfuse-cuda-emulation-"))
        atexit.register(shutil.rmtree, _LIBRARIES, ignore_errors=True)
    return _LIBRARIES


_LIBRARIES: Path | None = None


class EmulatedDevice:
    """Device 0 as the CUDA runtime sees it, emulated on the CPU (see the module doc)."""

    name = "CPU emulation"
    limits = DeviceLimits()

    def __init__(self, sources: dict[bytes, str]) -> None:
        self.sources = sources              # cubin -> its CUDA C
        self.memory: dict[int, np.ndarray] = {}
        self.libraries: list[ctypes.CDLL] = []
        self.launches: list[tuple[str, int, tuple[int, int, int]]] = []
        self._dir = _libraries()

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

    # where allocations start past a 256-byte boundary (cuMemAlloc's: 0); a test may shift
    # them to see the code that does not assume aligned buffers
    misalign = 0

    def allocate(self, nbytes: int) -> int:
        buffer = np.full(max(1, nbytes) + 512, 0xA5, np.uint8)    # not zero: unwritten bytes show
        pointer = buffer.ctypes.data + (-buffer.ctypes.data) % 256 + self.misalign
        self.memory[pointer] = buffer
        return pointer

    def free(self, pointer: int) -> None:
        del self.memory[pointer]

    def upload(self, pointer: int, host: np.ndarray) -> None:
        ctypes.memmove(pointer, host.ctypes.data, host.nbytes)

    def download(self, host: np.ndarray, pointer: int) -> None:
        ctypes.memmove(host.ctypes.data, pointer, host.nbytes)

    def copy(self, destination: int, source: int, nbytes: int) -> None:
        if not self._recorded(lambda: self.copy(destination, source, nbytes)):
            ctypes.memmove(destination, source, nbytes)

    def zero(self, pointer: int, nbytes: int) -> None:
        if not self._recorded(lambda: self.zero(pointer, nbytes)):
            ctypes.memset(pointer, 0, nbytes)

    # graphs: work queued while capturing is recorded, not run; a replay runs it again
    capturing = False
    captures = 0

    def begin_capture(self) -> None:
        self.capturing, self.recorded = True, []

    def end_capture(self) -> list:
        self.capturing = False
        self.captures += 1
        return self.recorded

    def replay(self, graph: list) -> None:
        for work in graph:
            work()

    def _recorded(self, work) -> bool:  # noqa: ANN001
        if self.capturing:
            self.recorded.append(work)
        return self.capturing

    allowed: dict = {}   # function -> dynamic shared bytes it may use

    def allow_shared(self, function, nbytes: int) -> None:  # noqa: ANN001
        assert nbytes <= self.limits.most_shared
        self.allowed = {**self.allowed, id(function): nbytes}

    def launch(self, function, name: str, grid: int, block: tuple[int, int, int], params: list,  # noqa: ANN001
               shared: int = 0) -> None:
        if self._recorded(lambda: self.launch(function, name, grid, block, [type(p)(p.value) for p in params],
                                              shared)):
            return
        assert shared <= self.allowed.get(id(function), self.limits.shared_bytes), "dynamic shared memory not raised"
        limits = self.limits
        assert 1 <= grid <= limits.max_grid and 1 <= block[0] * block[1] * block[2] <= limits.max_threads
        self.launches.append((name, grid, block))
        pointers = (ctypes.c_void_p * max(1, len(params)))(*[ctypes.addressof(p) for p in params])
        function(pointers, ctypes.c_uint(grid), *(ctypes.c_uint(b) for b in block))

    def synchronize(self, what: str) -> None:
        pass

    def wait_for(self, stream: int) -> None:
        pass
