"""Running definitions on NVIDIA GPUs: GPU schedule, NVRTC, launches through the driver.

Building needs no GPU: the kernel is scheduled for the device's limits (an sm_90's
without a device), compiled to PTX and a cubin, and cached in this process and on
disk like CPU kernels. Calling it needs one (else :class:`~polyfuse.errors.DeviceError`):

* numpy inputs are copied to the GPU and the outputs come back as numpy arrays;
* inputs already in GPU memory (PyTorch or CuPy arrays, anything with
  ``__cuda_array_interface__`` or CUDA DLPack) are used in place, and the outputs are
  new arrays of the same library on the GPU;
* outputs given with ``out=`` start from their contents (numpy arrays are copied up
  and the results copied back into them; arrays in GPU memory are updated in place).

The launches run in order on polyfuse's stream; each call waits for them, so a
failing kernel is reported by the call that ran it.
"""

from __future__ import annotations

import ctypes
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from polyfuse.errors import ArgumentError, BoundsError, DeviceError, DTypeError, ShapeError
from polyfuse.ir.comprehension import Definition
from polyfuse.ir.gpu import GpuKernel
from polyfuse.ir.loops import ERROR_BUFFER, BufferRole
from polyfuse.ir.types import DType
from polyfuse.runtime import cache
from polyfuse.runtime.device_arrays import DeviceArray, as_device_array
from polyfuse.runtime.program import ARENA, CONSTANT, ERROR, INPUT, OUTPUT, ProgramLayout
from polyfuse.scheduler.gpu_heuristics import default_gpu_options
from polyfuse.scheduler.gpu_mapping import DeviceLimits
from polyfuse.scheduler.model import zero_filled_outputs
from polyfuse.scheduler.options import MappingOptions
from polyfuse.scheduler.pipeline import schedule_gpu_definition
from polyfuse.targets import Target
from polyfuse.targets.cuda import CudaBinary, LaunchInfo, compile_gpu_kernel
from polyfuse.targets.cuda_codegen import dynamic_shared
from polyfuse.targets.cuda_sass import disassemble
from polyfuse.targets.cuda_driver import Device, available_device, device

_COMPILED: cache.Resident[CudaExecutable] = cache.Resident()
STATS = {"compiled": 0, "disk": 0, "memory": 0}  # where build() found its kernels


@dataclass(frozen=True)
class CudaLayout:
    """How to call a compiled kernel: inputs and outputs (name, shape, dtype; outputs
    also whether they start zeroed), scratch buffers it fills and reads itself (split-k's
    partial sums: name, shape, dtype; passed after the outputs), scalars (name, dtype),
    launches in order."""

    name: str
    inputs: tuple[tuple[str, tuple[int, ...], str], ...]
    outputs: tuple[tuple[str, tuple[int, ...], str, bool], ...]
    scalars: tuple[tuple[str, str], ...]
    checks_indices: bool
    launches: tuple[LaunchInfo, ...]
    scratch: tuple[tuple[str, tuple[int, ...], str], ...] = ()

    @property
    def scratch_bytes(self) -> tuple[int, ...]:
        """Each scratch buffer's bytes, in order."""
        return tuple(math.prod(shape) * np.dtype(DType(dt).numpy).itemsize for _, shape, dt in self.scratch)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(name for name, _, _ in self.inputs)

    @staticmethod
    def of(kernel: GpuKernel, zeroed: set[str]) -> CudaLayout:
        return CudaLayout(
            kernel.name,
            tuple((b.name, b.shape, b.dtype.value) for b in kernel.buffers if b.role is BufferRole.IN),
            tuple((b.name, b.shape, b.dtype.value, b.name in zeroed)
                  for b in kernel.buffers if b.role is BufferRole.OUT),
            tuple((s.name, s.dtype.value) for s in kernel.scalars),
            any(b.name == ERROR_BUFFER for b in kernel.buffers),
            tuple(LaunchInfo(x.name, x.grid, x.block, dynamic_shared(x)) for x in kernel.launches),
            tuple((b.name, b.shape, b.dtype.value) for b in kernel.buffers if b.role is BufferRole.TEMP))


