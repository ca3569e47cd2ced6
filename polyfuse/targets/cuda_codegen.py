"""GPU kernel -> CUDA C source: one ``extern "C" __global__`` function per launch.

Every launch takes every buffer (inputs as ``const T* __restrict__``, so loads go
through the read-only cache) and then the scalars. Block loops become a grid-stride
loop over the product of their trip counts; thread loops start at the thread's index
and stride by the block's size; a shared tile is a static ``__shared__`` array filled
by all threads of the block, with zeros outside the buffer.
"""

from __future__ import annotations

from polyfuse.errors import CodegenError
from dataclasses import replace

from polyfuse.ir.comprehension import Literal, Read
from polyfuse.ir.gpu import (AXES, Barrier, BlockLoops, CopyToShared, GpuKernel, Launch,
                             SharedTile, SingleThread, ThreadFor, walk_gpu)
from polyfuse.ir.loops import ERROR_BUFFER, Assign, Buffer, BufferRole, For, If, Stmt, Store
from polyfuse.targets.cuda_expr import (ExprEmitter, c_name, helpers_for, register_type,
                                        storage_type, to_register, to_storage)


def emit_cuda(kernel: GpuKernel) -> str:
    """The CUDA C source of every launch of ``kernel``."""
    functions = [_LaunchWriter(kernel, launch).function() for launch in kernel.launches]
    head = f"// polyfuse kernel {kernel.name}: {len(kernel.launches)} launch(es)"
    return "\n".join([head, *helpers_for("".join(functions)), "", *functions])


def _flat(names: list[str], strides: tuple[int, ...]) -> str:
    return " + ".join(n if st == 1 else f"{n} * {st}LL" for n, st in zip(names, strides))


