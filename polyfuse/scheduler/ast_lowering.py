"""isl AST -> loop IR.

Each AST user node is an instance of an isl statement; its call arguments give the
original indices as expressions of the loop iterators. An init statement stores the
reduction identity; a main statement stores ``combine(old, value)``. ``parallel``
marks become parallel loops; the innermost loops get the vector width and unroll
factor of the options.
"""

from __future__ import annotations

from dataclasses import replace

import islpy as isl

from polyfuse.errors import ScheduleError
from polyfuse.ir.comprehension import (Binary, BinaryOp, Call, Cast, Expr, IndexVar, Literal, Read, ReduceOp,
                                       ScalarDecl, ScalarRef, Select, SizeVar, combine, map_expr, walk)
from polyfuse.ir.comprehension_interpreter import identity
from polyfuse.ir.loops import (ERROR_BUFFER, Buffer, BufferRole, For, If, LoopKernel, LoopKind,
                               Stmt, Store, fold_stmts, map_kernel_exprs, map_loops, rewrite, walk_stmts,
                               widen_ints)
from polyfuse.ir.symbolic import evaluate_int
from polyfuse.ir.types import DType
from polyfuse.scheduler.model import Model
from polyfuse.scheduler.options import MappingOptions
from polyfuse.scheduler.schedule import GPU_BLOCK_MARK, GPU_THREAD_MARK, PARALLEL_MARK

_I64 = DType.INT64


def _int(v: int) -> Literal:
    return Literal(v, DType.INT32 if -2**31 <= v < 2**31 else DType.INT64)


def _fold(op: BinaryOp, a: Expr, b: Expr) -> Expr:
    """Constant-fold and simplify integer index arithmetic from the AST."""
    if isinstance(a, Literal) and isinstance(b, Literal) and op in _FOLD:
        return _int(_FOLD[op](int(a.value), int(b.value)))
    if op in (BinaryOp.ADD, BinaryOp.SUB) and isinstance(b, Literal) and b.value == 0:
        return a
    if op is BinaryOp.ADD and isinstance(a, Literal) and a.value == 0:
        return b
    if op is BinaryOp.MUL and isinstance(b, Literal) and b.value == 1:
        return a
    if op is BinaryOp.MUL and isinstance(a, Literal) and a.value == 1:
        return b
    dt = DType.BOOL if op.is_comparison or op.is_logical else _I64
    return Binary(op, a, b, dt)


def _quotient(x: int, y: int) -> int:
    """C's integer division, which truncates: what `/` means in the IR."""
    return abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)


# isl's pdiv_q, div, pdiv_r and zdiv_r (compared with 0) agree with C's truncating `/`
# and `%`; only fdiv_q (floord) may see a negative dividend: it becomes floordiv
_FOLD = {BinaryOp.ADD: lambda x, y: x + y, BinaryOp.SUB: lambda x, y: x - y,
         BinaryOp.MUL: lambda x, y: x * y, BinaryOp.DIV: _quotient,
         BinaryOp.MOD: lambda x, y: x - y * _quotient(x, y)}

_OPS = {
    isl.ast_expr_op_type.add: BinaryOp.ADD, isl.ast_expr_op_type.sub: BinaryOp.SUB,
    isl.ast_expr_op_type.mul: BinaryOp.MUL,
    isl.ast_expr_op_type.pdiv_q: BinaryOp.DIV, isl.ast_expr_op_type.div: BinaryOp.DIV,
    isl.ast_expr_op_type.pdiv_r: BinaryOp.MOD, isl.ast_expr_op_type.zdiv_r: BinaryOp.MOD,
    isl.ast_expr_op_type.lt: BinaryOp.LT, isl.ast_expr_op_type.le: BinaryOp.LE,
    isl.ast_expr_op_type.gt: BinaryOp.GT, isl.ast_expr_op_type.ge: BinaryOp.GE,
    isl.ast_expr_op_type.eq: BinaryOp.EQ, isl.ast_expr_op_type.and_: BinaryOp.AND,
    isl.ast_expr_op_type.and_then: BinaryOp.AND, isl.ast_expr_op_type.or_: BinaryOp.OR,
    isl.ast_expr_op_type.or_else: BinaryOp.OR,
}


