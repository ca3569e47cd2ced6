"""GPU kernel -> CUDA C source: one ``extern "C" __global__`` function per launch.

Every launch takes every buffer (inputs as ``const T* __restrict__``, so loads go
through the read-only cache) and then the scalars. Block loops become a grid-stride
loop over the product of their trip counts; thread loops start at the thread's index
and stride by the block's size; a shared tile is a static ``__shared__`` array (16-byte
aligned, so rows the promotion aligned are read 128 bits at a time) filled by all
threads of the block, with zeros outside the buffer: each thread copies the same
number of elements, a loop ptxas unrolls where it is short. A register tile
(:class:`~polyfuse.ir.gpu.Threads`) is a block of C that sets the thread's variables
and declares its registers as local arrays, indexed by constants once the micro-tile's
loops (``#pragma unroll``) are unrolled. A warp reduction is a loop of
``__shfl_xor_sync`` over its offsets, unrolled. Indices are ``int`` where
:func:`narrow_indices` proves them bounded, else ``long long``. An asynchronous copy is ``cp.async``
per element (4 or 8 bytes, src-size 0 outside the buffer, so the tile gets zeros), or
per 16 bytes where rows and offsets fall on 16-byte words (checked at run time for the
buffer's address), with ``cp.async.commit_group`` and ``cp.async.wait_group`` around it. A thread loop with a
vector (:meth:`_LaunchWriter.vector_loop`) reads and writes its groups' neighbouring
elements as one word (``pf_vec``: ``ld.global.v4.f32`` for four float32) where a test
before the loop finds every word aligned.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from polyfuse.errors import CodegenError

from polyfuse.ir.comprehension import Literal, LocalRef, Read, combine
from polyfuse.ir.gpu import (AXES, LANES, MMA_DEPTH, TILE_M, TILE_N, MmaNest, register_loops, AsyncCommit, AsyncWait, Barrier, BlockLoops, CopyToShared, GpuKernel, Launch,
                             Registers, SharedTile, SingleThread, ThreadFor, Threads, WarpReduce, walk_gpu)
from polyfuse.ir.affine import affine
from polyfuse.ir.comprehension import (Binary, BinaryOp, Call, Expr, IndexVar, Select, Unary, children,
                                       index_names, map_expr)
from polyfuse.ir.loops import (ERROR_BUFFER, Assign, Buffer, BufferRole, For, If, Interval, Stmt, Store, TileProduct,
                               loop_range, map_stmt_exprs, node_range, numbers, stmt_bodies, stmt_exprs, stmt_nodes)
from polyfuse.ir.types import DType
from polyfuse.scheduler.gpu_mapping import STATIC_SHARED
from polyfuse.targets.cuda_expr import (INT32_SPAN, ExprEmitter, c_name, helpers_for, register_type,
                                        storage_type, to_register, to_storage)


COPY_UNROLL = 32  # a copy's steps per thread unrolled whole up to this many
ASYNC_COPY_UNROLL = 16  # ... of an asynchronous one, whose addresses live beside the products


def emit_cuda(kernel: GpuKernel) -> str:
    """The CUDA C source of every launch of ``kernel``."""
    functions = [_LaunchWriter(kernel, launch).function() for launch in kernel.launches]
    head = f"// polyfuse kernel {kernel.name}: {len(kernel.launches)} launch(es)"
    return "\n".join([head, *helpers_for("".join(functions)), "", *functions])


def narrow_indices(kernel: GpuKernel, launch: Launch) -> bool:
    """Whether ``launch`` computes its indices in 32-bit ``int`` (half the integer
    instructions of ``long long``, and addresses in one ``IMAD.WIDE``): where every
    buffer has fewer than 2**31 elements (so an access inside one has a 32-bit offset)
    and every index expression is bounded within +-2**30 at every node, from the ranges of
    the loops around it. Integers read from memory, locals and scalars stay ``long long``
    (C widens the index arithmetic they meet)."""
    if any(math.prod(numbers(b.shape)) >= 2**31 for b in kernel.buffers):   # (the GPU's shapes are numbers)
        return False
    return _bounded_body(launch.body, {})


def _bounded_body(body: tuple[Stmt, ...], env: dict[str, Interval]) -> bool:
    for s in body:
        if not all(_bounded(e, env) for e in stmt_exprs(s)):
            return False
        if isinstance(s, BlockLoops):
            if s.trips >= INT32_SPAN:
                return False
            inner = env | s.ranges
        elif isinstance(s, Threads):
            inner = dict(env)
            for r in s.ranges:
                lo = _bounded(r.lo, env)
                if not isinstance(lo, tuple):
                    return False
                inner[r.var] = (lo[0], lo[1] + (r.threads - 1) * r.step)
        elif isinstance(s, (For, ThreadFor)):
            inner = env | dict(loop_range(s, env))
            if s.var not in inner or max(map(abs, inner[s.var])) + s.step * 1024 >= INT32_SPAN:
                return False
        else:
            inner = env
        nested = (s.nest,) if isinstance(s, TileProduct) else stmt_bodies(s)
        if not all(_bounded_body(b, inner) for b in nested):
            return False
    return True


def _bounded(e: Expr, env: dict[str, Interval]) -> Interval | bool | None:
    """The range of ``e`` where its C type is ``int`` (an integer of loop variables and
    literals, as narrow code writes it) and it is bounded at every node; True where its C
    type is another (a ``long long`` read, local, scalar or cast, a float, a bool) and the
    ``int`` arithmetic inside it is bounded; None (falsy) where some is not."""
    match e:
        case Literal(value=v, dtype=dt) if dt.is_int and dt is not DType.UINT64:
            return (int(v), int(v)) if -INT32_SPAN < int(v) < INT32_SPAN else True   # (else a long long)
        case IndexVar(name=n):
            return _within(env[n]) if n in env else None
    parts = [_bounded(x, env) for x in children(e)]
    if any(p is None for p in parts):
        return None
    typed = parts[1:] if isinstance(e, Select) else parts    # the operands C's type follows
    if not e.dtype.is_int or e.dtype is DType.UINT64 or not typed or not all(isinstance(p, tuple) for p in typed) \
            or not isinstance(e, (Unary, Binary, Select, Call)) or (isinstance(e, Binary) and e.op.is_shift):
        return True
    ranges: list[Interval] = typed  # type: ignore[assignment]
    match e:
        case Binary(op=BinaryOp.DIV | BinaryOp.MOD) | Call(fn="floordiv" | "floormod"):
            (a, b), (c, d) = ranges
            if c != d or c <= 0:    # only a positive constant divisor is bounded here
                return None
            floor = isinstance(e, Call)
            if (e.op is BinaryOp.DIV) if isinstance(e, Binary) else e.fn == "floordiv":
                return (a // c, b // c) if floor else (_truncated(a, c), _truncated(b, c))
            return (0, c - 1) if floor or a >= 0 else (1 - c, c - 1)
        case Call(fn="abs"):
            (a, b), = ranges
            return (0 if a <= 0 <= b else min(abs(a), abs(b)), max(abs(a), abs(b)))
        case Select():
            return (min(ranges[0][0], ranges[1][0]), max(ranges[0][1], ranges[1][1]))
    found = node_range(e, ranges)   # -, +, *, min, max
    return None if found is None else _within(found)


def _within(r: Interval) -> Interval | None:
    return r if -INT32_SPAN < r[0] and r[1] < INT32_SPAN else None


def _truncated(a: int, c: int) -> int:
    """C's ``a / c`` for ``c > 0``."""
    return a // c if a >= 0 else -(-a // c)


