"""Loop IR kernel -> LLVM module (shared by the x86 and aarch64 targets).

The module has three layers of functions:

* ``<name>(i8** args)``: the entry point the runtime calls; ``args[k]`` is the data
  pointer of buffer k, then one pointer per scalar to an 8-byte slot holding an
  int64 or a double. It unpacks and calls
* ``<name>.impl(ptr noalias A, ..., scalars)``: the loops. A parallel loop becomes a
  call to ``polyfuse_parallel_for_threads(body, n, ctx, threads)`` of the native
  runtime, where ``body`` unpacks ``ctx`` and calls
* ``<name>.par<k>(ptr noalias ..., captured values, begin, end)``: iterations
  ``begin..end`` of the parallel loop, again with noalias buffers so they vectorize.

Loops carry ``llvm.loop`` metadata for the vector width and unroll factor.

A vector loop that reads an operand packed at compile time (a micro-kernel's row of a
panel of a model's weights) first prefetches that row's stream :data:`PREFETCH_AHEAD`
bytes ahead into L2 (:meth:`KernelEmitter.prefetch_packed`): weights that come from
memory (evicted by the kernels between two runs, each used by few rows) then arrive
before the micro-kernel waits for them. Where several register blocks share a panel of
a few KiB (a 3x3 convolution's rows of a 7x7 map), each block's pass prefetches its own
slice of the next panel instead, as it starts, or a line at a time through its reduction
loop where the slice is larger (a product's rows; :mod:`.panel_prefetch`). Panels a
kernel packs itself were just written and are not prefetched.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from llvmlite import ir

from polyfuse.ir.comprehension import Call, Expr, IndexVar, Literal, Read, ScalarRef, walk
from polyfuse.ir.loops import (ERROR_BUFFER, Assign, Buffer, BufferRole, For, If, LoopKernel, LoopKind, Stmt, Store,
                               TileProduct, extent_expr, map_body_exprs, stmt_nodes, walk_stmts)
from polyfuse.ir.types import DType
from polyfuse.targets.llvm_dot import Isa, declare_variants
from polyfuse.targets.llvm_expr import (F16, F32, F64, I1, I8, I64, ExprEmitter, bf16_to_f32,
                                        calls_libm, f32_to_bf16, register_type, storage_type)
from polyfuse.targets.llvm_tiles import calls
from polyfuse.targets.panel_prefetch import LINE, PanelPrefetch, panel_prefetches

PARALLEL_FOR = "polyfuse_parallel_for_threads"
PREFETCH = "llvm.prefetch.p0"
# bytes between a packed operand's element a micro-kernel reads and the one it prefetches
# (distances from 4 to 24 KiB measured alike), and bytes prefetched there: one pair of
# cache lines, whose neighbours the hardware's stream prefetcher then follows (a block's
# whole row of lines ran slower than its first two); measurements in benchmarks/LOG.md
PREFETCH_AHEAD = 8 << 10
PREFETCH_BYTES = 128
_I8P = I8.as_pointer()
_I32 = ir.IntType(32)
# a prefetch's read (0), locality 2 (keep in L2 and outward), data cache (1)
_INTO_L2 = (ir.Constant(_I32, 0), ir.Constant(_I32, 2), ir.Constant(_I32, 1))


@dataclass
class _Scope:
    """What a function being emitted sees: buffer pointers and named register values."""

    buffers: dict[str, ir.Value]
    values: dict[str, ir.Value]
    locals: dict[str, ir.Value] = field(default_factory=dict)  # allocas of Assign targets


class KernelEmitter:
    def __init__(self, kernel: LoopKernel, module: ir.Module, num_threads: int = 0,
                 scalable: bool = False, avx512: bool = False,
                 native: frozenset[str] = frozenset(), tiles: frozenset[str] = frozenset()) -> None:
        self.kernel = kernel
        self.module = module
        self.num_threads = num_threads
        self.scalable = scalable   # vector loops as scalable vectors (SVE): vscale x width
        self.avx512 = avx512       # masked vector loads and stores are cheap, vscalefps scales
        self.native = native       # dot products (dot4, bfdot2) with instructions
        self.tiles = tiles         # dot products the matrix tiles (AMX) sum
        self.n_parallel = 0
        self.n_loops = 0
        self.enclosing: list[For] = []    # the loops around the statement being emitted
        self.spread: set[str] = set()     # prepacked tensors an enclosing loop prefetches
        # loops (by index) whose iterations stream a slice of a next panel: its address, the panel
        self.spreading: dict[str, list[tuple[ir.Value, PanelPrefetch]]] = {}

    # --- entry points ---
    def emit(self) -> ir.Function:
        k = self.kernel
        params = k.parameters
        param_types = [storage_type(b.dtype).as_pointer() for b in params] + \
                      [register_type(s.dtype) for s in k.scalars]
        impl = ir.Function(self.module, ir.FunctionType(ir.VoidType(), param_types), f"{k.name}.impl")
        impl.linkage = "internal"
        names = [b.name for b in params] + [s.name for s in k.scalars]
        for arg, name in zip(impl.args, names):
            arg.name = name
            if isinstance(arg.type, ir.PointerType):
                _pointer_attributes(arg, k.buffer(name))
        builder = ir.IRBuilder(impl.append_basic_block("entry"))
        scope = _Scope({b.name: a for b, a in zip(params, impl.args)}
                       | _local_buffers(k, k.body, builder),
                       {s.name: a for s, a in zip(k.scalars, impl.args[len(params):])},
                       _allocas(k.body, builder))
        self.body(k.body, scope, builder)
        builder.ret_void()
        return self.entry(impl)

    def entry(self, impl: ir.Function) -> ir.Function:
        k = self.kernel
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [_I8P.as_pointer()]), k.name)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        values = []
        for j, param in enumerate(impl.args):
            slot = b.load(b.gep(fn.args[0], [ir.Constant(I64, j)]))
            if isinstance(param.type, ir.PointerType):
                values.append(b.bitcast(slot, param.type))
                continue
            dt = k.scalars[j - len(k.parameters)].dtype
            raw = b.load(b.bitcast(slot, (F64 if dt.is_float else I64).as_pointer()))
            if dt.is_bool:
                raw = b.icmp_signed("!=", raw, ir.Constant(I64, 0))
            elif param.type is F32:
                raw = b.fptrunc(raw, F32)
            values.append(raw)
        b.call(impl, values)
        b.ret_void()
        return fn

    # --- statements ---
    def body(self, stmts: tuple[Stmt, ...], scope: _Scope, b: ir.IRBuilder) -> None:
        for s in stmts:
            if isinstance(s, For):
                if s.kind is LoopKind.PARALLEL:
                    self.parallel(s, scope, b)
                elif self._masks_its_tail(s):
                    self.split_tail(s, scope, b)
                else:
                    self.loop(s, scope, b)
            elif isinstance(s, If):
                cond = self.exprs(scope).emit(s.cond, b)
                if s.other:
                    with b.if_else(cond) as (then, other):
                        with then:
                            self.body(s.then, scope, b)
                        with other:
                            self.body(s.other, scope, b)
                else:
                    with b.if_then(cond):
                        self.body(s.then, scope, b)
            elif isinstance(s, Store):
                self.store(s, scope, b)
            elif isinstance(s, Assign):
                b.store(self.exprs(scope).emit(s.value, b), scope.locals[s.var])
            elif isinstance(s, TileProduct):
                if s.builtin in self.tiles:
                    self.tile_product(s, scope, b)
                else:
                    self.body(s.nest, scope, b)

    def tile_product(self, s: TileProduct, scope: _Scope, b: ir.IRBuilder) -> None:
        """A call of the block's function on the tiles (:mod:`.llvm_tiles`), linked and
        inlined once the module is optimized."""
        acc, a, w = [self.address(r, scope, b) for r in s.operands]
        for name, a_at, w_at in calls(s.builtin, s.shape, s.steps):
            f = self.module.globals.get(name) or ir.Function(
                self.module, ir.FunctionType(ir.VoidType(), [acc.type, a.type, w.type]), name)
            b.call(f, [acc, b.gep(a, [ir.Constant(I64, a_at)]), b.gep(w, [ir.Constant(I64, w_at)])])

    def exprs(self, scope: _Scope) -> ExprEmitter:
        return ExprEmitter(self.module, scope.values, lambda r, b: self.load(r, scope, b),
                           scope.locals, scale=self.avx512, native=self.native)

    def address(self, access: Read, scope: _Scope, b: ir.IRBuilder, inbounds: bool = True) -> ir.Value:
        """The element ``access`` names (a read, or a store's target; one a prefetch
        names, maybe past the buffer, not ``inbounds``)."""
        buffer, indices = access.tensor, access.indices
        buf = self.kernel.buffer(buffer)
        emitter = self.exprs(scope)
        offset: ir.Value = ir.Constant(I64, 0)
        for dim, (idx, stride, extent) in enumerate(zip(indices, buf.strides, buf.shape)):
            term = emitter.emit(idx, b)
            if access.is_checked(dim):
                term = self.checked_index(term, emitter.emit(extent_expr(extent), b), scope, b)
            if stride != 1:
                term = b.mul(term, emitter.emit(extent_expr(stride), b))
            offset = b.add(offset, term)
        return b.gep(scope.buffers[buffer], [offset], inbounds=inbounds)

    def checked_index(self, index: ir.Value, extent: ir.Value, scope: _Scope,
                      b: ir.IRBuilder) -> ir.Value:
        """An index read from a tensor or not proven in bounds: outside [0, extent) it
        flags the error buffer."""
        bad = b.icmp_unsigned(">=", index, extent)
        with b.if_then(bad, likely=False):
            b.store(ir.Constant(I64, 1), scope.buffers[ERROR_BUFFER])
        return b.select(bad, ir.Constant(I64, 0), index)

    def load(self, r: Read, scope: _Scope, b: ir.IRBuilder) -> ir.Value:
        dt = self.kernel.buffer(r.tensor).dtype
        raw = b.load(self.address(r, scope, b))
        return _to_register(raw, dt, b)

    def store(self, s: Store, scope: _Scope, b: ir.IRBuilder) -> None:
        dt = self.kernel.buffer(s.buffer).dtype
        value = self.exprs(scope).emit(s.value, b)
        b.store(_to_storage(value, dt, b), self.address(Read(s.buffer, s.indices, dt), scope, b))

    def _masks_its_tail(self, s: For) -> bool:
        """Whether ``s`` is a vector loop on AVX-512 whose last, partial vector runs under
        a mask after its whole vectors: of a symbolic kernel's trips, or of a constant
        count of more than one vector that whole vectors do not make (see
        :meth:`loop_metadata`)."""
        if not (self.avx512 and s.vector > 1 and s.step == 1):
            return False
        trips = _trips(s)
        if trips is None:
            return _sized(s)
        vector = _fit_to_trip_count(s).vector
        return trips > vector and trips % vector != 0

    def split_tail(self, s: For, scope: _Scope, b: ir.IRBuilder) -> None:
        """A vector loop as two: the whole vectors (times the interleave count, or, for a
        constant count, all of them) unmasked, then what is left, under a mask. LLVM's
        masked loop masks every vector, not the last alone (a softmax over symbolic rows
        of 256: 1.4x the time of unmasked vectors)."""
        emitter = self.exprs(scope)
        trips = _trips(s)
        if trips is not None:
            # whole vectors, their interleave count fitted to their number, then the
            # last, partial one: a register block of 58 columns ran its last 10 one at a
            # time, 3 vectors interleaved and 40 scalar FMAs per step (benchmarks/LOG.md)
            whole = Literal(int(s.lo.value) + trips // s.vector * s.vector, s.lo.dtype)  # type: ignore[union-attr]
            self.loop(replace(s, hi=whole), scope, b, masked=False)
            self.loop(replace(s, lo=whole, unroll=1), scope, b, masked=True)
            return
        lo, hi = emitter.emit(s.lo, b), emitter.emit(s.hi, b)
        chunk = ir.Constant(I64, s.vector * s.unroll)
        span = b.call(emitter.intrinsic("llvm.smax", I64, 2), [b.sub(hi, lo), ir.Constant(I64, 0)])
        whole = b.add(lo, b.mul(b.sdiv(span, chunk), chunk))
        self.loop(s, scope, b, lo, whole, masked=False)
        self.loop(replace(s, unroll=1), scope, b, whole, hi, masked=True)

    def loop(self, s: For, scope: _Scope, b: ir.IRBuilder, lo: ir.Value | None = None,
             hi: ir.Value | None = None, masked: bool | None = None) -> None:
        """``s`` from ``lo`` to ``hi`` (its own bounds where not given); ``masked``: its
        vectors under a mask, or not, where the caller decides (:meth:`split_tail`)."""
        emitter = self.exprs(scope)
        lo = lo if lo is not None else emitter.emit(s.lo, b)
        hi = hi if hi is not None else emitter.emit(s.hi, b)
        if s.vector > 1:
            self.prefetch_packed(s, lo, scope, b)
        pre = b.block
        header = b.append_basic_block(f"{s.var}.header")
        body = b.append_basic_block(f"{s.var}.body")
        exit_ = b.append_basic_block(f"{s.var}.exit")
        b.branch(header)
        b.position_at_end(header)
        iv = b.phi(I64, name=s.var)
        iv.add_incoming(lo, pre)
        b.cbranch(b.icmp_signed("<", iv, hi), body, exit_)
        b.position_at_end(body)
        inner = _Scope(scope.buffers, {**scope.values, s.var: iv}, scope.locals)
        for at, p in self.spreading.pop(s.var, []):
            self.prefetch_spread(at, p, iv, b)
        panels = [p for p in panel_prefetches(s, tuple(self.enclosing), self.kernel)
                  if p.tensor not in self.spread]
        self.prefetch_panels(s, iv, panels, inner, b)
        added = {p.tensor for p in panels}
        self.enclosing.append(s)
        self.spread |= added
        self.body(s.body, inner, b)
        for p in panels:   # (a reduction loop the body did not emit as a loop streams nothing)
            if p.over is not None:
                self.spreading.pop(p.over.var, None)
        self.spread -= added
        self.enclosing.pop()
        nxt = b.add(iv, ir.Constant(I64, s.step), flags=["nsw"])
        iv.add_incoming(nxt, b.block)
        latch = b.branch(header)
        latch.set_metadata("llvm.loop", self.loop_metadata(s, masked))
        b.position_at_end(exit_)

    def prefetch_panels(self, s: For, iv: ir.Value, panels: list[PanelPrefetch], scope: _Scope,
                        b: ir.IRBuilder) -> None:
        """At the start of each pass of ``s``: its slice of the next panel of each of
        ``panels`` (:mod:`.panel_prefetch`), into L2."""
        if not panels:
            return
        fn = self.prefetch_intrinsic()
        index = _trip(iv, int(s.lo.value), s.step, b)  # type: ignore[attr-defined]
        for p in panels:   # (the last panel's next lies past the buffer: a hint, no fault)
            at = b.bitcast(self.address(p.first, scope, b, inbounds=False), _I8P)
            at = b.gep(at, [b.mul(index, ir.Constant(I64, p.lines * LINE))])
            if p.over is not None:   # spread over the reduction loop's iterations
                self.spreading.setdefault(p.over.var, []).append((at, p))
                continue
            for line in range(p.lines):
                b.call(fn, [b.gep(at, [ir.Constant(I64, line * LINE)]), *_INTO_L2])

    def prefetch_spread(self, at: ir.Value, p: PanelPrefetch, iv: ir.Value, b: ir.IRBuilder) -> None:
        """In iteration ``j`` of ``p.over``: line ``j * lines / trips`` of the pass's slice
        at ``at``, so the slice's lines stream evenly through the pass. A loop of fewer
        iterations than the slice has lines touches every ``lines / trips``-th line, and the
        hardware's stream prefetcher fills in the rest (prefetching all of them ran slower:
        benchmarks/LOG.md)."""
        assert p.over is not None
        j = _trip(iv, p.over.lo, p.over.step, b)
        line = b.sdiv(b.mul(j, ir.Constant(I64, p.lines)), ir.Constant(I64, p.over.trips))
        b.call(self.prefetch_intrinsic(), [b.gep(at, [b.mul(line, ir.Constant(I64, LINE))]), *_INTO_L2])

    def prefetch_intrinsic(self) -> ir.Function:
        return self.module.globals.get(PREFETCH) or ir.Function(
            self.module, ir.FunctionType(ir.VoidType(), [_I8P, _I32, _I32, _I32]), PREFETCH)

    def prefetch_packed(self, s: For, lo: ir.Value, scope: _Scope, b: ir.IRBuilder) -> None:
        """Before vector loop ``s``: a prefetch into L2 of :data:`PREFETCH_BYTES` at
        :data:`PREFETCH_AHEAD` bytes past the first element ``s`` reads of each buffer
        packed at compile time (its row of a panel: the rows a micro-kernel reads next lie ahead of it).
        A prefetch is a hint that cannot fault, so one past a buffer's end is harmless;
        reads with checked indices are left alone."""
        reads: dict[str, Read] = {}
        for st in s.body:
            for r in stmt_nodes(st):
                if isinstance(r, Read) and r.tensor not in reads and r.tensor not in self.spread and \
                        self.kernel.buffer(r.tensor).packing is not None and \
                        not any(r.is_checked(d) for d in range(len(r.indices))):
                    reads[r.tensor] = r
        if not reads:
            return
        first = _Scope(scope.buffers, {**scope.values, s.var: lo}, scope.locals)
        fn = self.prefetch_intrinsic()
        for r in reads.values():
            at = b.bitcast(self.address(r, first, b), _I8P)
            for line in range(0, PREFETCH_BYTES, LINE):
                b.call(fn, [b.gep(at, [ir.Constant(I64, PREFETCH_AHEAD + line)]), *_INTO_L2])

    def loop_metadata(self, s: For, masked: bool | None = None) -> ir.MDValue:
        self.n_loops += 1
        props = [ir.MetaDataString(self.module, f"polyfuse.loop.{self.n_loops}")]
        m = self.module
        s = _fit_to_trip_count(s, masked=bool(masked))
        if s.vector > 1 and _calls_libm(s, self.scalable):   # asking would only print "loop not vectorized"
            s = For(s.var, s.lo, s.hi, s.body, s.kind, s.step, 1, s.unroll)
        if s.vector > 1:
            props.append(m.add_metadata([ir.MetaDataString(m, "llvm.loop.vectorize.enable"), ir.Constant(I1, 1)]))
            props.append(m.add_metadata([ir.MetaDataString(m, "llvm.loop.vectorize.width"), ir.Constant(ir.IntType(32), s.vector)]))
            if self.scalable:
                props.append(m.add_metadata([ir.MetaDataString(m, "llvm.loop.vectorize.scalable.enable"), ir.Constant(I1, 1)]))
            # always given: left out, LLVM chooses a count of its own, which may leave
            # the last vectors to a scalar loop
            props.append(m.add_metadata([ir.MetaDataString(m, "llvm.loop.interleave.count"), ir.Constant(ir.IntType(32), s.unroll)]))
            if masked is None:   # (a loop split_tail did not split: a constant count, or a step)
                masked = self.avx512 and (_trips(s) is None and _sized(s) or bool((_trips(s) or 0) % s.vector))
            if masked:
                # the last, partial vector under a mask instead of a scalar loop (an exp
                # over 49 elements: 89 cycles per vector's worth scalar, 13 masked), and
                # so where the trips are a symbolic kernel's: any number may leave one
                # (a softmax over 77 columns of a symbolic row 2.7x slower than masked)
                props.append(m.add_metadata([ir.MetaDataString(m, "llvm.loop.vectorize.predicate.enable"), ir.Constant(I1, 1)]))
        elif s.unroll > 1:
            props.append(m.add_metadata([ir.MetaDataString(m, "llvm.loop.unroll.count"), ir.Constant(ir.IntType(32), s.unroll)]))
        else:
            props.append(m.add_metadata([ir.MetaDataString(m, "llvm.loop.vectorize.width"), ir.Constant(ir.IntType(32), 1)]))
        return m.add_metadata(props)

    # --- parallel loops ---
    def parallel(self, s: For, scope: _Scope, b: ir.IRBuilder) -> None:
        """Outline the loop into a body function and hand it to the thread pool."""
        self.n_parallel += 1
        name = f"{self.kernel.name}.par{self.n_parallel}"
        used = _free_values(s, scope, self.kernel)
        bufs = [buf for buf in self.kernel.parameters if buf.name in scope.buffers]
        # the function with noalias buffers that runs iterations [begin, end) of the loop
        ptypes = [scope.buffers[x.name].type for x in bufs] + [scope.values[v].type for v in used]
        work = ir.Function(self.module, ir.FunctionType(ir.VoidType(), ptypes + [I64, I64]), name)
        work.linkage = "internal"
        for a, buf in zip(work.args, bufs):
            _pointer_attributes(a, buf)
        wb = ir.IRBuilder(work.append_basic_block("entry"))
        inner = _Scope({x.name: a for x, a in zip(bufs, work.args)}
                       | _local_buffers(self.kernel, s.body, wb),
                       {v: a for v, a in zip(used, work.args[len(bufs):])},
                       _allocas(s.body, wb))
        begin, end = work.args[-2], work.args[-1]
        emitter = self.exprs(inner)
        lo = emitter.emit(s.lo, wb)
        step = ir.Constant(I64, s.step)
        it_lo = wb.add(lo, wb.mul(begin, step))
        it_hi = wb.call(emitter.intrinsic("llvm.smin", I64, 2),
                        [emitter.emit(s.hi, wb), wb.add(lo, wb.mul(end, step))])
        self.loop(For(s.var, s.lo, s.hi, s.body, LoopKind.SERIAL, s.step, s.vector, s.unroll),
                  inner, wb, it_lo, it_hi)
        wb.ret_void()
        # the trampoline the thread pool calls: unpack the context, call the work function
        ctx_type = ir.LiteralStructType(ptypes)
        tramp = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [I64, I64, _I8P]), name + ".task")
        tramp.linkage = "internal"
        tb = ir.IRBuilder(tramp.append_basic_block("entry"))
        ctx = tb.bitcast(tramp.args[2], ctx_type.as_pointer())
        fields = [tb.load(tb.gep(ctx, [ir.Constant(ir.IntType(32), 0), ir.Constant(ir.IntType(32), j)]))
                  for j in range(len(ptypes))]
        tb.call(work, fields + [tramp.args[0], tramp.args[1]])
        tb.ret_void()
        # the call site: pack the context, compute the trip count, run on the pool
        slot = b.alloca(ctx_type)
        for j, v in enumerate([scope.buffers[x.name] for x in bufs] + [scope.values[u] for u in used]):
            b.store(v, b.gep(slot, [ir.Constant(ir.IntType(32), 0), ir.Constant(ir.IntType(32), j)]))
        emitter = self.exprs(scope)
        lo, hi = emitter.emit(s.lo, b), emitter.emit(s.hi, b)
        span = b.sub(hi, lo)
        trips = b.sdiv(b.add(span, ir.Constant(I64, s.step - 1)), ir.Constant(I64, s.step))
        trips = b.select(b.icmp_signed(">", trips, ir.Constant(I64, 0)), trips, ir.Constant(I64, 0))
        pfor = self.module.globals.get(PARALLEL_FOR) or ir.Function(
            self.module, ir.FunctionType(ir.VoidType(), [tramp.type, I64, _I8P, I64]), PARALLEL_FOR)
        b.call(pfor, [tramp, trips, b.bitcast(slot, _I8P), ir.Constant(I64, self.num_threads)])


def _calls_libm(s: For, scalable: bool) -> bool:
    found: list[Call] = []

    def visit(e: Expr) -> Expr:
        if isinstance(e, Call) and calls_libm(e, scalable=scalable):
            found.append(e)
        return e
    map_body_exprs(s.body, visit)
    return bool(found)


def _trips(s: For) -> int | None:
    """The loop's trip count when its bounds are constants."""
    if not (isinstance(s.lo, Literal) and isinstance(s.hi, Literal)):
        return None
    return max(0, -(-(int(s.hi.value) - int(s.lo.value)) // s.step))


def _fit_to_trip_count(s: For, masked: bool = False) -> For:
    """The loop with its vector width and interleave count cut to a constant trip count
    (a width LLVM cannot fill is a transformation it reports as failed). Where the trip
    count is whole vectors, the interleave count divides their number: LLVM runs what
    is left after the interleaved vectors one element at a time (144 channels, 9
    vectors, interleaved by 2: the last 16 elements scalar, several times slower for an
    exp: benchmarks/LOG.md)."""
    trips = _trips(s)
    if trips is None or s.vector <= 1:
        return s
    vector = s.vector
    while vector > 1 and vector > trips and not masked:
        vector //= 2
    if not masked and trips % vector and vector >= 8 and trips % (vector // 2) == 0 \
            and trips // (vector // 2) <= s.unroll:
        # a register block's row of whole half vectors, as many as it interleaves: those,
        # unmasked, in one pass, rather than whole vectors and a masked one, which keeps
        # the block's accumulators in memory (MobileNetV3-S's partial block of 24
        # channels: its depthwise 3x3 45.8 -> 12.1 us; benchmarks/LOG.md)
        vector //= 2
    vectors, rest = divmod(trips, max(vector, 1))
    unroll = max(1, min(s.unroll, vectors))
    if not rest:
        unroll = max(u for u in range(1, unroll + 1) if vectors % u == 0)
    return For(s.var, s.lo, s.hi, s.body, s.kind, s.step, vector, unroll)


def _sized(s: For) -> bool:
    """Whether a loop's bounds read a symbolic kernel's sizes (its int scalars)."""
    return any(isinstance(n, ScalarRef) and n.dtype.is_int for e in (s.lo, s.hi) for n in walk(e))


def _trip(iv: ir.Value, lo: int, step: int, b: ir.IRBuilder) -> ir.Value:
    """Which iteration of a loop from ``lo`` by ``step`` its index ``iv`` is."""
    return b.sdiv(b.sub(iv, ir.Constant(I64, lo)), ir.Constant(I64, step))


def _allocas(body: tuple[Stmt, ...], b: ir.IRBuilder) -> dict[str, ir.Value]:
    """One stack slot per local assigned in ``body``, made up front in the entry block
    (mem2reg turns them into registers)."""
    slots: dict[str, ir.Value] = {}
    for st in walk_stmts(body):
        if isinstance(st, Assign) and st.var not in slots:
            slots[st.var] = b.alloca(register_type(st.value.dtype), name=st.var)
    return slots


def _local_buffers(k: LoopKernel, body: tuple[Stmt, ...], b: ir.IRBuilder) -> dict[str, ir.Value]:
    """A stack array per local buffer that ``body`` uses outside its parallel loops (whose
    work functions, one call per thread's chunk, make their own), made in the entry block."""
    local = {x.name: x for x in k.buffers if x.role is BufferRole.LOCAL}
    if not local:
        return {}
    used: set[str] = set()
    for st in walk_stmts(body, into=lambda s: not (isinstance(s, For) and s.kind is LoopKind.PARALLEL)):
        used |= {n.tensor for n in stmt_nodes(st) if isinstance(n, Read)}
        if isinstance(st, Store):
            used.add(st.buffer)
    slots: dict[str, ir.Value] = {}
    for name in sorted(used & set(local)):
        buf = local[name]
        size = 1
        for extent in buf.shape:
            size *= extent
        slot = b.alloca(storage_type(buf.dtype), size=ir.Constant(I64, size), name=name)
        slot.align = buf.alignment
        slots[name] = slot
    return slots


def _pointer_attributes(arg: ir.Argument, buf: Buffer) -> None:
    """Buffers never overlap; outputs come from the runtime's aligned allocator."""
    arg.add_attribute("noalias")
    if buf.role is BufferRole.OUT:
        arg.attributes.align = buf.alignment


def _free_values(s: For, scope: _Scope, kernel: LoopKernel) -> list[str]:
    """Register values (enclosing iterators, scalars) the loop uses, in its statements or
    in the extents of the buffers they address (a symbolic kernel's sizes)."""
    names = {n.name for st in walk_stmts((s,)) for n in stmt_nodes(st) if isinstance(n, (IndexVar, ScalarRef))}
    names |= {n.name for b in kernel.buffers for e in b.shape if not isinstance(e, int)
              for n in walk(e) if isinstance(n, ScalarRef)}
    return [v for v in scope.values if v in names]


def _to_register(raw: ir.Value, dt: DType, b: ir.IRBuilder) -> ir.Value:
    if dt.is_bool:
        return b.icmp_signed("!=", raw, ir.Constant(I8, 0))
    if dt.is_unsigned and dt is not DType.UINT64:
        return b.zext(raw, I64)
    if dt.is_int:
        return raw if dt is DType.INT64 else b.sext(raw, I64)
    if dt is DType.FLOAT16:
        return b.fpext(raw, F32)
    if dt is DType.BFLOAT16:
        return bf16_to_f32(raw, b)
    return raw


def _to_storage(value: ir.Value, dt: DType, b: ir.IRBuilder) -> ir.Value:
    if dt.is_bool:
        return b.zext(value, I8)
    if dt.is_int:
        return value if dt is DType.INT64 else b.trunc(value, storage_type(dt))
    if dt is DType.FLOAT16:
        return b.fptrunc(value, F16)
    if dt is DType.BFLOAT16:
        return f32_to_bf16(value, b)
    return value


def emit_module(kernel: LoopKernel, triple: str, data_layout: str, num_threads: int = 0,
                scalable: bool = False, avx512: bool = False,
                native: Mapping[str, Isa] = MappingProxyType({}),
                tiles: frozenset[str] = frozenset()) -> str:
    """The LLVM IR text of ``kernel``; loop metadata nodes refer to themselves.
    ``scalable``: vector loops use scalable vectors (for SVE); ``avx512``: a vector
    loop of a constant trip count that is not whole vectors ends in a masked vector,
    not a scalar loop, and math functions scale by powers of two with ``llvm.ldexp``
    (one ``vscalefps``); ``native``: the dot products (``dot4``, ``bfdot2``) that
    become the target's instructions, and which (see :mod:`.llvm_dot`); ``tiles``: those whose tile
    products run on matrix tiles (see :mod:`.llvm_tiles`)."""
    module = ir.Module(name=kernel.name)
    module.triple = triple
    module.data_layout = data_layout
    KernelEmitter(kernel, module, num_threads, scalable, avx512, frozenset(native), tiles).emit()
    return declare_variants(_self_reference_loops(str(module)), native)


def _self_reference_loops(text: str) -> str:
    """llvmlite cannot build self-referencing nodes; patch ``!"polyfuse.loop.N"`` to the node's id."""
    out = []
    for line in text.splitlines():
        m = re.match(r'^(!\d+) = !\{\s*!"polyfuse\.loop\.\d+"(.*)$', line)
        if m:
            line = f"{m.group(1)} = distinct !{{{m.group(1)}{m.group(2)}"
        out.append(line)
    return "\n".join(out) + "\n"