def build(d: Definition, sizes: Mapping[str, int], target: Target,
          options: MappingOptions | None, stages: dict[str, str], precision: str = "ieee") -> CudaExecutable:
    """The executable for ``d`` at ``sizes``: from this process, the disk, or compiled
    (``precision``: ``"tf32"`` lets float32 contractions run on the tensor cores)."""
    sizes = dict(sizes)
    gpu = available_device()
    limits = gpu.limits if gpu is not None else DeviceLimits()
    if target.cpu and target.cpu != limits.arch:   # another GPU's code: it runs there only
        limits = DeviceLimits(arch=target.cpu)
    with cache.SCHEDULING:
        options = options or default_gpu_options(d, sizes)
    key = cache.kernel_key(str(d), repr(sorted(sizes.items())), target.name, repr(limits),
                           repr(options), precision)

    def from_disk(cubin: bytes, layout: CudaLayout, stages: dict[str, str]) -> CudaExecutable:
        return CudaExecutable(CudaBinary(layout.name, limits.arch, cubin, layout.launches, stages), layout)

    exe = cache.fetch(key, _COMPILED, STATS, CudaLayout, from_disk,
                      lambda: _compile(d, sizes, options, limits, key, precision))
    stages.update(exe.binary.stages)
    if "sass" not in stages and hasattr(stages, "later"):   # nvdisasm's text, when first read
        stages.later("sass", lambda: disassemble(exe.binary.cubin))
    return exe


def _compile(d: Definition, sizes: dict[str, int], options: MappingOptions,
             limits: DeviceLimits, key: str, precision: str) -> CudaExecutable:
    stages = {"options": repr(options)}
    initialized: set[str] = set()
    with cache.SCHEDULING:
        kernel = schedule_gpu_definition(d, sizes, options, limits, stages, initialized, precision)
    with cache.CODEGEN:
        binary = compile_gpu_kernel(kernel, limits.arch)
    binary.stages.update(stages)
    layout = CudaLayout.of(kernel, zero_filled_outputs(d, sizes) - initialized)
    cache.store(key, binary.cubin, layout, binary.stages)
    return CudaExecutable(binary, layout)


class CudaExecutable:
    """A compiled kernel; calling it runs every launch on device 0."""

    def __init__(self, binary: CudaBinary, layout: CudaLayout) -> None:
        self.binary = binary
        self.layout = layout
        self._functions: dict[str, Any] | None = None
        self._module: Any = None  # keeps the functions loaded

    def functions(self, gpu: Device) -> dict[str, Any]:
        if self._functions is None:
            if self.binary.arch != gpu.limits.arch:
                raise DeviceError(f"kernel {self.layout.name} was compiled for {self.binary.arch} (target "
                                  f"'cuda:{self.binary.arch}') but this GPU is {gpu.limits.arch}: compile "
                                  f"for target='cuda' (this GPU) or 'cuda:{gpu.limits.arch}'")
            self._module, functions = gpu.load(self.binary.cubin, [x.name for x in self.layout.launches])
            for launch in self.layout.launches:
                if launch.shared:
                    gpu.allow_shared(functions[launch.name], launch.shared)
            self._functions = functions
        return self._functions

    def launch(self, gpu: Device, params: list[Any]) -> None:
        """Queue every launch of the kernel with ``params`` (ctypes values, in order)."""
        functions = self.functions(gpu)
        for launch in self.layout.launches:
            gpu.launch(functions[launch.name], launch.name, launch.grid, launch.block, params, launch.shared)

    def __call__(self, values: Mapping[str, object]) -> dict[str, Any]:
        gpu = device()
        gpu.activate()
        call = _Call(gpu, self.layout.name)
        try:
            inputs = [call.input(n, values[n], shape, DType(dt)) for n, shape, dt in self.layout.inputs]
            like = next((a for a in inputs if a.library != "polyfuse"), None)
            outputs = {n: call.output(shape, DType(dt), zero, like) if n not in values
                       else call.given(n, values[n]) for n, shape, dt, zero in self.layout.outputs}
            scratch = [call.memory(n) for n in self.layout.scratch_bytes]   # (the kernel fills them)
            params: list[Any] = [ctypes.c_uint64(a.pointer) for a in [*inputs, *outputs.values(), *scratch]]
            error = call.scratch(8) if self.layout.checks_indices else None
            params += [ctypes.c_uint64(error.pointer)] if error is not None else []
            params += [_scalar(values[n], DType(dt)) for n, dt in self.layout.scalars]
            self.launch(gpu, params)
            gpu.synchronize(f"running kernel {self.layout.name}")
            if error is not None and call.download(error, np.dtype(np.int64))[0]:
                raise BoundsError.in_kernel(self.layout.name)
            given = {n: call.download_into(values[n], o) for n, o in outputs.items() if n in values}
            if like is None:
                return {n: given[n] if n in given else call.download(o, o.dtype)
                        for n, o in outputs.items()}
            return {n: given[n] if n in given else o.owner if o.library == like.library else o
                    for n, o in outputs.items()}
        finally:
            call.release()