def _flat(names: list[str], strides: tuple[int, ...], suffix: str) -> str:
    return " + ".join(n if st == 1 else f"{n} * {st}{suffix}" for n, st in zip(names, strides))


class _LaunchWriter:
    def __init__(self, kernel: GpuKernel, launch: Launch) -> None:
        self.kernel = kernel
        self.launch = launch
        self.lines: list[str] = []
        narrow = narrow_indices(kernel, launch)
        # the C type of index arithmetic, and the suffix of its literals
        self.index, self.suffix = ("int", "") if narrow else ("long long", "LL")
        self.exprs = ExprEmitter(self.load, narrow)
        self.registers: dict[str, Registers] = {}   # those of the register tile being written
        self.warp: Threads | None = None            # the warp region being written
        self.fragment = False                       # in a register loop: registers at pf_e
        self.lanes: dict[Read, str] = {}            # in a vector group: reads of a loaded word

    def function(self) -> str:
        I = self.index
        k, launch = self.kernel, self.launch
        params = [_param(b) for b in k.buffers]
        params += [f"{'int' if s.dtype.is_bool else register_type(s.dtype)} {c_name(s.name)}"
                   for s in k.scalars]
        head = (f'extern "C" __global__ void __launch_bounds__({launch.threads}) '
                f"{launch.name}({', '.join(params)}) {{")
        self.lines = [head]
        dynamic = dynamic_shared(launch)
        if dynamic:   # one dynamic array (the device's: the launch asks for its size), cut into the tiles
            self.lines += ["#ifdef __CUDA_ARCH__", "  extern __shared__ __align__(16) unsigned char pf_smem[];",
                           "#else", f"  __shared__ __align__(16) unsigned char pf_smem[{dynamic}];", "#endif"]
        offset = 0
        for tile in launch.shared:
            kind = storage_type(tile.dtype)
            if dynamic:
                self.lines.append(f"  {kind}* const {tile.name} = ({kind}*)(pf_smem + {offset});")
                offset += -(-tile.bytes // 16) * 16
            else:
                self.lines.append(f"  __shared__ __align__(16) {kind} {tile.name}[{tile.size}];")
        if launch.shared:  # the copies spread a box over every thread of the block
            self.lines += [f"  const {I} pf_tid = threadIdx.x + ({I})blockDim.x * "
                           f"(threadIdx.y + ({I})blockDim.y * threadIdx.z);"]
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
        I, L = self.index, self.suffix
        add, e = self.lines.append, self.exprs.emit
        if isinstance(s, For) and self.warp is not None and not self.fragment \
                and (point := register_loops(s, self.warp.registers[0])) is not None:
            self.register_loops(s, point, indent)
        elif isinstance(s, For):
            if s.unroll > 1:
                add(f"{indent}#pragma unroll {s.unroll}")
            v = c_name(s.var)
            add(f"{indent}for ({I} {v} = {e(s.lo)}; {v} < {e(s.hi)}; {v} += {s.step}) {{")
            self.block(s.body, indent)
        elif isinstance(s, ThreadFor):
            if s.idle:
                add(f"{indent}if ({' && '.join(f'threadIdx.{AXES[a]} == 0' for a in s.idle)}) {{")
                self.statement(replace(s, idle=()), indent + "  ")
                add(f"{indent}}}")
                return
            if s.vector > 1:
                self.vector_loop(s, indent)
                return
            v, axis = c_name(s.var), AXES[s.axis]
            start = "" if isinstance(s.lo, Literal) and s.lo.value == 0 else f"{e(s.lo)} + "
            scale = "" if s.step == 1 else f" * {s.step}{L}"
            add(f"{indent}for ({I} {v} = {start}({I})threadIdx.{axis}{scale}; "
                f"{v} < {e(s.hi)}; {v} += ({I})blockDim.{axis}{scale}) {{")
            self.block(s.body, indent)
        elif isinstance(s, BlockLoops):
            self.block_loops(s, indent)
        elif isinstance(s, Threads):
            self.threads(s, indent)
        elif isinstance(s, TileProduct) and self.warp is not None:
            self.tile_product(s, indent)
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
        elif isinstance(s, WarpReduce):
            self.warp_reduce(s, indent)
        elif isinstance(s, AsyncCommit):
            add(f"{indent}pf_cp_async_commit();")
        elif isinstance(s, AsyncWait):
            add(f"{indent}pf_cp_async_wait({s.pending});")
        elif isinstance(s, Store) and s.buffer in self.registers:
            add(f"{indent}{self.address(Read(s.buffer, s.indices, s.value.dtype))} = {e(s.value)};")
        elif isinstance(s, Store):
            dt = self.dtype(s.buffer)
            add(f"{indent}{self.address(Read(s.buffer, s.indices, dt))} = {to_storage(e(s.value), dt)};")
        elif isinstance(s, Assign):
            add(f"{indent}{c_name(s.var)} = {e(s.value)};")
        else:
            raise CodegenError(f"no CUDA code for statement {type(s).__name__}")

    def block(self, stmts: tuple[Stmt, ...], indent: str) -> None:
        self.body(stmts, indent + "  ")
        self.lines.append(f"{indent}}}")

    def vector_loop(self, s: ThreadFor, indent: str) -> None:
        """A thread loop with a vector of w (:class:`ThreadFor`): each thread's groups of w
        consecutive iterations, then the rest one per thread. Where the body is
        straight-line (:func:`_lanes_apart`), a group reads each access that runs along
        the loop's variable as one word of w elements, and writes each such store so,
        when every such word of the loop is aligned (one test before it: the buffers'
        addresses and the offsets at its start); otherwise the group's iterations run one
        after another."""
        I, L = self.index, self.suffix
        add, e = self.lines.append, self.exprs.emit
        w, v, inner = s.vector, c_name(s.var), indent + "  "
        add(f"{indent}{{")
        add(f"{inner}const {I} pf_lo = {e(s.lo)}, pf_full = pf_lo + ({e(s.hi)} - pf_lo) / {w}{L} * {w}{L};")
        start, stride = f"pf_lo + ({I})threadIdx.x * {w}{L}", f"({I})blockDim.x * {w}{L}"
        words = self.words(s) if _lanes_apart(s.body) else {}
        if words:
            at_start = {s.var: s.lo}
            guard = " && ".join(dict.fromkeys(
                f"(((unsigned long long)&{self.address(_substituted(r, at_start))}) & "
                f"{min(16, w * r.dtype.numpy.itemsize) - 1}ULL) == 0ULL" for r in words.values()))
            add(f"{inner}if ({guard}) {{")
            add(f"{inner}  for ({I} {v} = {start}; {v} < pf_full; {v} += {stride}) {{")
            self.vector_body(s, words, inner + "    ")
            add(f"{inner}  }}")
            add(f"{inner}}} else {{")
            self.group_loop(s, start, stride, inner + "  ")
            add(f"{inner}}}")
        else:
            self.group_loop(s, start, stride, inner)
        whole = isinstance(s.lo, Literal) and isinstance(s.hi, Literal) and (int(s.hi.value) - int(s.lo.value)) % w == 0
        if not whole:   # the iterations past the last group, one per thread
            add(f"{inner}for ({I} {v} = pf_full + ({I})threadIdx.x; {v} < {e(s.hi)}; {v} += ({I})blockDim.x) {{")
            self.block(s.body, inner)
        add(f"{indent}}}")

    def group_loop(self, s: ThreadFor, start: str, stride: str, indent: str) -> None:
        """The groups of a vector loop, each iteration of a group in turn."""
        I, add, v = self.index, self.lines.append, c_name(s.var)
        add(f"{indent}for ({I} pf_g = {start}; pf_g < pf_full; pf_g += {stride}) {{")
        add(f"{indent}  #pragma unroll")
        add(f"{indent}  for ({I} {v} = pf_g; {v} < pf_g + {s.vector}{self.suffix}; {v} += 1) {{")
        self.block(s.body, indent + "  ")
        add(f"{indent}}}")

    def words(self, s: ThreadFor) -> dict[tuple[str, tuple[Expr, ...]], Read]:
        """The reads and store targets of ``s``'s body whose group of elements is one word
        (a kernel buffer's elements of w * size <= 16 bytes, at ``var + c`` in the last
        index, ``var`` nowhere else, unchecked), by buffer and indices, as reads of the
        buffer's type."""
        out = {}
        for r in [r for st in s.body for r in _reads(st)] + [_target(st) for st in s.body if isinstance(st, Store)]:
            if self.launch.tile(r.tensor) is not None or r.tensor in self.registers:
                continue
            dt = self.kernel.buffer(r.tensor).dtype
            form = affine(r.indices[-1]) if r.indices else None
            if dt.is_bool or s.vector * dt.numpy.itemsize > 16 or form is None or form.get(s.var) != 1 \
                    or any(s.var in index_names(i) for i in r.indices[:-1]) \
                    or any(r.is_checked(d) for d in range(len(r.indices))):
                continue
            out.setdefault((r.tensor, r.indices), Read(r.tensor, r.indices, dt))
        return out

    def vector_body(self, s: ThreadFor, whole: dict[tuple[str, tuple[Expr, ...]], Read], indent: str) -> None:
        """A group's statements, each for the w iterations in turn: the words it reads
        loaded first, a word it stores written after."""
        add, w = self.lines.append, s.vector
        lanes = [{s.var: Binary(BinaryOp.ADD, IndexVar(s.var), _lit(j), DType.INT64)} if j else {}
                 for j in range(w)]
        names = (f"pf_w{k}" for k in itertools.count())
        for st in s.body:
            for r in dict.fromkeys(r for r in _reads(st) if (r.tensor, r.indices) in whole):
                word, name = whole[(r.tensor, r.indices)], next(names)
                kind = f"pf_vec<{storage_type(word.dtype)}, {w}>"
                add(f"{indent}const {kind} {name} = *reinterpret_cast<const {kind}*>(&{self.address(word)});")
                for j, at in enumerate(lanes):
                    self.lanes[_substituted(r, at)] = to_register(f"{name}.v[{j}]", word.dtype)
            word = whole.get((st.buffer, st.indices)) if isinstance(st, Store) else None
            if isinstance(st, Store) and word is not None:
                name, kind = next(names), f"pf_vec<{storage_type(word.dtype)}, {w}>"
                add(f"{indent}{kind} {name};")
                for j, at in enumerate(lanes):
                    value = self.exprs.emit(map_expr(st.value, _lane_of(at)))
                    add(f"{indent}{name}.v[{j}] = {to_storage(value, word.dtype)};")
                add(f"{indent}*reinterpret_cast<{kind}*>(&{self.address(word)}) = {name};")
            else:
                for at in lanes:
                    self.statement(map_stmt_exprs(st, _lane_of(at)), indent)
        self.lanes.clear()

    def dtype(self, name: str) -> DType:
        """The storage type of shared tile or buffer ``name``."""
        tile = self.launch.tile(name)
        return tile.dtype if tile is not None else self.kernel.buffer(name).dtype

    def block_loops(self, s: BlockLoops, indent: str) -> None:
        I, L = self.index, self.suffix
        add = self.lines.append
        add(f"{indent}for ({I} pf_block = blockIdx.x; pf_block < {s.trips}{L}; "
            f"pf_block += gridDim.x) {{")
        inner = indent + "  "
        add(f"{inner}{I} pf_rest = pf_block;")
        for k in reversed(range(len(s.loops))):  # the innermost loop varies fastest
            r = s.loops[k]
            value = f"(pf_rest % {r.trips}{L})" if k else "pf_rest"
            value = value if r.step == 1 else f"{value} * {r.step}{L}"
            add(f"{inner}const {I} {c_name(r.var)} = {f'{r.lo}{L} + ' if r.lo else ''}{value};")
            if k:
                add(f"{inner}pf_rest /= {r.trips}{L};")
        self.block(s.body, indent)

    def threads(self, s: Threads, indent: str) -> None:
        I, L = self.index, self.suffix
        add, inner = self.lines.append, indent + "  "
        add(f"{indent}{{")
        for r in s.ranges:
            start = "" if isinstance(r.lo, Literal) and r.lo.value == 0 else f"{self.exprs.emit(r.lo)} + "
            add(f"{inner}const {I} {c_name(r.var)} = {start}({I})threadIdx.{AXES[r.axis]} * {r.step}{L};")
        if s.warps:
            add(f"{inner}const int pf_lane = threadIdx.x;")
        for a in s.registers:
            add(f"{inner}{register_type(a.dtype)} {c_name(a.name)}[{math.prod(a.shape) // s.lanes}];")
        outer = self.registers
        self.registers = outer | {a.name: a for a in s.registers}
        self.warp = s if s.warps else None
        self.block(s.body, indent)
        self.registers, self.warp = outer, None

    def register_loops(self, s: For, point: tuple[str, str], indent: str) -> None:
        """Loops over a warp's registers: each lane runs the points it holds, element
        ``pf_e`` of its registers at the m16n8 tile ``pf_e / 4`` (row-major over the warp's
        tile), row ``lane / 4 + 8 * (pf_e / 2 % 2)`` and column ``2 * (lane % 4) + pf_e % 2``
        in it."""
        I = self.index
        add, step = self.lines.append, indent + "  "
        (acc,) = self.warp.registers  # type: ignore[union-attr]
        rows, cols = acc.shape
        inner = s.body[0]
        assert isinstance(inner, For)
        r, c = point
        add(f"{indent}#pragma unroll")
        add(f"{indent}for (int pf_e = 0; pf_e < {rows * cols // LANES}; ++pf_e) {{")
        add(f"{step}const {I} {c_name(r)} = (pf_e >> 2) / {cols // TILE_N} * {TILE_M} + (pf_lane >> 2) "
            f"+ ((pf_e >> 1) & 1) * 8;")
        add(f"{step}const {I} {c_name(c)} = (pf_e >> 2) % {cols // TILE_N} * {TILE_N} + (pf_lane & 3) * 2 "
            f"+ (pf_e & 1);")
        self.fragment = True
        self.body(inner.body, step)
        self.fragment = False
        add(f"{indent}}}")

    def tile_product(self, s: TileProduct, indent: str) -> None:
        """A warp's tile product on the matrix units: at each step of the depth, each
        lane loads its fragments of ``a`` (``rows / 16`` tiles of 16 x k) and ``b`` (``cols
        / 8`` tiles of k x 8) through the nest's reads, then every pair of them goes
        through one ``mma.sync`` into the registers of its 16 x 8 outputs. A fragment
        whose rows (along k, or for 16-bit ``b`` along its columns) are 16-byte words of a
        shared tile comes in one ``ldmatrix`` per tile (:meth:`_matrix_rows`), the others
        element by element."""
        I = self.index
        add = self.lines.append
        rows, cols, depth = s.shape
        nest = MmaNest.of(s)
        r, c, k = c_name(nest.r), c_name(nest.c), c_name(nest.k)
        step, mi, nj = MMA_DEPTH[s.builtin], rows // TILE_M, cols // TILE_N
        wide = step == 16   # 16-bit operands: two per register, the lower k in the low half
        i1, i2, i3 = (indent + "  " * n for n in range(1, 4))
        add(f"{indent}#pragma unroll")
        add(f"{indent}for (int pf_k0 = 0; pf_k0 < {depth}; pf_k0 += {step}) {{")
        add(f"{i1}unsigned pf_a[{mi}][4], pf_b[{nj}][2];")
        for operand, count, tiles, corner, kq in (
                ("a", 4, mi, f"{r} = pf_t * {TILE_M} + (pf_lane >> 2) + (pf_q & 1) * 8", "(pf_q >> 1)"),
                ("b", 2, nj, f"{c} = pf_t * {TILE_N} + (pf_lane >> 2)", "pf_q")):
            value = nest.x if operand == "a" else nest.y
            add(f"{i1}#pragma unroll")
            add(f"{i1}for (int pf_t = 0; pf_t < {tiles}; ++pf_t) {{")
            rows_of = self._matrix_rows(value, nest, operand, wide)
            if rows_of is not None:
                at, load, rounded = rows_of
                add(f"{i2}{{")
                add(f"{i3}{at}")
                add(f"{i3}{load}(pf_{operand}[pf_t], &{self.address(_read_of(value))});")
                if rounded:
                    add(f"{i3}for (int pf_q = 0; pf_q < {count}; ++pf_q) pf_{operand}[pf_t][pf_q] = "
                        f"__float_as_uint(pf_tf32(__uint_as_float(pf_{operand}[pf_t][pf_q])));")
                add(f"{i2}}}")
                add(f"{i1}}}")
                continue
            add(f"{i2}#pragma unroll")
            add(f"{i2}for (int pf_q = 0; pf_q < {count}; ++pf_q) {{")
            add(f"{i3}const {I} {corner};")
            if wide:
                add(f"{i3}const {I} {k} = pf_k0 + (pf_lane & 3) * 2 + {kq} * 8;")
                low, high = self.address(_read_of(value)), self.address(_next(_read_of(value), nest.k))
                add(f"{i3}pf_{operand}[pf_t][pf_q] = (unsigned){low} | ((unsigned){high} << 16);")
            else:
                add(f"{i3}const {I} {k} = pf_k0 + (pf_lane & 3) + {kq} * 4;")
                add(f"{i3}pf_{operand}[pf_t][pf_q] = __float_as_uint({self.exprs.emit(value)});")
            add(f"{i2}}}")
            add(f"{i1}}}")
        add(f"{i1}#pragma unroll")
        add(f"{i1}for (int pf_i = 0; pf_i < {mi}; ++pf_i) {{")
        add(f"{i2}#pragma unroll")
        add(f"{i2}for (int pf_j = 0; pf_j < {nj}; ++pf_j) {{")
        add(f"{i3}pf_{s.builtin}(&{c_name(s.acc.tensor)}[(pf_i * {nj} + pf_j) * 4], pf_a[pf_i], pf_b[pf_j]);")
        add(f"{i2}}}")
        add(f"{i1}}}")
        add(f"{indent}}}")

    def _matrix_rows(self, value: Expr, nest: MmaNest, operand: str, wide: bool) -> tuple[str, str, bool] | None:
        """How ``ldmatrix`` loads a fragment of ``value`` (a shared tile read, in ``tf32``
        on TF32): the C that sets this lane's row of the 8 x 16-byte matrices (``ldmatrix``
        takes lane ``8 j + i``'s address as row ``i`` of matrix ``j``), the helper, and
        whether the words are rounded to TF32 after; None where the rows are not whole
        aligned 16-byte words of a shared tile. ``a`` is 4 matrices (rows 0-7 and 8-15,
        then the same of the second half of k); ``b`` 2 (the halves of k): along k
        contiguous as they are, along the columns (16-bit) transposed."""
        I = self.index
        read = _read_of(value)
        rounded = value is not read
        tile = self.launch.tile(read.tensor)
        if tile is None or rounded == wide or tile.dtype.numpy.itemsize != (2 if wide else 4) \
                or (rounded and not (isinstance(value, Call) and value.fn == "tf32")):
            return None
        size = tile.dtype.numpy.itemsize
        words = 16 // size                       # elements of one matrix row
        if any(st * size % 16 for st in tile.strides[:-1]) or tile.stage_size * size % 16:
            return None
        point = nest.r if operand == "a" else nest.c
        last = affine(read.indices[-1])
        along_k = [i for i in read.indices if nest.k in index_names(i)]
        if last is None or len(along_k) != 1:
            return None
        r, k = c_name(point), c_name(nest.k)
        if last == {nest.k: 1}:      # k contiguous: rows along the point's axis
            if operand == "a":
                at = (f"const {I} {r} = pf_t * {TILE_M} + (pf_lane & 7) + ((pf_lane >> 3) & 1) * 8, "
                      f"{k} = pf_k0 + (pf_lane >> 4) * {words};")
                return at, "pf_ldmatrix_x4", rounded
            at = (f"const {I} {r} = pf_t * {TILE_N} + (pf_lane & 7), "
                  f"{k} = pf_k0 + ((pf_lane >> 3) & 1) * {words};")
            return at, "pf_ldmatrix_x2", rounded
        # b's columns contiguous (16-bit only): rows along k, transposed; each row's first
        # column a multiple of 8 (the warp's corner and the fragment's tile)
        if operand != "b" or not wide or last.get(point) != 1 or not self._aligned(last, point, words) \
                or affine(along_k[0]) != {nest.k: 1}:
            return None
        at = f"const {I} {r} = pf_t * {TILE_N}, {k} = pf_k0 + (pf_lane & 7) + ((pf_lane >> 3) & 1) * 8;"
        return at, "pf_ldmatrix_x2_trans", rounded

    def _aligned(self, form: dict[str, int], point: str, words: int) -> bool:
        """Whether index ``form`` is a multiple of ``words`` at every start of ``point``'s
        fragments: its other terms the warp region's corners (multiples of ``words`` apart,
        from a constant multiple) and constants."""
        corners = {rng.var: rng for rng in self.warp.ranges} if self.warp is not None else {}
        for var, coef in form.items():
            if var == point:
                continue
            rng = corners.get(var)
            if var == "":
                if coef % words:
                    return False
            elif rng is None or not isinstance(rng.lo, Literal) or (coef * int(rng.lo.value)) % words \
                    or (coef * rng.step) % words:
                return False
        return True

    def warp_reduce(self, s: WarpReduce, indent: str) -> None:
        """The butterfly: at offsets ``lanes / 2, ..., 1`` each thread combines its value
        with the one of the lane that offset apart (every lane of the warp takes part)."""
        add, partner = self.lines.append, LocalRef("pf_shfl", s.dtype)
        threads = self.launch.threads
        mask = "0xffffffffu" if threads >= 32 else f"{(1 << threads) - 1:#x}u"
        value = self.exprs.emit(combine(s.op, LocalRef(s.var, s.dtype), partner, s.dtype))
        add(f"{indent}#pragma unroll")
        add(f"{indent}for (int pf_o = {s.lanes // 2}; pf_o > 0; pf_o >>= 1) {{")
        add(f"{indent}  const {register_type(s.dtype)} {self.exprs.emit(partner)} = "
            f"__shfl_xor_sync({mask}, {c_name(s.var)}, pf_o);")
        add(f"{indent}  {c_name(s.var)} = {value};")
        add(f"{indent}}}")

    def copy(self, s: CopyToShared, indent: str) -> None:
        """Every thread copies elements ``tid, tid + threads, ...`` of the box (row-major,
        so neighbouring threads read neighbouring elements of the buffer), the same
        number of steps each (the last guarded where the threads do not divide the box).
        An asynchronous copy whose rows are whole 16-byte words in the tile and, where the
        buffer's address and the box's offset allow (a uniform test at run time), in the
        buffer, copies 16 bytes at a time (a word past the buffer's end in part: the rest
        zeros)."""
        L = self.suffix
        tile = self.tile(s.tile)
        buf = self.kernel.buffer(s.buffer)
        vector = _vector(s, tile, buf)
        if vector == 1:
            self.copy_steps(s, tile, buf, 1, indent)
            return
        add, offset = self.lines.append, self.exprs.emit(s.offsets[-1])
        add(f"{indent}if ((((unsigned long long){c_name(buf.name)}) & 15ULL) == 0ULL && ({offset}) >= 0 "
            f"&& ({offset}) % {vector}{L} == 0{L}) {{")
        self.copy_steps(s, tile, buf, vector, indent + "  ")
        add(f"{indent}}} else {{")
        self.copy_steps(s, tile, buf, 1, indent + "  ")
        add(f"{indent}}}")

    def copy_steps(self, s: CopyToShared, tile: SharedTile, buf: Buffer, vector: int, indent: str) -> None:
        """The loop of a copy ``vector`` elements at a time."""
        I, L = self.index, self.suffix
        add, inner = self.lines.append, indent + "  "
        threads = self.launch.threads
        shape = tile.shape[:-1] + (tile.shape[-1] // vector,)
        pieces = math.prod(shape)
        steps = -(-pieces // threads)
        whole = steps <= (ASYNC_COPY_UNROLL if s.asynchronous else COPY_UNROLL)
        add(f"{indent}#pragma unroll" + ("" if whole else " 4"))
        add(f"{indent}for ({I} pf_k = 0; pf_k < {steps}{L}; pf_k += 1) {{")
        add(f"{inner}const {I} pf_i = pf_tid + pf_k * {threads}{L};")
        if pieces % threads:
            add(f"{inner}if (pf_i >= {pieces}{L}) break;")
        add(f"{inner}{I} pf_rest = pf_i;")
        rank = len(tile.shape)
        for d in reversed(range(rank)):
            extent = f" % {shape[d]}{L}" if d else ""
            scale = f" * {vector}{L}" if d == rank - 1 and vector > 1 else ""
            add(f"{inner}const {I} pf_l{d} = pf_rest{extent}{scale};")
            if d:
                add(f"{inner}pf_rest /= {shape[d]}{L};")
            zero = isinstance(s.offsets[d], Literal) and s.offsets[d].value == 0
            offset = "" if zero else f"{self.exprs.emit(s.offsets[d])} + "
            add(f"{inner}const {I} pf_g{d} = {offset}pf_l{d};")
        inside = " && ".join(f"pf_g{d} >= 0 && pf_g{d} < {n}{L}" for d, n in enumerate(buf.shape))
        source = _flat([f"pf_g{d}" for d in range(rank)], buf.strides, L)
        target = _flat([f"pf_l{d}" for d in range(rank)], tile.strides, L)
        if s.stage is not None:
            target = f"({self.exprs.emit(s.stage)}) * {tile.stage_size}{L} + {target}"
        size = tile.dtype.numpy.itemsize
        if vector > 1:   # the elements of the word inside the buffer: a prefix (the offset is >= 0)
            rows = " && ".join(f"pf_g{d} >= 0 && pf_g{d} < {n}{L}" for d, n in enumerate(buf.shape[:-1])) or "true"
            add(f"{inner}const {I} pf_d = {buf.shape[-1]}{L} - pf_g{rank - 1};")
            add(f"{inner}const {I} pf_n = !({rows}) || pf_d < 0{L} ? 0{L} : pf_d > {vector}{L} ? {vector}{L} : pf_d;")
            add(f"{inner}pf_cp_async16(&{tile.name}[{target}], pf_n > 0 ? &{c_name(buf.name)}[{source}] : "
                f"{c_name(buf.name)}, (int)(pf_n * {size}));")
        elif s.asynchronous and size >= 4:   # (cp.async moves 4 bytes at least: narrower lands at once)
            add(f"{inner}const bool pf_in = {inside};")
            add(f"{inner}pf_cp_async{size}(&{tile.name}[{target}], pf_in ? &{c_name(buf.name)}[{source}] : "
                f"{c_name(buf.name)}, pf_in);")
        else:
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
        L = self.suffix
        name, indices = access.tensor, access.indices
        registers = self.registers.get(name)
        if registers is not None and self.warp is not None:
            if not self.fragment:
                raise CodegenError(f"launch {self.launch.name}: the warp's registers {name} read or written "
                                   "outside a register loop or a tile product")
            return f"{c_name(name)}[pf_e]"
        if registers is not None:
            steps = tuple(math.prod(registers.shape[k + 1:]) for k in range(len(registers.shape)))
            flat = _flat([f"({self.exprs.emit(i)})" for i in indices], steps, L)
            return f"{c_name(name)}[{flat or '0'}]"
        tile = self.launch.tile(name)
        shape = tile.shape if tile is not None else self.kernel.buffer(name).shape
        strides = tile.strides if tile is not None else self.kernel.buffer(name).strides
        terms = []
        if tile is not None and tile.stages > 1:   # the stage first
            terms.append(f"({self.exprs.emit(indices[0])}) * {tile.stage_size}{L}")
            indices = indices[1:]
        for dim, (index, stride, extent) in enumerate(zip(indices, strides, shape)):
            term = self.exprs.emit(index)
            if access.is_checked(dim):
                term = f"pf_checked({term}, {extent}LL, {c_name(ERROR_BUFFER)})"
            terms.append(term if stride == 1 else f"{term} * {stride}{L}")
        return f"{c_name(name)}[{' + '.join(terms) or '0'}]"

    def load(self, r: Read) -> str:
        if r in self.lanes:
            return self.lanes[r]
        if r.tensor in self.registers:
            return self.address(r)
        return to_register(self.address(r), self.dtype(r.tensor))


def _vector(s: CopyToShared, tile: SharedTile, buf: Buffer) -> int:
    """Elements an asynchronous copy may move 16 bytes at a time: where each row of the
    box is whole words in the tile (rows, stages and the tile itself start on 16-byte
    boundaries) and would be in the buffer at an offset that is a whole number of words
    (its rows contiguous, each starting on a word); else 1."""
    size = tile.dtype.numpy.itemsize
    vector = 16 // size
    if not s.asynchronous or size not in (2, 4, 8) or tile.shape[-1] % vector or tile.stage_size % vector:
        return 1
    if any(t % vector for t in tile.strides[:-1]) or buf.strides[-1] != 1 or any(t % vector for t in buf.strides[:-1]):
        return 1
    return vector


def dynamic_shared(launch: Launch) -> int:
    """The bytes of dynamic shared memory a launch asks for: its tiles (each from a 16-byte
    boundary) where they need more than the 48 KiB a block gets without asking; else 0."""
    total = sum(-(-t.bytes // 16) * 16 for t in launch.shared)
    return total if total > STATIC_SHARED else 0


def _lanes_apart(body: tuple[Stmt, ...]) -> bool:
    """Whether a group may run ``body`` statement by statement, each for its iterations in
    turn: stores and assignments only, each local assigned once and read only there
    (an accumulator: ``acc = acc + x``)."""
    if not all(isinstance(st, (Store, Assign)) for st in body):
        return False
    assigned = [st.var for st in body if isinstance(st, Assign)]
    if len(set(assigned)) != len(assigned):
        return False
    return not any(isinstance(x, LocalRef) and x.name in assigned and not (isinstance(st, Assign) and st.var == x.name)
                   for st in body for x in stmt_nodes(st))


def _lane_of(at: dict[str, Expr]):  # type: ignore[no-untyped-def]
    return lambda e: at.get(e.name, e) if isinstance(e, IndexVar) else e


def _substituted(r: Read, at: dict[str, Expr]) -> Read:
    return map_expr(r, _lane_of(at))  # type: ignore[return-value]


def _reads(s: Stmt) -> list[Read]:
    """The reads of a statement's own expressions."""
    return [e for e in stmt_nodes(s) if isinstance(e, Read)]


def _target(s: Store) -> Read:
    """The element a store writes, as a read."""
    return Read(s.buffer, s.indices, s.value.dtype)


def _lit(v: int) -> Literal:
    return Literal(v, DType.INT64)


def _read_of(value: Expr) -> Read:
    """The read of a matrix-unit operand: ``value``, or the read ``tf32(...)`` rounds."""
    if isinstance(value, Call) and value.fn == "tf32" and isinstance(value.args[0], Read):
        return value.args[0]
    if not isinstance(value, Read):
        raise CodegenError(f"a matrix-unit operand is {value}, not a read")
    return value


def _next(r: Read, var: str) -> Read:
    """``r`` one step further along ``var``."""
    return map_expr(r, lambda e: Binary(BinaryOp.ADD, e, _lit(1), DType.INT64)  # type: ignore[return-value]
                    if isinstance(e, IndexVar) and e.name == var else e)


def _param(b: Buffer) -> str:
    const = "const " if b.role is BufferRole.IN else ""
    return f"{const}{storage_type(b.dtype)}* __restrict__ {c_name(b.name)}"