class _LaunchWriter:
    def __init__(self, kernel: GpuKernel, launch: Launch) -> None:
        self.kernel = kernel
        self.launch = launch
        self.lines: list[str] = []
        self.exprs = ExprEmitter(self.load)

    def function(self) -> str:
        k, launch = self.kernel, self.launch
        params = [_param(b) for b in k.buffers]
        params += [f"{'int' if s.dtype.is_bool else register_type(s.dtype)} {c_name(s.name)}"
                   for s in k.scalars]
        head = (f'extern "C" __global__ void __launch_bounds__({launch.threads}) '
                f"{launch.name}({', '.join(params)}) {{")
        self.lines = [head]
        for tile in launch.shared:
            self.lines.append(f"  __shared__ {storage_type(tile.dtype)} {tile.name}[{tile.size}];")
        if launch.shared:  # the copies spread a box over every thread of the block
            self.lines += ["  const long long pf_tid = threadIdx.x + (long long)blockDim.x * "
                           "(threadIdx.y + (long long)blockDim.y * threadIdx.z);",
                           "  const long long pf_threads = (long long)blockDim.x * blockDim.y * blockDim.z;"]
        locals_: dict[str, str] = {}
        for s in walk_gpu(launch.body):
            if isinstance(s, Assign):
                locals_.setdefault(s.var, register_type(s.value.dtype))
        self.lines += [f"  {t} {c_name(v)};" for v, t in locals_.items()]
        self.body(launch.body, "  ")
        self.lines.append("}")
        return "\n".join(self.lines) + "\n"

    # --- statements ---
    def body(self, stmts: tuple[Stmt, ...], indent: str) -> None:
        for s in stmts:
            self.statement(s, indent)

    def statement(self, s: Stmt, indent: str) -> None:
        add, e = self.lines.append, self.exprs.emit
        if isinstance(s, For):
            if s.unroll > 1:
                add(f"{indent}#pragma unroll {s.unroll}")
            v = c_name(s.var)
            add(f"{indent}for (long long {v} = {e(s.lo)}; {v} < {e(s.hi)}; {v} += {s.step}) {{")
            self.block(s.body, indent)
        elif isinstance(s, ThreadFor):
            if s.idle:
                add(f"{indent}if ({' && '.join(f'threadIdx.{AXES[a]} == 0' for a in s.idle)}) {{")
                self.statement(replace(s, idle=()), indent + "  ")
                add(f"{indent}}}")
                return
            v, axis = c_name(s.var), AXES[s.axis]
            start = "" if isinstance(s.lo, Literal) and s.lo.value == 0 else f"{e(s.lo)} + "
            scale = "" if s.step == 1 else f" * {s.step}LL"
            add(f"{indent}for (long long {v} = {start}(long long)threadIdx.{axis}{scale}; "
                f"{v} < {e(s.hi)}; {v} += (long long)blockDim.{axis}{scale}) {{")
            self.block(s.body, indent)
        elif isinstance(s, BlockLoops):
            self.block_loops(s, indent)
        elif isinstance(s, If):
            add(f"{indent}if ({e(s.cond)}) {{")
            self.body(s.then, indent + "  ")
            if s.other:
                add(f"{indent}}} else {{")
                self.body(s.other, indent + "  ")
            add(f"{indent}}}")
        elif isinstance(s, SingleThread):
            add(f"{indent}if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {{")
            self.block(s.body, indent)
        elif isinstance(s, Barrier):
            add(f"{indent}__syncthreads();")
        elif isinstance(s, CopyToShared):
            self.copy(s, indent)
        elif isinstance(s, Store):
            tile = self.launch.tile(s.buffer)
            dt = tile.dtype if tile is not None else self.kernel.buffer(s.buffer).dtype
            add(f"{indent}{self.address(Read(s.buffer, s.indices, dt))} = {to_storage(e(s.value), dt)};")
        elif isinstance(s, Assign):
            add(f"{indent}{c_name(s.var)} = {e(s.value)};")
        else:
            raise CodegenError(f"no CUDA code for statement {type(s).__name__}")

    def block(self, stmts: tuple[Stmt, ...], indent: str) -> None:
        self.body(stmts, indent + "  ")
        self.lines.append(f"{indent}}}")

    def block_loops(self, s: BlockLoops, indent: str) -> None:
        add = self.lines.append
        add(f"{indent}for (long long pf_block = blockIdx.x; pf_block < {s.trips}LL; "
            f"pf_block += gridDim.x) {{")
        inner = indent + "  "
        add(f"{inner}long long pf_rest = pf_block;")
        for k in reversed(range(len(s.loops))):  # the innermost loop varies fastest
            r = s.loops[k]
            value = f"(pf_rest % {r.trips}LL)" if k else "pf_rest"
            value = value if r.step == 1 else f"{value} * {r.step}LL"
            add(f"{inner}const long long {c_name(r.var)} = {f'{r.lo}LL + ' if r.lo else ''}{value};")
            if k:
                add(f"{inner}pf_rest /= {r.trips}LL;")
        self.block(s.body, indent)

    def copy(self, s: CopyToShared, indent: str) -> None:
        """Every thread copies elements ``tid, tid + threads, ...`` of the box (row-major,
        so neighbouring threads read neighbouring elements of the buffer)."""
        tile = self.tile(s.tile)
        buf = self.kernel.buffer(s.buffer)
        add, inner = self.lines.append, indent + "  "
        add(f"{indent}for (long long pf_i = pf_tid; pf_i < {tile.elements}LL; pf_i += pf_threads) {{")
        add(f"{inner}long long pf_rest = pf_i;")
        rank = len(tile.shape)
        for d in reversed(range(rank)):
            extent = f" % {tile.shape[d]}LL" if d else ""
            add(f"{inner}const long long pf_l{d} = pf_rest{extent};")
            if d:
                add(f"{inner}pf_rest /= {tile.shape[d]}LL;")
            zero = isinstance(s.offsets[d], Literal) and s.offsets[d].value == 0
            offset = "" if zero else f"{self.exprs.emit(s.offsets[d])} + "
            add(f"{inner}const long long pf_g{d} = {offset}pf_l{d};")
        inside = " && ".join(f"pf_g{d} >= 0 && pf_g{d} < {n}LL" for d, n in enumerate(buf.shape))
        source = _flat([f"pf_g{d}" for d in range(rank)], buf.strides)
        target = _flat([f"pf_l{d}" for d in range(rank)], tile.strides)
        zero_value = f"({storage_type(tile.dtype)})0"
        add(f"{inner}{tile.name}[{target}] = ({inside}) ? {c_name(buf.name)}[{source}] : {zero_value};")
        add(f"{indent}}}")

    # --- memory ---
    def tile(self, name: str) -> SharedTile:
        tile = self.launch.tile(name)
        if tile is None:
            raise CodegenError(f"launch {self.launch.name} has no shared tile '{name}'")
        return tile

    def address(self, access: Read) -> str:
        """The element ``access`` names (a read, or a store's target)."""
        name, indices = access.tensor, access.indices
        tile = self.launch.tile(name)
        shape = tile.shape if tile is not None else self.kernel.buffer(name).shape
        strides = tile.strides if tile is not None else self.kernel.buffer(name).strides
        terms = []
        for dim, (index, stride, extent) in enumerate(zip(indices, strides, shape)):
            term = self.exprs.emit(index)
            if access.is_checked(dim):
                term = f"pf_checked({term}, {extent}LL, {c_name(ERROR_BUFFER)})"
            terms.append(term if stride == 1 else f"{term} * {stride}LL")
        return f"{c_name(name)}[{' + '.join(terms) or '0'}]"

    def load(self, r: Read) -> str:
        tile = self.launch.tile(r.tensor)
        dt = tile.dtype if tile is not None else self.kernel.buffer(r.tensor).dtype
        return to_register(self.address(r), dt)


def _param(b: Buffer) -> str:
    const = "const " if b.role is BufferRole.IN else ""
    return f"{const}{storage_type(b.dtype)}* __restrict__ {c_name(b.name)}"