def zero_array(array: DeviceArray) -> None:
    """Zero an array in GPU memory on polyfuse's stream (after its producer's work)."""
    gpu = device()
    gpu.activate()
    if array.stream is not None:
        gpu.wait_for(array.stream)
    gpu.zero(array.pointer, array.nbytes)


class CudaProgram:
    """Every kernel of a compiled model's plan on the GPU, with nothing between them
    coming back to the host: intermediates in one device arena (the plan's memory
    plan), the weights uploaded once, one error slot per kernel that reads through an
    index tensor. A run uploads the inputs, launches every kernel in order on
    polyfuse's stream, waits once, and downloads the outputs. Runs on host arrays launch
    the kernels as one CUDA graph, captured at the first (inputs, outputs, arena and error
    slots then live in memory the program keeps) and replayed; runs on arrays in GPU
    memory launch them one by one, on the caller's arrays."""

    def __init__(self, layout: ProgramLayout) -> None:
        self.layout = layout
        self.labels = [call.label for call in layout.calls]
        self._blob, self._offsets = layout.weights()
        self._weights: _Memory | None = None
        checked = [k for k, call in enumerate(layout.calls) if any(a[0] == ERROR for a in call.args)]
        self._error_slot = {k: j for j, k in enumerate(checked)}
        self._replay: _Replay | None = None   # the memory and graph of runs on host arrays
        self._lock = threading.Lock()        # one such run at a time (they share that memory)

    def run(self, env: Mapping[str, np.ndarray], times: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The outputs for the inputs in ``env``; ``times`` (one per kernel) gets each
        kernel's seconds, measured by waiting for the GPU after each one. With host
        arrays in and out (and no times asked) the kernels run as one CUDA graph,
        captured at the first such run into memory the program keeps, and replayed."""
        gpu = device()
        gpu.activate()
        layout = self.layout
        weights = self._weights_on(gpu)
        if times is None and all(isinstance(env[t.name], (np.ndarray, np.generic)) for t in layout.inputs):
            return self._replayed(gpu, env)
        call = _Call(gpu, "model")
        try:
            inputs = [call.input(t.name, env[t.name], t.shape, _dtype(t.dtype))
                      for t in layout.inputs]
            like = next((a for a in inputs if a.library != "polyfuse"), None)
            slots = [call.output(shape, _dtype(dtype), False, like) for shape, dtype in layout.slots]
            memory = _Places(weights, self._offsets, [a.pointer for a in inputs], [a.pointer for a in slots],
                             call.memory(layout.arena_bytes).pointer,
                             call.memory(8 * max(1, len(self._error_slot))).pointer, self._error_slot)
            self._enqueue(gpu, memory, times)
            gpu.synchronize("running the model's kernels")
            self._check_errors(gpu, memory.errors)
            if like is None:
                host_inputs = [np.asarray(env[t.name]) for t in layout.inputs]
                return layout.collect(host_inputs, [call.download(a, a.dtype) for a in slots])
            return self._on_device(call, like, inputs, slots, weights)
        finally:
            call.release()

    def _weights_on(self, gpu: Device) -> int:
        if self._weights is None:
            self._weights = _Memory(gpu, len(self._blob))
            gpu.upload(self._weights.pointer, np.frombuffer(self._blob, np.uint8))
        return self._weights.pointer

    def _enqueue(self, gpu: Device, memory: _Places, times: np.ndarray | None = None) -> None:
        """Queue the error slots' zeroing and every kernel, with their outputs' zeroing."""
        gpu.zero(memory.errors, 8 * max(1, len(self._error_slot)))
        for k, step in enumerate(self.layout.calls):
            start = time.perf_counter()
            pointers = [memory.place(k, *arg) for arg in step.args]
            for position, nbytes in step.zero:
                gpu.zero(pointers[position], nbytes)
            step.executable.launch(gpu, [ctypes.c_uint64(p) for p in pointers])
            if times is not None:
                gpu.synchronize(f"running kernel {step.label}")
                times[k] = time.perf_counter() - start

    def _check_errors(self, gpu: Device, errors: int) -> None:
        failed = np.empty(max(1, len(self._error_slot)), np.int64)
        gpu.download(failed, errors)
        gpu.synchronize("copying the model's error slots")
        for k, j in self._error_slot.items():
            if failed[j]:
                raise BoundsError.in_kernel(self.labels[k])

    def _replayed(self, gpu: Device, env: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A run on host arrays: the inputs uploaded into the program's own memory, the
        kernels replayed as the graph captured at the first run (or queued one by one
        where the driver cannot capture), the outputs downloaded."""
        layout = self.layout
        with self._lock:
            if self._replay is None:
                for step in layout.calls:   # modules load before the capture (which records stream work only)
                    step.executable.functions(gpu)
                self._replay = _Replay.allocate(gpu, layout, self._weights_on(gpu), self._offsets, self._error_slot)
            replay = self._replay
            hosts = [np.asarray(env[t.name], order="C") for t in layout.inputs]
            for host, pointer in zip(hosts, replay.memory.inputs):
                gpu.upload(pointer, host)
            replay.run(gpu, lambda: self._enqueue(gpu, replay.memory))
            gpu.synchronize("running the model's kernels")
            self._check_errors(gpu, replay.memory.errors)
            outputs = []
            for (shape, dtype), pointer in zip(layout.slots, replay.memory.slots):
                host = np.empty(shape, np.dtype(dtype))
                gpu.download(host, pointer)
                outputs.append(host)
            gpu.synchronize("copying the model's outputs")
            return layout.collect(hosts, outputs)

    def _on_device(self, call: _Call, like: DeviceArray, inputs: list[DeviceArray],
                   slots: list[DeviceArray], weights: int) -> dict[str, Any]:
        """The outputs as arrays of the inputs' library on the GPU; outputs that are
        another output, an input or a constant are copied on the device."""
        out: dict[str, Any] = {}
        for t, (name, how, what) in zip(self.layout.outputs, self.layout.results):
            if how == "slot":
                array = slots[what]
            else:
                array = call.output(t.shape, _dtype(t.dtype), False, like)
                source = (slots[what].pointer if how == "copy-slot" else inputs[what].pointer
                          if how == "copy-input" else weights + self._offsets[what])
                call.gpu.copy(array.pointer, source, t.nbytes)
            if array.library == like.library:
                out[name] = array.owner if tuple(array.shape) == t.shape else array.owner.reshape(t.shape)
            else:
                out[name] = DeviceArray(array.pointer, t.shape, array.dtype, array.owner, array.library)
        call.gpu.synchronize("copying the model's outputs")
        return out


@dataclass
class _Places:
    """Where a program's kernels find their arguments: the weights, the inputs and the
    output slots, the arena of intermediates and the error slots (device pointers)."""

    weights: int
    offsets: list[int]
    inputs: list[int]
    slots: list[int]
    arena: int
    errors: int
    error_slot: dict[int, int]

    def place(self, k: int, base: int, index: Any, offset: int) -> int:
        """The pointer argument ``(base, index, offset)`` of call ``k``."""
        if base == ARENA:
            return self.arena + offset
        if base == INPUT:
            return self.inputs[index] + offset
        if base == OUTPUT:
            return self.slots[index] + offset
        if base == CONSTANT:
            return self.weights + self.offsets[index] + offset
        return self.errors + 8 * self.error_slot[k]


@dataclass
class _Replay:
    """The memory a program keeps for its runs on host arrays, and the CUDA graph of its
    kernels on it (None until captured; ``captures`` False where the driver refused)."""

    memory: _Places
    owned: list[_Memory]
    graph: Any = None
    captures: bool = True

    @staticmethod
    def allocate(gpu: Device, layout: ProgramLayout, weights: int, offsets: list[int],
                 error_slot: dict[int, int]) -> _Replay:
        owned: list[_Memory] = []

        def memory(nbytes: int) -> int:
            owned.append(_Memory(gpu, nbytes))
            return owned[-1].pointer
        inputs = [memory(t.nbytes) for t in layout.inputs]
        slots = [memory(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
                 for shape, dtype in layout.slots]
        places = _Places(weights, offsets, inputs, slots, memory(layout.arena_bytes),
                         memory(8 * max(1, len(error_slot))), error_slot)
        return _Replay(places, owned)

    def run(self, gpu: Device, enqueue: Callable[[], None]) -> None:
        """Queue the kernels: the graph, captured from ``enqueue`` the first time."""
        if self.graph is None and self.captures:
            try:
                gpu.begin_capture()
                enqueue()
                self.graph = gpu.end_capture()
            except DeviceError:   # a driver that cannot capture this stream: launches instead
                if gpu.capturing:
                    try:
                        gpu.end_capture()
                    except DeviceError:
                        pass
                self.captures = False
        if self.graph is not None:
            gpu.replay(self.graph)
        else:
            enqueue()


class _Memory:
    """Device memory polyfuse allocated; freed when no array refers to it any more."""

    def __init__(self, gpu: Device, nbytes: int) -> None:
        self.gpu = gpu
        self.pointer = gpu.allocate(nbytes)

    def __del__(self) -> None:
        try:
            self.gpu.free(self.pointer)
        except Exception:  # the driver may be gone at interpreter exit
            pass


class _Call:
    """The arrays of one call: checked inputs, new outputs, temporaries to free."""

    def __init__(self, gpu: Device, kernel: str) -> None:
        self.gpu = gpu
        self.kernel = kernel
        self.temporaries: list[_Memory] = []

    def memory(self, nbytes: int) -> _Memory:
        m = _Memory(self.gpu, nbytes)
        self.temporaries.append(m)
        return m

    def input(self, name: str, value: object, shape: tuple[int, ...], dt: DType) -> DeviceArray:
        if isinstance(value, (np.ndarray, np.generic)):
            host = np.asarray(value, order="C")   # keeps 0-d arrays 0-d
            array = DeviceArray(0, host.shape, host.dtype, None, "polyfuse")
        else:
            found = as_device_array(value)
            if found is None:
                raise ArgumentError(f"{self.kernel}: argument '{name}' must be a numpy array or an "
                                    f"array in GPU memory, got {type(value).__name__}")
            array, host = found, None
        if array.shape != shape:
            raise ShapeError(f"{self.kernel}: argument '{name}' must have shape {shape} (the shape "
                             f"this kernel was specialized to), got {array.shape}")
        if array.dtype != dt.numpy:
            raise DTypeError(f"{self.kernel}: argument '{name}' must be {dt}, got {array.dtype}")
        if host is None:
            if array.device != 0:
                raise ArgumentError(f"{self.kernel}: argument '{name}' is on CUDA device "
                                    f"{array.device}; polyfuse runs kernels on device 0")
            if array.stream is not None:
                self.gpu.wait_for(array.stream)
            return array
        memory = self.memory(host.nbytes)
        self.gpu.upload(memory.pointer, host)
        return DeviceArray(memory.pointer, shape, host.dtype, memory, "polyfuse")

    def output(self, shape: tuple[int, ...], dt: DType, zero: bool,
               like: DeviceArray | None) -> DeviceArray:
        """A new output: of ``like``'s library when it can allocate the dtype, else polyfuse's
        memory (temporary when the results go back to the host)."""
        allocate = _ALLOCATORS.get(like.library) if like is not None else None
        owner = allocate(like.owner, shape, dt.numpy) if allocate is not None else None
        array = as_device_array(owner) if owner is not None else None
        if array is None:
            nbytes = int(np.prod(shape, dtype=np.int64)) * dt.numpy.itemsize
            memory = self.memory(nbytes) if like is None else _Memory(self.gpu, nbytes)
            array = DeviceArray(memory.pointer, shape, dt.numpy, memory, "polyfuse")
        if zero:
            self.gpu.zero(array.pointer, array.nbytes)
        return array

    def given(self, name: str, value: object) -> DeviceArray:
        """An output the caller gave (checked): its GPU memory, or a copy of its host contents."""
        array: Any = value   # checked: a numpy array or DeviceArray of the output's dtype
        return self.input(name, array, tuple(array.shape), _dtype(array.dtype))

    def download_into(self, value: object, array: DeviceArray) -> object:
        """The given output ``value`` holding the results in ``array``: copied back into a
        host array, the caller's object for one in GPU memory."""
        if isinstance(value, DeviceArray):
            return value.owner if value.owner is not None else value
        host = cast(np.ndarray, value)   # checked: a host array of the output's shape and dtype
        self.gpu.download(host, array.pointer)
        self.gpu.synchronize(f"copying the results of kernel {self.kernel}")
        return host

    def scratch(self, nbytes: int) -> DeviceArray:
        memory = self.memory(nbytes)
        self.gpu.zero(memory.pointer, nbytes)
        return DeviceArray(memory.pointer, (nbytes // 8,), np.dtype(np.int64), memory, "polyfuse")

    def download(self, array: DeviceArray, dtype: np.dtype) -> np.ndarray:
        host = np.empty(array.shape, dtype)
        self.gpu.download(host, array.pointer)
        self.gpu.synchronize(f"copying the results of kernel {self.kernel}")
        return host

    def release(self) -> None:
        self.temporaries.clear()


def _dtype(dtype: np.dtype) -> DType:
    """The DType of a layout's or a checked argument's numpy dtype, which polyfuse has."""
    dt = DType.from_numpy(dtype)
    if dt is None:
        raise DTypeError(f"polyfuse has no type for numpy's {np.dtype(dtype)}")
    return dt


def _torch_empty(like: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    torch = sys.modules["torch"]
    tdtype = torch.bfloat16 if dtype.name == "bfloat16" else torch.from_numpy(np.empty(0, dtype)).dtype
    return torch.empty(shape, dtype=tdtype, device=like.device)


def _cupy_empty(like: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    if dtype.name == "bfloat16":
        return None  # CuPy has no bfloat16: the output stays a polyfuse DeviceArray
    return sys.modules["cupy"].empty(shape, dtype)


# library of the inputs -> allocator of outputs like them (None: cannot hold the dtype)
_ALLOCATORS = {"torch": _torch_empty, "cupy": _cupy_empty}


def _scalar(value: object, dt: DType) -> Any:
    """A scalar argument as the C type of its kernel parameter."""
    v = np.asarray(value).item()
    if dt.is_bool:
        return ctypes.c_int(int(bool(v)))
    if dt.is_int:
        return ctypes.c_longlong(int(v))
    return ctypes.c_double(float(v)) if dt is DType.FLOAT64 else ctypes.c_float(float(v))