class _Lowering:
    def __init__(self, model: Model, schedule: isl.Schedule, sizes: dict[str, int],
                 options: MappingOptions, symbolic: frozenset[str] = frozenset()) -> None:
        self.model = model
        self.schedule = schedule
        self.sizes = sizes
        self.options = options
        self.symbolic = symbolic

    def size(self, name: str) -> Expr:
        """A size: its value, or in a kernel for symbolic sizes the scalar that holds it."""
        return ScalarRef(name, _I64) if name in self.symbolic else _int(self.sizes[name])

    def expr(self, e: isl.AstExpr) -> Expr:
        kind = e.get_type()
        if kind == isl.ast_expr_type.int:
            return _int(int(e.get_val().to_python()))
        if kind == isl.ast_expr_type.id:
            name = e.get_id().get_name()
            if name.startswith("s_") and (name[2:] in self.sizes or name[2:] in self.symbolic):
                return self.size(name[2:])
            return IndexVar(name)
        op = e.get_op_type()
        args = [self.expr(e.get_op_arg(k)) for k in range(e.get_op_n_arg())]
        if op == isl.ast_expr_op_type.minus:
            return _fold(BinaryOp.SUB, _int(0), args[0])
        if op in (isl.ast_expr_op_type.min, isl.ast_expr_op_type.max):
            fn = "min" if op == isl.ast_expr_op_type.min else "max"
            out = args[0]
            for a in args[1:]:
                out = Call(fn, (out, a), _I64)
            return out
        if op in (isl.ast_expr_op_type.select, isl.ast_expr_op_type.cond):
            return Select(args[0], args[1], args[2], _I64)
        if op == isl.ast_expr_op_type.fdiv_q:
            a, b = args
            if isinstance(a, Literal) and isinstance(b, Literal):
                return _int(int(a.value) // int(b.value))
            return Call("floordiv", (a, b), _I64)
        if op in _OPS:
            return _fold(_OPS[op], args[0], args[1])
        raise ScheduleError(f"unsupported isl AST operation {op}")

    def node(self, n: isl.AstNode) -> list[Stmt]:
        kind = n.get_type()
        if kind == isl.ast_node_type.block:
            children = n.block_get_children()
            return [s for k in range(children.n_ast_node()) for s in self.node(children.get_at(k))]
        if kind == isl.ast_node_type.mark:
            body = self.node(n.mark_get_node())
            mark = n.mark_get_id().get_name()
            if mark.startswith(PARALLEL_MARK + ":"):
                loops = {s.var for s in walk_stmts(tuple(body)) if isinstance(s, For)}
                present = [f"c{d}" for d in mark.split(":")[1].split(",") if f"c{d}" in loops]
                if not present or _work(tuple(body)) < PARALLEL_MIN_WORK:
                    return body  # waking the thread pool costs more than it saves
                out = _parallelize(tuple(body), present[0])
                if len(present) > 1 and _symbolic_trips(out, present[0]):
                    # a symbolic extent may be 1 (a batch of one): the next member is
                    # parallel too; the pool runs a region inside another's iterations
                    # in place, and a region of one iteration in place with nothing
                    # around it, so the threads split whichever has the iterations
                    out = _parallelize(out, present[1])
                return list(out)
            kind = _GPU_MARKS.get(mark.split(":")[0])
            if kind is not None:
                dims = {f"c{d}" for d in mark.split(":")[1].split(",")}
                return list(_set_kind(tuple(body), dims, kind))
            return body
        if kind == isl.ast_node_type.for_:
            return [self.loop(n)]
        if kind == isl.ast_node_type.if_:
            then = tuple(self.node(n.if_get_then_node()))
            other = tuple(self.node(n.if_get_else_node())) if n.if_has_else_node() else ()
            return [If(self.expr(n.if_get_cond()), then, other)]
        if kind == isl.ast_node_type.user:
            return [self.user(n.user_get_expr())]
        raise ScheduleError(f"unsupported isl AST node {kind}")

    def loop(self, n: isl.AstNode) -> For:
        var = n.for_get_iterator().get_id().get_name()
        step = int(n.for_get_inc().get_val().to_python())
        cond = n.for_get_cond()
        op = cond.get_op_type()
        bound = self.expr(cond.get_op_arg(1))
        if op == isl.ast_expr_op_type.le:
            hi = _fold(BinaryOp.ADD, bound, _int(1))
        elif op == isl.ast_expr_op_type.lt:
            hi = bound
        else:
            raise ScheduleError(f"unsupported loop condition {cond.to_C_str()}")
        return For(var, self.expr(n.for_get_init()), hi, tuple(self.node(n.for_get_body())),
                   step=step)

    def user(self, call: isl.AstExpr) -> Stmt:
        name = call.get_op_arg(0).get_id().get_name()
        info = self.model.statements[name]
        values = {it: self.expr(call.get_op_arg(k + 1)) for k, it in enumerate(info.iterators)}
        st = info.statement

        def substitute(e: Expr) -> Expr:
            if isinstance(e, IndexVar):
                return values[e.name]
            if isinstance(e, SizeVar):
                if e.name in self.symbolic:   # typed as the definition typed it
                    return Cast(DType.INT32, ScalarRef(e.name, _I64))
                return Literal(self.sizes[e.name], DType.INT32)
            return e

        lhs = tuple(values[i] for i in st.indices)
        dtype = self.model.definition.tensor(st.tensor).dtype
        if info.init:
            return Store(st.tensor, lhs, Literal(identity(st.op, dtype), dtype))
        value = map_expr(st.rhs, substitute)
        if st.op is not ReduceOp.ASSIGN:
            old = Read(st.tensor, lhs, dtype)
            value = combine(st.op, old, value, dtype)
        return Store(st.tensor, lhs, value)


UNKNOWN_TRIPS = 1 << 20      # a loop's trips where its bounds are no constants: taken as big
PARALLEL_MIN_WORK = 1 << 17  # statement instances below which a loop nest runs serially
                            # (waking a second thread costs ~10 us, 1 << 17 instances take ~10 us)


def _work(body: tuple[Stmt, ...]) -> int:
    """Statement instances of a loop nest, taking each loop at its largest trip count."""
    def work(s: Stmt, inner: tuple[list[int], ...]) -> int:
        if isinstance(s, For):
            return _trips(s) * max(1, sum(inner[0]))
        if isinstance(s, If):
            return max(sum(inner[0]), sum(inner[1]))
        return 1
    return sum(fold_stmts(body, work))


def _trips(loop: For) -> int:
    def bound(e: Expr) -> int | None:
        if isinstance(e, Literal):
            return int(e.value)
        if isinstance(e, Call) and e.fn == "min":
            known = [b for b in map(bound, e.args) if b is not None]
            return min(known) if known else None
        if isinstance(e, Binary) and e.op is BinaryOp.ADD:
            a, b = bound(e.lhs), bound(e.rhs)
            return a + b if a is not None and b is not None else None
        return None
    lo, hi = bound(loop.lo), bound(loop.hi)
    if hi is None:
        return UNKNOWN_TRIPS
    return max(0, (hi - (lo or 0) + loop.step - 1) // loop.step)


def _symbolic_trips(body: tuple[Stmt, ...], var: str) -> bool:
    """Whether the first loop over ``var`` in ``body`` has trips no constant bounds."""
    loop = next((s for s in walk_stmts(body) if isinstance(s, For) and s.var == var), None)
    return loop is not None and _trips(loop) == UNKNOWN_TRIPS


def _parallelize(body: tuple[Stmt, ...], var: str) -> tuple[Stmt, ...]:
    """Make the outermost loops over ``var`` parallel."""
    return rewrite(body, pre=lambda s: replace(s, kind=LoopKind.PARALLEL)
                   if isinstance(s, For) and s.var == var else None)


_GPU_MARKS = {GPU_BLOCK_MARK: LoopKind.BLOCK, GPU_THREAD_MARK: LoopKind.THREAD}


def _set_kind(body: tuple[Stmt, ...], names: set[str], kind: LoopKind) -> tuple[Stmt, ...]:
    """Give every loop over one of ``names`` the kind ``kind``."""
    return map_loops(body, lambda s: replace(s, kind=kind) if s.var in names else s)


def _annotate_innermost(body: tuple[Stmt, ...], options: MappingOptions) -> tuple[Stmt, ...]:
    return map_loops(body, lambda s: s if any(isinstance(c, (For, If)) for c in s.body)
                     else replace(s, vector=options.vector_width, unroll=options.unroll))


def lower_schedule(model: Model, schedule: isl.Schedule, sizes: dict[str, int],
                   options: MappingOptions, symbolic: frozenset[str] = frozenset()) -> LoopKernel:
    """The loop kernel that runs ``schedule`` for the given sizes. Sizes named in
    ``symbolic`` stay unknown: the kernel takes each as an int64 scalar of its name
    (after the definition's own scalars), and its loop bounds and buffer extents are
    expressions of them, so it runs at any value of those sizes."""
    fixed = {n: v for n, v in sizes.items() if n not in symbolic}
    build = isl.AstBuild.from_context(model.context(fixed, symbolic))
    ast = build.node_from_schedule(schedule)
    lowering = _Lowering(model, schedule, fixed, options, symbolic)
    body = _annotate_innermost(tuple(lowering.node(ast)), options)
    d = model.definition
    buffers = tuple(
        Buffer(t.name, t.dtype, tuple(_extent(s, lowering) for s in t.shape), role)
        for ts, role in ((d.inputs, BufferRole.IN), (d.outputs, BufferRole.OUT)) for t in ts)
    if any(r.is_checked(k) for st in d.statements for r in walk(st.rhs) if isinstance(r, Read)
           for k in range(len(r.indices))):
        buffers += (Buffer(ERROR_BUFFER, DType.INT64, (1,), BufferRole.INOUT),)
    scalars = d.scalars + tuple(ScalarDecl(n, _I64) for n in sorted(symbolic))
    return map_kernel_exprs(LoopKernel(d.name, buffers, scalars, body), widen_ints)


def _extent(e: Expr, lowering: _Lowering) -> int | Expr:
    """A tensor's extent: its value, or an int64 expression of the symbolic sizes."""
    if not {n.name for n in walk(e) if isinstance(n, SizeVar)} & lowering.symbolic:
        return evaluate_int(e, lowering.sizes)
    return widen_ints(map_expr(e, lambda x: lowering.size(x.name) if isinstance(x, SizeVar) else x))
