"""The CUDA driver through ``cuda.bindings.driver``: device, context, stream, modules,
memory and launches, with every call's status checked.

A failing call raises :class:`~polyfuse.errors.DeviceError` naming the call and CUDA's
error; a machine without the driver or a device raises it on first use, so compiling
(which needs only NVRTC) works everywhere. polyfuse uses device 0 through its primary
context (the one the CUDA runtime, and so PyTorch and CuPy, use) and one stream created
blocking, so its work is ordered with the legacy default stream those libraries use.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from polyfuse.errors import DeviceError
from polyfuse.scheduler.gpu_mapping import DeviceLimits


@functools.cache
def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as err:
        raise DeviceError(f"running on the cuda target needs cuda-python: pip install "
                          f"'cuda-python==13.0.3' ({err})") from None
    return driver


def check(result: tuple, what: str) -> Any:
    """The value(s) of a driver call's result tuple; its status must be success."""
    driver = _driver()
    status, values = result[0], result[1:]
    if status != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(status)
        _, text = driver.cuGetErrorString(status)
        raise DeviceError(f"CUDA {what} failed: {_text(name)} ({_text(text)})")
    return values[0] if len(values) == 1 else values


def _text(b: bytes | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else str(b)


class Device:
    """Device 0 with its primary context and polyfuse's stream."""

    def __init__(self) -> None:
        driver = _driver()
        try:
            check(driver.cuInit(0), "initialization (cuInit)")
        except RuntimeError as err:  # cuda-python cannot load libcuda.so
            raise DeviceError(f"no CUDA driver on this machine ({err}); the cuda target still "
                              "compiles kernels (kernel.specialize(...)), running them needs an "
                              "NVIDIA GPU and its driver") from None
        if check(driver.cuDeviceGetCount(), "device count") < 1:
            raise DeviceError("the CUDA driver sees no GPU on this machine")
        self.device = check(driver.cuDeviceGet(0), "cuDeviceGet")
        self.context = check(driver.cuDevicePrimaryCtxRetain(self.device), "context creation")
        self.activate()
        self.stream = check(driver.cuStreamCreate(0), "stream creation")
        self.capturing = False     # work queued now goes into a graph (see begin_capture)
        name = check(driver.cuDeviceGetName(64, self.device), "device name")
        self.name = _text(name).split("\0")[0]
        a = driver.CUdevice_attribute
        major = self.attribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        minor = self.attribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        self.limits = DeviceLimits(
            arch=f"sm_{major}{minor}",
            max_threads=self.attribute(a.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
            max_block=(self.attribute(a.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X),
                       self.attribute(a.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y),
                       self.attribute(a.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)),
            max_grid=self.attribute(a.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X),
            shared_bytes=self.attribute(a.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK),
            shared_optin=self.attribute(a.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN))

    def attribute(self, which: Any) -> int:
        return int(check(_driver().cuDeviceGetAttribute(which, self.device), f"attribute {which.name}"))

    def activate(self) -> None:
        """Make the context current in this thread (each thread has its own current context)."""
        check(_driver().cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    # --- modules ---
    def load(self, cubin: bytes, names: list[str]) -> tuple[Any, dict[str, Any]]:
        """The module of a cubin and its functions by name."""
        driver = _driver()
        module = check(driver.cuModuleLoadData(cubin), "module load (cuModuleLoadData)")
        functions = {n: check(driver.cuModuleGetFunction(module, n.encode()), f"lookup of kernel {n}")
                     for n in names}
        return module, functions

    def allow_shared(self, function: Any, nbytes: int) -> None:
        """Let ``function`` launch with ``nbytes`` of dynamic shared memory (above 48 KiB
        a function must ask)."""
        driver = _driver()
        check(driver.cuFuncSetAttribute(function, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                        nbytes), f"raising a kernel's shared memory to {nbytes} bytes")

    # --- memory ---
    def allocate(self, nbytes: int) -> int:
        return int(check(_driver().cuMemAlloc(max(1, nbytes)), f"allocation of {nbytes} bytes"))

    def free(self, pointer: int) -> None:
        check(_driver().cuMemFree(_driver().CUdeviceptr(pointer)), "cuMemFree")

    def upload(self, pointer: int, host: np.ndarray) -> None:
        """Copy a C-contiguous host array to device memory."""
        check(_driver().cuMemcpyHtoDAsync(_driver().CUdeviceptr(pointer), host.ctypes.data,
                                          host.nbytes, self.stream),
              f"copy of {host.nbytes} bytes to the GPU")

    def download(self, host: np.ndarray, pointer: int) -> None:
        """Copy device memory into a C-contiguous host array (complete after synchronize)."""
        check(_driver().cuMemcpyDtoHAsync(host.ctypes.data, _driver().CUdeviceptr(pointer),
                                          host.nbytes, self.stream),
              f"copy of {host.nbytes} bytes from the GPU")

    def copy(self, destination: int, source: int, nbytes: int) -> None:
        """Copy device memory to device memory (in stream order)."""
        driver = _driver()
        check(driver.cuMemcpyDtoDAsync(driver.CUdeviceptr(destination), driver.CUdeviceptr(source),
                                       nbytes, self.stream), f"copy of {nbytes} bytes on the GPU")

    def zero(self, pointer: int, nbytes: int) -> None:
        check(_driver().cuMemsetD8Async(_driver().CUdeviceptr(pointer), 0, nbytes, self.stream),
              f"zeroing {nbytes} bytes")

    # --- execution ---
    def launch(self, function: Any, name: str, grid: int, block: tuple[int, int, int],
               params: list[Any], shared: int = 0) -> None:
        """Launch with ``params`` (ctypes values, in the kernel's order) and ``shared`` bytes
        of dynamic shared memory; a launch error, or an error of earlier work the stream
        reports, raises at once."""
        driver = _driver()
        pointers = (ctypes.c_void_p * max(1, len(params)))(*[ctypes.addressof(p) for p in params])
        check(driver.cuLaunchKernel(function, grid, 1, 1, *block, shared, self.stream,
                                    ctypes.addressof(pointers), 0), f"launch of kernel {name}")
        if self.capturing:   # a capturing stream may not be queried
            return
        (status,) = driver.cuStreamQuery(self.stream)
        if status not in (driver.CUresult.CUDA_SUCCESS, driver.CUresult.CUDA_ERROR_NOT_READY):
            check((status,), f"kernel {name}")

    def synchronize(self, what: str) -> None:
        check(_driver().cuStreamSynchronize(self.stream), what)

    # --- graphs ---
    def begin_capture(self) -> None:
        """Record the launches, zeroing and copies queued from now on into a graph instead
        of running them (until :meth:`end_capture`)."""
        driver = _driver()
        check(driver.cuStreamBeginCapture(self.stream, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
              "start of stream capture")
        self.capturing = True

    def end_capture(self) -> Any:
        """The work recorded since :meth:`begin_capture`, as a graph ready to launch (a
        :class:`Graph`)."""
        driver = _driver()
        self.capturing = False
        graph = check(driver.cuStreamEndCapture(self.stream), "end of stream capture")
        try:
            return Graph(check(driver.cuGraphInstantiate(graph, 0), "graph instantiation"))
        finally:
            driver.cuGraphDestroy(graph)

    def replay(self, graph: Any) -> None:
        """Queue a captured graph's work again, as one launch."""
        check(_driver().cuGraphLaunch(graph.handle, self.stream), "graph launch")

    def wait_for(self, stream: int) -> None:
        """Wait for work a foreign array's producer queued on ``stream`` (a handle)."""
        check(_driver().cuStreamSynchronize(_driver().CUstream(stream)), "synchronizing the "
              "stream of an input array")


class Graph:
    """An instantiated CUDA graph, destroyed with the object."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def __del__(self) -> None:
        try:
            _driver().cuGraphExecDestroy(self.handle)
        except Exception:  # the driver may be gone at interpreter exit
            pass


@functools.cache
def _probe() -> Device | DeviceError:
    """Device 0 set up, or why it cannot be: asked once per process."""
    try:
        return Device()
    except DeviceError as err:
        return err


def device() -> Device:
    """Device 0; raises DeviceError on a machine without a usable GPU."""
    found = _probe()
    if isinstance(found, DeviceError):
        raise DeviceError(str(found))
    return found


def available_device() -> Device | None:
    """Device 0 if this machine has a usable GPU, else None."""
    found = _probe()
    return None if isinstance(found, DeviceError) else found
