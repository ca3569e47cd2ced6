"""Invariants of the comprehension IR; raises IRVerificationError naming what is wrong."""

from __future__ import annotations

from polyfuse.errors import IRVerificationError
from polyfuse.ir.builtins import BUILTINS, BuiltinKind
from polyfuse.ir.comprehension import (Binary, Call, Cast, Definition, Expr, IndexVar, Literal,
                                       Read, ReduceOp, ScalarDecl, ScalarRef, Select, SizeVar,
                                       Statement, TensorDecl, Unary, UnaryOp, walk)
from polyfuse.ir.types import DType


def _fail(d: Definition, where: str, message: str) -> IRVerificationError:
    return IRVerificationError(f"in definition '{d.name}', {where}: {message}")


def verify_definition(d: Definition) -> None:
    names = [p.name for p in d.params] + [t.name for t in d.outputs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise _fail(d, "signature", f"names declared twice: {sorted(dup)}")
    sizes = set(d.sizes)
    tensors = {t.name: t for t in d.inputs + d.outputs}
    scalars = {s.name: s for s in d.params if isinstance(s, ScalarDecl)}
    for t in d.inputs + d.outputs:
        for s in t.shape:
            _check_size_expr(d, f"shape of '{t.name}'", s, sizes)
    outputs = {t.name for t in d.outputs}
    for k, st in enumerate(d.statements):
        where = f"statement {k + 1} ({st.tensor}(...) {st.op.token(st.init)} ...)"
        if st.tensor not in outputs:
            raise _fail(d, where, f"'{st.tensor}' is not an output")
        _check_statement(d, where, st, tensors, scalars, sizes)


def _check_size_expr(d: Definition, where: str, e: Expr, sizes: set[str]) -> None:
    for n in walk(e):
        if isinstance(n, SizeVar) and n.name not in sizes:
            raise _fail(d, where, f"size '{n.name}' is not bound by any input")
        if not isinstance(n, (SizeVar, Literal, Binary, Unary, Call)) or not n.dtype.is_int:
            raise _fail(d, where, f"'{n}' is not an integer size expression")


def _check_statement(d: Definition, where: str, st: Statement, tensors: dict[str, TensorDecl],
                     scalars: dict[str, ScalarDecl], sizes: set[str]) -> None:
    target = tensors[st.tensor]
    if len(st.indices) != target.rank or len(set(st.indices)) != len(st.indices):
        raise _fail(d, where, f"left-hand side indices {st.indices} do not fit rank {target.rank}")
    if st.rhs.dtype is not target.dtype:
        raise _fail(d, where, f"value is {st.rhs.dtype} but '{st.tensor}' is {target.dtype}")
    ranged = [r.index for r in st.ranges]
    used = set(st.indices) | {n.name for n in walk(st.rhs) if isinstance(n, IndexVar)}
    if len(set(ranged)) != len(ranged) or set(ranged) != used:
        raise _fail(d, where, f"ranges {ranged} do not match the indices used {sorted(used)}")
    if st.op is ReduceOp.ASSIGN and st.reduction_indices:
        raise _fail(d, where, f"'=' with reduction indices {st.reduction_indices}")
    for r in st.ranges:
        _check_size_expr(d, where, r.lo, sizes)
        _check_size_expr(d, where, r.hi, sizes)
    for n in walk(st.rhs):
        problem = _typing_problem(n, tensors, scalars, sizes)
        if problem:
            raise _fail(d, where, f"{problem} in '{n}'")


def _typing_problem(n: Expr, tensors: dict[str, TensorDecl], scalars: dict[str, ScalarDecl],
                    sizes: set[str]) -> str | None:
    match n:
        case Read(tensor=t, indices=ix, dtype=dt):
            if t not in tensors:
                return f"unknown tensor '{t}'"
            if len(ix) != tensors[t].rank or dt is not tensors[t].dtype:
                return f"read does not match the declaration of '{t}'"
            if any(not i.dtype.is_int for i in ix):
                return "non-integer index"
        case ScalarRef(name=s, dtype=dt):
            if s not in scalars or scalars[s].dtype is not dt:
                return f"unknown scalar '{s}'"
        case SizeVar(name=s) if s not in sizes:
            return f"unknown size '{s}'"
        case Unary(op=UnaryOp.NOT, operand=a, dtype=dt):
            if a.dtype is not DType.BOOL or dt is not DType.BOOL:
                return "'!' needs bool"
        case Unary(operand=a, dtype=dt) if a.dtype is not dt:
            return "operand type differs from the result type"
        case Unary(op=UnaryOp.BIT_NOT, dtype=dt) if not dt.is_int:
            return "'~' needs an integer"
        case Binary(op=op, dtype=dt) if op.is_bitwise and not dt.is_int:
            return f"'{op.value}' needs integers"
        case Binary(op=op, lhs=a, rhs=b, dtype=dt):
            if op.is_logical and not (a.dtype is b.dtype is dt is DType.BOOL):
                return "logical operator needs bool operands"
            if op.is_comparison and (a.dtype is not b.dtype or dt is not DType.BOOL):
                return "comparison operands differ in type"
            if not op.is_logical and not op.is_comparison and not (a.dtype is b.dtype is dt):
                return "operand types differ from the result type"
        case Select(cond=c, then=a, other=b, dtype=dt):
            if c.dtype is not DType.BOOL or not (a.dtype is b.dtype is dt):
                return "select types disagree"
        case Call(fn=fn, args=args, dtype=dt):
            if fn not in BUILTINS or BUILTINS[fn].arity != len(args):
                return f"unknown builtin or wrong arity '{fn}'"
            if BUILTINS[fn].kind is BuiltinKind.BITS:
                if dt is not BUILTINS[fn].result or args[0].dtype.bits != dt.bits:
                    return f"'{fn}' needs an argument of {dt.bits} bits and gives {dt}"
                return None
            if BUILTINS[fn].kind is BuiltinKind.WORDS:
                if dt is not BUILTINS[fn].result or any(a.dtype is not DType.INT32 for a in args):
                    return f"'{fn}' takes int32 words and gives {BUILTINS[fn].result}"
                return None
            if any(a.dtype is not dt for a in args):
                return "argument types differ from the result type"
        case Cast() | Literal() | IndexVar():
            pass
    return None
