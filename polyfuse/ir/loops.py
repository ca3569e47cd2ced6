"""Loop IR: where every target starts.

A :class:`LoopKernel` is a list of buffers (each marked in, out, inout or temp, with a
dtype, a fixed shape and an alignment; ``local`` buffers, such as packed operand panels,
belong to the kernel, one per thread, and are not arguments; a *packed* input is made from
another input by a :class:`Packing` before the kernel runs; a ``panel`` buffer holds packed
panels, whole vectors wide and zero past the operand's edge), the scalar parameters, and a body of loops,
guards and stores. Loops carry how they should run: serially, on the thread pool
(``parallel``), as SIMD (``vectorize`` with a width) or unrolled (``unroll`` with a
factor). Expressions are comprehension-IR expressions: a :class:`Read` loads from a
buffer, an :class:`IndexVar` names a loop iterator and a :class:`LocalRef` a scalar
local set by :class:`Assign`. Every integer expression is computed in 64 bits
(its nodes are int64) and narrowed only when stored or cast, so index arithmetic
never overflows; int64 literals print bare.

``str(kernel)`` prints the text form, e.g.::

    kernel mm(in float32(64, 32) A, in float32(32, 48) B, out float32(64, 48) C) {
      parallel for c0 in 0:64 {
        for c1 in 0:48 {
          C(c0, c1) = 0.0
        }
      }
    }
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TypeVar, overload

import numpy as np

from polyfuse.errors import IRVerificationError
from polyfuse.ir.builtins import reinterpreted
from polyfuse.ir.comprehension import (Binary, BinaryOp, Call, Cast, Expr, IndexVar, Literal, Read, ScalarDecl,
                                       ScalarRef, Select, SizeVar, Unary, UnaryOp, children, format_expr, map_expr,
                                       walk)
from polyfuse.ir.symbolic import evaluate_int
from polyfuse.ir.types import DType


# A kernel with indirect reads (``E(Idx(b), d)``) gets this int64[1] buffer: targets set
# it to 1 when an index read from a tensor falls outside the dimension it indexes (the
# load then reads element 0), and the runtime turns that into a BoundsError.
ERROR_BUFFER = "polyfuse_error"


class BufferRole(enum.Enum):
    IN = "in"
    OUT = "out"
    INOUT = "inout"
    TEMP = "temp"
    LOCAL = "local"     # private to each thread running the kernel (on its stack); no argument


class LoopKind(enum.Enum):
    """How a loop runs. ``block`` and ``thread`` loops are coincident loops of a GPU
    schedule's tile and point bands: candidates the GPU mapping binds to blocks and
    threads (any loop may also run serially, which is how CPUs and interpreters run them)."""

    SERIAL = "for"
    PARALLEL = "parallel for"
    BLOCK = "block for"
    THREAD = "thread for"


@dataclass(frozen=True, slots=True)
class Packing:
    """An input made from input ``source`` before the kernel runs (BLIS's packed panels of
    a constant operand, made once instead of on every call): element ``i`` of the packed
    buffer is ``source[offsets[d] + sum_a coefs[d][a] * i[a] for each dimension d]``.
    A ``padded`` packing holds zeros where that index falls outside the source (the lanes
    of a last, partial panel past the operand's edge, and boxes of a partial tile there)."""

    source: str
    offsets: tuple[int, ...]              # per dimension of the source
    coefs: tuple[tuple[int, ...], ...]    # per dimension of the source, per packed axis
    padded: bool = False

    def bounds(self, shape: tuple[int, ...]) -> list[tuple[int, int]]:
        """The least and greatest index read in each dimension of the source, packing a
        buffer of ``shape``."""
        out = []
        for off, row in zip(self.offsets, self.coefs):
            ends = [(c * (n - 1), 0) for c, n in zip(row, shape)]
            out.append((off + sum(min(e) for e in ends), off + sum(max(e) for e in ends)))
        return out

    def inside(self, shape: tuple[int, ...], source: tuple[int, ...]) -> bool:
        """Whether packing a buffer of ``shape`` reads only inside a source of shape ``source``."""
        return all(0 <= lo and hi < n for (lo, hi), n in zip(self.bounds(shape), source))

    def apply(self, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """The packed buffer of ``shape`` made from ``array`` (the source's values): an affine
        map of the indices, so a strided view of the source (zero-padded first where the
        packing is ``padded`` and reads past an edge), copied."""
        if not self.padded and not self.inside(shape, array.shape):
            raise IRVerificationError(f"{self} of shape {shape} reads outside its source, of "
                                      f"shape {array.shape}")
        if 0 in shape:
            return np.zeros(shape, array.dtype)
        offsets = list(self.offsets)
        if self.padded:
            pads = [(max(0, -lo), max(0, hi - n + 1)) for (lo, hi), n in zip(self.bounds(shape), array.shape)]
            if any(a or b for a, b in pads):
                array = np.pad(array, pads)
                offsets = [off + lo for off, (lo, _) in zip(offsets, pads)]
        array = np.ascontiguousarray(array)
        steps = [st // array.itemsize for st in array.strides]
        start = sum(off * st for off, st in zip(offsets, steps))
        strides = tuple(array.itemsize * sum(row[a] * st for row, st in zip(self.coefs, steps))
                        for a in range(len(shape)))
        view = np.lib.stride_tricks.as_strided(array.reshape(-1)[start:], shape, strides, writeable=False)
        return np.ascontiguousarray(view)

    def __str__(self) -> str:
        terms = []
        for off, row in zip(self.offsets, self.coefs):
            parts = [f"{c}*p{a}" if c != 1 else f"p{a}" for a, c in enumerate(row) if c]
            terms.append(" + ".join(parts + ([str(off)] if off or not parts else [])))
        return f"pack {self.source}({', '.join(terms)})" + (" padded" if self.padded else "")


Extent = int | Expr
"""An extent of a buffer: a number, or in a kernel compiled for symbolic sizes an int64
expression of its sizes (:class:`ScalarRef` of the kernel's int64 scalars named after
them)."""


def product(a: Extent, b: Extent) -> Extent:
    """``a * b`` folded where both are numbers (or one is 1)."""
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if isinstance(a, int) and a == 1:
        return b
    if isinstance(b, int) and b == 1:
        return a
    x = Literal(a, DType.INT64) if isinstance(a, int) else a
    y = Literal(b, DType.INT64) if isinstance(b, int) else b
    return Binary(BinaryOp.MUL, x, y, DType.INT64)


def shape_at(shape: tuple[Extent, ...], sizes: Mapping[str, object]) -> tuple[int, ...]:
    """``shape`` for the values of the sizes its extents name (a symbolic kernel's)."""
    def size(e: Expr) -> Expr:
        return SizeVar(e.name) if isinstance(e, ScalarRef) else e
    return tuple(n if isinstance(n, int) else evaluate_int(map_expr(n, size), sizes)  # type: ignore[arg-type]
                 for n in shape)


def numbers(shape: tuple[Extent, ...]) -> tuple[int, ...]:
    """A shape whose extents are all numbers, as such (what IRs without symbolic sizes,
    the GPU's, and packed buffers have)."""
    if not all(isinstance(n, int) for n in shape):
        raise IRVerificationError(f"a shape of numbers expected, got ({', '.join(map(str, shape))})")
    return shape  # type: ignore[return-value]


def extent_expr(n: Extent) -> Expr:
    """An extent as an int64 expression."""
    return Literal(n, DType.INT64) if isinstance(n, int) else n


@dataclass(frozen=True, slots=True)
class Buffer:
    name: str
    dtype: DType
    shape: tuple[Extent, ...]   # numbers, or expressions of the sizes (a symbolic kernel's)
    role: BufferRole
    alignment: int = 64
    packing: Packing | None = None     # an input made from another before the kernel runs
    panel: bool = False   # packed panels (operand packing's copies): whole vectors wide, zero past the operand's edge

    @property
    def fixed(self) -> bool:
        """Whether every extent is a number (not an expression of a kernel's sizes)."""
        return all(isinstance(n, int) for n in self.shape)

    @property
    def strides(self) -> tuple[Extent, ...]:
        """Row-major element strides (expressions of the sizes where extents are)."""
        out: list[Extent] = []
        step: Extent = 1
        for extent in reversed(self.shape):
            out.append(step)
            step = product(step, extent)
        return tuple(reversed(out))

    def __str__(self) -> str:
        extents = ", ".join(str(n) if isinstance(n, int) else format_loop_expr(n) for n in self.shape)
        text = f"{self.role.value}{' panel' if self.panel else ''} {self.dtype}({extents}) {self.name}"
        return f"{text} = {self.packing}" if self.packing is not None else text


class Stmt:
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class For(Stmt):
    """``for var in lo:hi step s`` (hi exclusive).

    ``parallel`` loops run their iterations on the thread pool; ``vector`` > 1 asks for
    SIMD code of that width, ``unroll`` > 1 for that many copies of the body.
    """

    var: str
    lo: Expr
    hi: Expr
    body: tuple[Stmt, ...]
    kind: LoopKind = LoopKind.SERIAL
    step: int = 1
    vector: int = 1
    unroll: int = 1


@dataclass(frozen=True, slots=True)
class If(Stmt):
    cond: Expr
    then: tuple[Stmt, ...]
    other: tuple[Stmt, ...] = ()


@dataclass(frozen=True, slots=True)
class Assign(Stmt):
    """Set the scalar local ``var`` (read back as a ``LocalRef``), kept in compute precision."""

    var: str
    value: Expr


@dataclass(frozen=True, slots=True)
class Store(Stmt):
    buffer: str
    indices: tuple[Expr, ...]
    value: Expr


@dataclass(frozen=True, slots=True)
class TileProduct(Stmt):
    """A block of a product summed by a CPU's matrix tiles (AMX's ``tdpbf16ps`` and
    ``tdpbusd``), as TVM's tensorize replaces a loop nest by an intrinsic: ``acc(r, c) +=
    builtin(a(r, k), b(k, c))`` for ``shape = (rows, columns, depth)``, ``a`` and ``b``
    int32 words of the ``builtin`` (``bfdot2``: 2 bfloat16 summed in float32; ``dot4``: 4
    bytes summed in int32). ``acc``, ``a`` and ``b`` are the block's first element of each
    operand; ``steps`` the elements between its rows in ``acc``, its rows in ``a`` and its
    words in ``b`` (``acc``'s columns, ``a``'s words and ``b``'s columns are contiguous).
    ``nest`` is the same product as loops: what the
    interpreter and every target without tiles run.

    On the GPU (in a warp region, :class:`~polyfuse.ir.gpu.Threads`) the builtin names
    the matrix units' product (``mma_tf32``: m16n8k8 on TF32; ``mma_bf16``, ``mma_f16``:
    m16n8k16), ``acc`` is the warp's registers and ``a`` and ``b`` are tiles in shared
    memory, read in any layout: ``nest`` is ``for r in 0:rows { for c in 0:cols { for k in
    0:depth { acc(r, c) = acc(r, c) + x * y }}}`` with ``x`` reading at ``r, k`` and ``y`` at
    ``k, c`` (``tf32(...)`` around each where the product is on TF32), which the code
    generator reads the fragments through (``steps`` is then ``(cols, 0, 0)``: only the
    registers' rows are evenly spaced)."""

    builtin: str
    shape: tuple[int, int, int]
    acc: Read
    a: Read
    b: Read
    steps: tuple[int, int, int]
    nest: tuple[Stmt, ...]

    @property
    def operands(self) -> tuple[Read, Read, Read]:
        return self.acc, self.a, self.b

    def map_exprs(self, fn: Callable[[Expr], Expr]) -> TileProduct:
        acc, a, b = (map_expr(r, fn) for r in self.operands)
        if not (isinstance(acc, Read) and isinstance(a, Read) and isinstance(b, Read)):
            raise IRVerificationError(f"{self.builtin} tile: a mapped operand is no longer a read")
        return replace(self, acc=acc, a=a, b=b, nest=map_body_exprs(self.nest, fn))

    def format_lines(self, indent: str) -> list[str]:
        rows, cols, depth = self.shape
        acc, a, b = (format_loop_expr(r) for r in self.operands)
        head = (f"{indent}tile {self.builtin}({rows}, {cols}, {depth}) {acc} += {a} * {b} "
                f"steps({', '.join(map(str, self.steps))}) {{")
        return [head, *format_body(self.nest, indent + "  "), f"{indent}}}"]


@dataclass(frozen=True, slots=True)
class LoopKernel:
    name: str
    buffers: tuple[Buffer, ...]
    scalars: tuple[ScalarDecl, ...]
    body: tuple[Stmt, ...]

    def buffer(self, name: str) -> Buffer:
        return next(b for b in self.buffers if b.name == name)

    @property
    def parameters(self) -> tuple[Buffer, ...]:
        """The buffers passed in by the caller (all but the local ones), in order."""
        return tuple(b for b in self.buffers if b.role is not BufferRole.LOCAL)

    def __str__(self) -> str:
        return format_kernel(self)


StmtRewrite = Callable[[Stmt], "Stmt | tuple[Stmt, ...] | None"]
"""A rewrite of one statement: a statement or several to put in its place, or None to
keep it."""


@overload
def rewrite(node: LoopKernel, *, pre: StmtRewrite | None = None,
            post: StmtRewrite | None = None) -> LoopKernel: ...


@overload
def rewrite(node: tuple[Stmt, ...], *, pre: StmtRewrite | None = None,
            post: StmtRewrite | None = None) -> tuple[Stmt, ...]: ...


def rewrite(node: LoopKernel | tuple[Stmt, ...], *, pre: StmtRewrite | None = None,
            post: StmtRewrite | None = None) -> LoopKernel | tuple[Stmt, ...]:
    """Rewrite the statements of a kernel or a body, like TVM's ``ir_transform``.

    ``pre`` sees each statement before its children: a result other than None takes its
    place (a tuple splices several, ``()`` drops it) and is not walked further. Otherwise
    the loop body or both branches are rewritten, then ``post`` sees the statement with
    its children rewritten. A statement type defined elsewhere (the GPU IR's) is a leaf.
    The walk recurses once per nesting level, which MAX_NEST_DEPTH bounds.
    """
    if isinstance(node, LoopKernel):
        return replace(node, body=_rewrite_body(node.body, pre, post))
    return _rewrite_body(node, pre, post)


def _rewrite_body(body: tuple[Stmt, ...], pre: StmtRewrite | None,
                  post: StmtRewrite | None) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in body:
        new = pre(s) if pre is not None else None
        if new is None:
            if isinstance(s, For):
                s = replace(s, body=_rewrite_body(s.body, pre, post))
            elif isinstance(s, If):
                s = replace(s, then=_rewrite_body(s.then, pre, post),
                            other=_rewrite_body(s.other, pre, post))
            new = post(s) if post is not None else None
            new = s if new is None else new
        if isinstance(new, tuple):
            out += new
        else:
            out.append(new)
    return tuple(out)


Interval = tuple[int, int]
"""The least and greatest value of an integer, both included."""


@dataclass(frozen=True, slots=True)
class Scope:
    """Where a statement sits: the loops around it (outermost first), the ranges a pass
    narrowed some of them to (as splitting a loop does), and whether a condition guards
    it. :attr:`env` derives the known ranges of the loops' variables when asked."""

    loops: tuple[Stmt, ...] = ()   # For, or another IR's loop (the GPU IR's thread loops)
    narrowed: tuple[tuple[int, Interval], ...] = ()   # (position in loops, its range)
    guarded: bool = False

    @property
    def env(self) -> dict[str, Interval]:
        """The known ranges by variable: each loop's from its bounds over the loops
        outside it (where they are known numbers), or as a pass narrowed it."""
        return self.ranges({})

    def ranges(self, outside: Mapping[str, Interval]) -> dict[str, Interval]:
        """:attr:`env` where the variables of ``outside`` (loops of another IR around the
        scope's, such as the GPU's block loops) have those ranges."""
        narrowed = dict(self.narrowed)
        env: dict[str, Interval] = dict(outside)
        for k, lp in enumerate(self.loops):
            env.update(loop_range(lp, env))
            if k in narrowed:
                env[lp.var] = narrowed[k]  # type: ignore[attr-defined]
        return env

    def inside(self, loop: Stmt) -> Scope:
        """The scope of ``loop``'s body (a :class:`For`, or another IR's statement with
        ``var``, ``lo`` and ``hi``)."""
        return replace(self, loops=self.loops + (loop,))

    def knowing(self, values: Interval) -> Scope:
        """This scope where the innermost loop's variable takes only ``values``."""
        return replace(self, narrowed=self.narrowed + ((len(self.loops) - 1, values),))

    def under_guard(self) -> Scope:
        return replace(self, guarded=True)


def loop_range(loop: Stmt, env: dict[str, Interval]) -> tuple[tuple[str, Interval], ...]:
    """The range of ``loop``'s variable where its bounds' ranges are known over ``env``
    (one pair, or none)."""
    lo, hi = interval(loop.lo, env), interval(loop.hi, env)  # type: ignore[attr-defined]
    return ((loop.var, (lo[0], hi[1] - 1)),) if lo is not None and hi is not None else ()  # type: ignore[attr-defined]


def interval(e: Expr, env: dict[str, Interval]) -> Interval | None:
    """The least and greatest value of the integer expression ``e`` over ``env`` (ranges of
    loop variables), or None where it reads anything else."""
    match e:
        case Literal(value=v) if isinstance(v, int) and not isinstance(v, bool):
            return (v, v)
        case IndexVar(name=n) if n in env:
            return env[n]
        case Unary(op=UnaryOp.NEG) | Binary(op=BinaryOp.ADD | BinaryOp.SUB | BinaryOp.MUL) \
                | Call(fn="min" | "max", args=(_, _)):
            ranges = [interval(x, env) for x in children(e)]
            return None if None in ranges else node_range(e, ranges)  # type: ignore[arg-type]
    return None


def node_range(e: Expr, ranges: list[Interval]) -> Interval | None:
    """The range of ``e`` from its operands' ``ranges`` where ``e`` negates, adds,
    subtracts, multiplies or takes the min or max of two; else None."""
    match e:
        case Unary(op=UnaryOp.NEG):
            return (-ranges[0][1], -ranges[0][0])
        case Binary(op=BinaryOp.ADD):
            return (ranges[0][0] + ranges[1][0], ranges[0][1] + ranges[1][1])
        case Binary(op=BinaryOp.SUB):
            return (ranges[0][0] - ranges[1][1], ranges[0][1] - ranges[1][0])
        case Binary(op=BinaryOp.MUL):
            products = [u * v for u in ranges[0] for v in ranges[1]]
            return (min(products), max(products))
        case Call(fn="min" | "max") if len(ranges) == 2:
            pick = min if e.fn == "min" else max
            return (pick(ranges[0][0], ranges[1][0]), pick(ranges[0][1], ranges[1][1]))
    return None


class LoopRewriter:
    """The loop-IR walker with context, like TVM's ``StmtMutator``: every loop pass that
    needs to know where a statement sits subclasses it. ``body`` rewrites statements in
    order (a statement may become several, or none), ``stmt`` dispatches, and ``loop`` and
    ``branch`` walk into a loop's body (in the loop's scope) and an If's branches (guarded)
    by default; ``nested`` walks into the body of a statement type defined elsewhere
    (the GPU IR's block loops, thread loops and single-thread regions: a thread loop's
    body in its scope); ``leaf`` sees every other statement. Override the ones a pass
    needs and call ``super()`` (or ``body`` with a scope) to walk on."""

    def __call__(self, kernel: LoopKernel) -> LoopKernel:
        return replace(kernel, body=self.body(kernel.body, Scope()))

    def body(self, stmts: tuple[Stmt, ...], scope: Scope) -> tuple[Stmt, ...]:
        out: list[Stmt] = []
        for s in stmts:
            new = self.stmt(s, scope)
            if isinstance(new, tuple):
                out += new
            else:
                out.append(new)
        return tuple(out)

    def stmt(self, s: Stmt, scope: Scope) -> Stmt | tuple[Stmt, ...]:
        if isinstance(s, For):
            return self.loop(s, scope)
        if isinstance(s, If):
            return self.branch(s, scope)
        if _holds_body(s):
            return self.nested(s, scope)
        return self.leaf(s, scope)

    def loop(self, s: For, scope: Scope) -> Stmt | tuple[Stmt, ...]:
        return replace(s, body=self.body(s.body, scope.inside(s)))

    def branch(self, s: If, scope: Scope) -> Stmt | tuple[Stmt, ...]:
        inner = scope.under_guard()
        return replace(s, then=self.body(s.then, inner), other=self.body(s.other, inner))

    def nested(self, s: Stmt, scope: Scope) -> Stmt | tuple[Stmt, ...]:
        return replace(s, body=self.body(s.body, _scope_of_body(s, scope)))  # type: ignore[attr-defined, type-var]

    def leaf(self, s: Stmt, scope: Scope) -> Stmt | tuple[Stmt, ...]:
        return s


def _holds_body(s: Stmt) -> bool:
    """Whether ``s``, a statement of another IR, holds statements (not TileProduct: its
    nest is another form of the statement itself)."""
    return not isinstance(s, TileProduct) and isinstance(getattr(s, "body", None), tuple)


def _scope_of_body(s: Stmt, scope: Scope) -> Scope:
    """The scope of the statements directly inside ``s``: a loop's (another IR's statement
    is one if it has a variable), guarded in an If's branches."""
    if isinstance(s, If):
        return scope.under_guard()
    return scope.inside(s) if isinstance(s, For) or hasattr(s, "var") else scope


def walk_scoped(body: tuple[Stmt, ...], scope: Scope = Scope()) -> Iterator[tuple[Stmt, Scope]]:
    """Every statement of ``body`` with its scope, a loop or If before what it holds (the
    read-only counterpart of :class:`LoopRewriter`, and like it walking into another IR's
    statements that hold a body; a :class:`TileProduct` is a leaf)."""
    for s in body:
        yield s, scope
        for inner in stmt_bodies(s):
            yield from walk_scoped(inner, _scope_of_body(s, scope))


def map_kernel_exprs(kernel: LoopKernel, fn: Callable[[Expr], Expr]) -> LoopKernel:
    """Apply ``map_expr(·, fn)`` to every expression of a kernel."""
    return replace(kernel, body=map_body_exprs(kernel.body, fn))


def map_body_exprs(body: tuple[Stmt, ...], fn: Callable[[Expr], Expr]) -> tuple[Stmt, ...]:
    """Apply ``map_expr(·, fn)`` to every expression of statements."""
    return rewrite(body, post=lambda s: map_stmt_exprs(s, fn))


def map_stmt_exprs(s: Stmt, fn: Callable[[Expr], Expr]) -> Stmt:
    """``s`` with ``map_expr(·, fn)`` applied to its own expressions (a loop's bounds, not
    its body's); a statement type defined elsewhere (the GPU IR's) maps its own, body
    included, through ``map_exprs(fn)``."""
    if isinstance(s, For):
        return replace(s, lo=map_expr(s.lo, fn), hi=map_expr(s.hi, fn))
    if isinstance(s, If):
        return replace(s, cond=map_expr(s.cond, fn))
    if isinstance(s, Store):
        return replace(s, indices=tuple(map_expr(i, fn) for i in s.indices), value=map_expr(s.value, fn))
    if isinstance(s, Assign):
        return replace(s, value=map_expr(s.value, fn))
    return s.map_exprs(fn)  # type: ignore[attr-defined, no-any-return]


def widen_ints(e: Expr) -> Expr:
    """The loop-IR form of an integer node: int64 (casts and reads keep their type), but
    uint64 stays uint64 so targets know to divide, compare and convert it unsigned;
    a cast of a literal becomes the literal.

    What depends on the width keeps its type: a shift, whose operands become values of
    that type (casts narrow wider ones), and a bit reinterpretation (``as_int8``)."""
    if isinstance(e, Cast) and isinstance(e.operand, Literal):
        v = e.operand.value
        return Literal(bool(v) if e.dtype.is_bool else float(v) if e.dtype.is_float else int(v),
                       e.dtype)
    if isinstance(e, Binary) and e.op.is_shift:
        return replace(e, lhs=_narrow(e.lhs, e.dtype), rhs=_narrow(e.rhs, e.dtype))
    if isinstance(e, Call) and reinterpreted(e.fn):
        return e
    wide = (DType.INT64, DType.UINT64)
    if isinstance(e, (Literal, Binary, Select, Call, Unary)) and e.dtype.is_int and e.dtype not in wide:
        return replace(e, dtype=DType.INT64)
    return e


def _narrow(e: Expr, dt: DType) -> Expr:
    if e.dtype is dt:
        return e
    return Literal(int(e.value), dt) if isinstance(e, Literal) else Cast(dt, e)


def map_loops(body: tuple[Stmt, ...], fn: Callable[[For], For]) -> tuple[Stmt, ...]:
    """Apply ``fn`` to every loop of ``body``, innermost first (its body already mapped)."""
    return rewrite(body, post=lambda s: fn(s) if isinstance(s, For) else None)


def constant_trips(loop: For) -> int | None:
    """The iterations of a loop whose bounds are literals (None otherwise)."""
    if not (isinstance(loop.lo, Literal) and isinstance(loop.hi, Literal)):
        return None
    return max(0, -(-(int(loop.hi.value) - int(loop.lo.value)) // loop.step))


def fresh_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base2``, ``base3``, ... if taken; the name returned is taken then."""
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}{k}"
    taken.add(name)
    return name


def stmt_exprs(s: Stmt) -> tuple[Expr, ...]:
    """The expressions of ``s`` itself (a loop's bounds, a condition, a store's indices
    and value, an assignment's value), not of the statements in its body; a statement
    type defined elsewhere (the GPU IR's) gives its own through ``exprs()``."""
    if isinstance(s, For):
        return (s.lo, s.hi)
    if isinstance(s, If):
        return (s.cond,)
    if isinstance(s, Store):
        return (*s.indices, s.value)
    if isinstance(s, Assign):
        return (s.value,)
    if isinstance(s, TileProduct):
        return s.operands
    return s.exprs()  # type: ignore[attr-defined,no-any-return]


def stmt_nodes(s: Stmt) -> Iterator[Expr]:
    """Every expression node of ``s`` itself (:func:`stmt_exprs`)."""
    for e in stmt_exprs(s):
        yield from walk(e)


def stmt_bodies(s: Stmt) -> tuple[tuple[Stmt, ...], ...]:
    """The statement lists directly inside ``s``: a loop's body, an If's two branches, or
    the body of another IR's statement that holds one (not a :class:`TileProduct`'s nest,
    which is another form of the statement itself)."""
    if isinstance(s, For):
        return (s.body,)
    if isinstance(s, If):
        return (s.then, s.other)
    return (s.body,) if _holds_body(s) else ()  # type: ignore[attr-defined]


def walk_stmts(body: tuple[Stmt, ...], *,
               into: Callable[[Stmt], bool] | None = None) -> Iterator[Stmt]:
    """Every statement of ``body``, each before the statements inside it (those of
    :func:`stmt_bodies`, and the loops a :class:`TileProduct`'s nest spells it out as);
    ``into``, where given, says which statements to walk into."""
    for s in body:
        yield s
        if into is None or into(s):
            for inner in (s.nest,) if isinstance(s, TileProduct) else stmt_bodies(s):
                yield from walk_stmts(inner, into=into)


Folded = TypeVar("Folded")


def fold_stmts(body: tuple[Stmt, ...], fn: Callable[[Stmt, tuple[list[Folded], ...]], Folded]) -> list[Folded]:
    """``fn`` of each statement of ``body``, the statements inside it first: ``fn(s,
    inner)`` gets, per list of :func:`stmt_bodies`, the values ``fn`` gave its
    statements (a post-order fold, as an analysis that sums over a nest needs)."""
    return [fn(s, tuple(fold_stmts(b, fn) for b in stmt_bodies(s))) for s in body]


def perfect_nest(loop: For) -> list[For]:
    """The loops of the perfect nest ``loop`` leads, outermost first: ``loop``, then, while
    the innermost one's body is a single loop, that loop."""
    loops = [loop]
    while len(loops[-1].body) == 1 and isinstance(loops[-1].body[0], For):
        loops.append(loops[-1].body[0])
    return loops


def touched(kernel: LoopKernel) -> frozenset[str]:
    """The buffers some statement of ``kernel`` stores to or reads (a discarded output
    it does neither with need not even be zeroed first)."""
    return frozenset(s.buffer for s in walk_stmts(kernel.body) if isinstance(s, Store)) | {
        e.tensor for st in walk_stmts(kernel.body) for e in stmt_nodes(st) if isinstance(e, Read)}


def format_loop_expr(e: Expr) -> str:
    """Loop-IR text of an expression (int64 literals bare)."""
    return format_expr(e, DType.INT64)


def format_body(body: tuple[Stmt, ...], indent: str) -> list[str]:
    """The text lines of statements; a statement type defined elsewhere (the GPU IR's)
    prints itself through its ``format_lines(indent)``."""
    lines: list[str] = []
    for s in body:
        match s:
            case For(var=v, lo=lo, hi=hi, body=inner, kind=kind, step=step, vector=vec, unroll=unr):
                marks = ((f" step {step}" if step != 1 else "") + (f" vectorize({vec})" if vec > 1 else "")
                         + (f" unroll({unr})" if unr > 1 else ""))
                lines.append(f"{indent}{kind.value} {v} in {format_loop_expr(lo)}:{format_loop_expr(hi)}{marks} {{")
                lines += format_body(inner, indent + "  ")
                lines.append(f"{indent}}}")
            case If(cond=c, then=then, other=other):
                lines.append(f"{indent}if {format_loop_expr(c)} {{")
                lines += format_body(then, indent + "  ")
                if other:
                    lines.append(f"{indent}}} else {{")
                    lines += format_body(other, indent + "  ")
                lines.append(f"{indent}}}")
            case Assign(var=v, value=value):
                lines.append(f"{indent}let {v} = {format_loop_expr(value)}")
            case Store(buffer=b, indices=ix, value=value):
                lines.append(f"{indent}{b}({', '.join(format_loop_expr(i) for i in ix)}) = {format_loop_expr(value)}")
            case _:
                lines += s.format_lines(indent)  # type: ignore[attr-defined]
    return lines


def format_kernel(k: LoopKernel) -> str:
    params = [str(b) for b in k.buffers] + [f"{s.dtype} {s.name}" for s in k.scalars]
    return "\n".join([f"kernel {k.name}({', '.join(params)}) {{", *format_body(k.body, "  "), "}"])
