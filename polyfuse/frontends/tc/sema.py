"""Semantic analysis of TC: syntax tree -> comprehension IR.

Checks names, ranks and types, classifies indices (those only on the right of a
reduction are reduction indices), runs range inference and sizes the outputs.
"""

from __future__ import annotations

from dataclasses import replace

import sympy

from polyfuse.errors import SourceLocation, TCSemanticError
from polyfuse.frontends.tc import ast
from polyfuse.frontends.tc.expressions import ExprAnalyzer, Scope, TensorInfo, Typed, cast
from polyfuse.frontends.tc.ranges import Access, access_shape, infer_ranges
from polyfuse.ir.comprehension import (Binary, Call, Definition, Equivalent, Expr, IndexVar,
                                       Literal, Range, Read, ReduceOp, ScalarDecl, SizeVar,
                                       Statement, TensorDecl, Unary, index_names, walk)
from polyfuse.ir.limits import MAX_EXPR_DEPTH, MAX_EXPR_NODES, expr_depth, expr_size
from polyfuse.ir.symbolic import canonical, from_sympy, to_sympy
from polyfuse.ir.types import DType

_SIZE_NODES = (SizeVar, Literal, Binary, Unary, Call)
_OPS = {"": ReduceOp.ASSIGN, "+": ReduceOp.ADD, "*": ReduceOp.MUL, "max": ReduceOp.MAX,
        "min": ReduceOp.MIN}


class DefinitionAnalyzer:
    def __init__(self, node: ast.DefAST, source: str, given_sizes: tuple[str, ...] = ()) -> None:
        self.node = node
        self.source = source
        self.given_sizes = given_sizes   # sizes no input's shape need declare: the caller gives them
        self.tensors: dict[str, TensorInfo] = {}
        self.scalars: dict[str, DType] = {}
        self.sizes: dict[str, None] = {}

    def error(self, message: str, loc: SourceLocation | None, hint: str | None = None) -> TCSemanticError:
        return TCSemanticError(message, loc, self.source, hint=hint)

    def dtype(self, t: ast.TypeAST) -> DType:
        dt = DType.from_name(t.name)
        if dt is None:
            raise self.error(f"unknown type '{t.name}'", t.loc,
                             hint="types: " + ", ".join(d.value for d in DType if not d.is_narrow) + ", float, double, int")
        return dt

    def claim(self, name: ast.Name, what: str) -> None:
        if name.id in self.tensors or name.id in self.scalars or name.id in self.sizes:
            raise self.error(f"'{name.id}' is declared twice", name.loc,
                             hint=f"rename this {what}")

    # --- signature ---
    def param(self, p: ast.ParamAST) -> TensorDecl | ScalarDecl:
        assert p.type is not None
        dt = self.dtype(p.type)
        self.claim(p.name, "parameter")
        if p.type.sizes is None:
            self.scalars[p.name.id] = dt
            return ScalarDecl(p.name.id, dt, p.name.loc)
        shape = []
        for s in p.type.sizes:
            if isinstance(s, ast.Name):
                if s.id in self.tensors or s.id in self.scalars:
                    raise self.error(f"size '{s.id}' has the name of a parameter", s.loc)
                self.sizes.setdefault(s.id)
                shape.append(SizeVar(s.id, s.loc))
            elif isinstance(s, ast.Number) and isinstance(s.value, int) and s.value >= 0:
                shape.append(canonical(ExprAnalyzer(self.scope(), self.source).analyze(s).expr))
            else:
                raise self.error("an input size must be a size name or a non-negative integer",
                                 s.loc)
        self.tensors[p.name.id] = TensorInfo(dt, tuple(shape), True, True, p.name.loc)
        return TensorDecl(p.name.id, dt, tuple(shape), p.name.loc)

    def output(self, p: ast.ParamAST) -> None:
        if p.name.id in self.sizes:
            raise self.error(f"output '{p.name.id}' has the name of a size", p.name.loc)
        self.claim(p.name, "output")
        info = TensorInfo(None, None, False, False, p.name.loc)
        if p.type is not None:  # ``float X`` declares a rank-0 output, as in TC
            info.dtype = self.dtype(p.type)
            info.shape = tuple(self.size_expr(s) for s in p.type.sizes or ())
        self.tensors[p.name.id] = info

    def scope(self, *, lhs_tensor: str = "", lhs_indices: tuple[str, ...] = ()) -> Scope:
        return Scope(self.tensors, frozenset(self.sizes), self.scalars, lhs_tensor, lhs_indices)

    def size_expr(self, node: ast.Node) -> Expr:
        """An integer expression over sizes only (type sizes, range bounds)."""
        scope = self.scope()
        e = ExprAnalyzer(scope, self.source).analyze(node).expr
        bad = next((n for n in walk(e) if not isinstance(n, _SIZE_NODES)
                    or isinstance(n, Call) and n.fn not in ("min", "max", "floordiv", "floormod")), None)
        if bad is not None or not e.dtype.is_int:
            loc = getattr(bad, "loc", None) or node.loc
            raise self.error("expected an integer expression of sizes and constants", loc)
        try:
            return canonical(e)
        except ValueError as err:
            raise self.error(str(err), node.loc) from None

    # --- body ---
    def definition(self) -> Definition:
        node = self.node
        params = tuple(self.param(p) for p in node.params)
        for name in self.given_sizes:
            if name in self.tensors or name in self.scalars:
                raise self.error(f"size '{name}' has the name of a parameter", node.name.loc)
            self.sizes.setdefault(name)
        for o in node.outputs:
            self.output(o)
        statements = tuple(self.statement(s) for s in node.statements)
        outputs = []
        for o in node.outputs:
            info = self.tensors[o.name.id]
            if not info.written:
                raise self.error(f"output '{o.name.id}' is never written", o.name.loc,
                                 hint="every declared output needs a statement that writes it")
            assert info.dtype is not None and info.shape is not None
            outputs.append(TensorDecl(o.name.id, info.dtype, info.shape, o.name.loc))
        return Definition(node.name.id, params, tuple(outputs), statements, node.loc)

    def statement(self, st: ast.StatementAST) -> Statement:
        name = st.tensor.id
        info = self.tensors.get(name)
        if info is None:
            raise self.error(f"'{name}' is written but not declared as an output", st.tensor.loc,
                             hint=f"TC requires temporaries to be outputs: add '{name}' to '-> (...)'")
        if info.is_input:
            raise self.error(f"cannot write to input '{name}'; inputs are read-only", st.tensor.loc)
        op = _OPS[st.op.rstrip("!").rstrip("=")]
        init = st.op.endswith("!")
        # a reduction without '!' before any write accumulates into the caller's
        # contents (TC's in-place form): the call gives the output with out=
        seen: set[str] = set()
        for i in st.indices:
            if i.id in seen:
                raise self.error(f"index '{i.id}' appears twice on the left-hand side", i.loc)
            if i.id in self.tensors or i.id in self.sizes or i.id in self.scalars:
                raise self.error(f"index '{i.id}' has the name of a tensor, size or scalar", i.loc)
            seen.add(i.id)
        if info.shape is not None and len(info.shape) != len(st.indices):
            raise self.error(f"'{name}' has {len(info.shape)} dimensions but is written with "
                             f"{len(st.indices)} indices", st.tensor.loc)
        scope = self.scope(lhs_tensor=name, lhs_indices=tuple(i.id for i in st.indices))
        scope.index_locs.update({i.id: i.loc for i in st.indices})
        analyzer = ExprAnalyzer(scope, self.source)
        fixed, exists = self.where(st, scope, analyzer)
        rhs = analyzer.analyze(st.rhs)
        self.check_limits(st, rhs.expr)
        self.check_indices(st, op, rhs.expr, scope)
        ranges = self.ranges(st, rhs.expr, exists, fixed, scope)
        statement = self.finish(st, info, op, init, rhs, ranges)
        if st.equivalent is None:
            return statement
        return replace(statement, equivalent=self.equivalent(st, st.equivalent, analyzer, ranges))

    def equivalent(self, st: ast.StatementAST, node: ast.Apply, analyzer: ExprAnalyzer,
                   ranges: tuple[Range, ...]) -> Equivalent:
        """The ``<=>`` note, its arguments checked in the statement's scope (as TC does)."""
        args = tuple(self.check_limits(st, analyzer.analyze(a).expr, a) for a in node.args)
        known = {r.index for r in ranges}
        for n in (n for a in args for n in walk(a)):
            if isinstance(n, IndexVar) and n.name not in known:
                raise self.error(f"index '{n.name}' of the '<=>' annotation is not an index of "
                                 "the statement", n.loc)
        return Equivalent(node.name, args)

    def where(self, st: ast.StatementAST, scope: Scope, analyzer: ExprAnalyzer
              ) -> tuple[dict[str, tuple[sympy.Expr, sympy.Expr]], list[Read]]:
        fixed: dict[str, tuple[sympy.Expr, sympy.Expr]] = {}
        exists: list[Read] = []
        for w in st.where:
            if isinstance(w, ast.WhereRange):
                if w.index.id in fixed:
                    raise self.error(f"index '{w.index.id}' has two ranges", w.index.loc)
                fixed[w.index.id] = (to_sympy(self.size_expr(w.lo)), to_sympy(self.size_expr(w.hi)))
                scope.index_locs.setdefault(w.index.id, w.index.loc)
            elif isinstance(w, ast.WhereLet):
                if w.name.id in self.tensors or w.name.id in scope.lets:
                    raise self.error(f"'{w.name.id}' is already defined", w.name.loc)
                scope.lets[w.name.id] = analyzer.analyze(w.value)
            else:
                access = self.check_limits(st, analyzer.analyze(w.access).expr, w.access)
                if not isinstance(access, Read):
                    raise self.error("'exists' takes a tensor access such as A(i, j)", w.access.loc)
                exists.append(access)
        return fixed, exists

    def check_indices(self, st: ast.StatementAST, op: ReduceOp, rhs: Expr, scope: Scope) -> None:
        lhs = set(scope.lhs_indices)
        if op is ReduceOp.ASSIGN:
            for n in walk(rhs):
                if isinstance(n, IndexVar) and n.name not in lhs:
                    raise self.error(
                        f"index '{n.name}' appears on the right of '=' but not on the left",
                        n.loc, hint=f"to sum over '{n.name}' write '+=!' (or max=!, min=!, *=!)")

    def ranges(self, st: ast.StatementAST, rhs: Expr, exists: list[Read],
               fixed: dict[str, tuple[sympy.Expr, sympy.Expr]], scope: Scope) -> tuple[Range, ...]:
        used = set(scope.lhs_indices) | index_names(rhs)
        for e in exists:
            for n in walk(e):
                if isinstance(n, IndexVar) and n.name not in used:
                    raise self.error(f"index '{n.name}' of the exists clause is not used by "
                                     "the statement", n.loc)
        for w in st.where:
            if isinstance(w, ast.WhereRange) and w.index.id not in used:
                raise self.error(f"index '{w.index.id}' of the where clause is not used", w.index.loc)
        accesses = []
        for e in [rhs, *exists]:
            for r in walk(e):
                if isinstance(r, Read):
                    shape = self.tensors[r.tensor].shape
                    if shape is not None:
                        accesses.append(Access(r.tensor, access_shape(shape), r.indices))
        info = self.tensors[st.tensor.id]
        if info.shape is not None:
            lhs = tuple(IndexVar(i) for i in scope.lhs_indices)
            accesses.append(Access(st.tensor.id, access_shape(info.shape), lhs))
        order = [i for i in scope.index_locs if i in used]
        inferred = infer_ranges(accesses, fixed, {i: scope.index_locs[i] for i in order},
                                self.source, frozenset(scope.lhs_indices))
        return tuple(Range(i, from_sympy(inferred[i][0]), from_sympy(inferred[i][1])) for i in order)

    def finish(self, st: ast.StatementAST, info: TensorInfo, op: ReduceOp, init: bool,
               rhs: Typed, ranges: tuple[Range, ...]) -> Statement:
        if info.dtype is None:
            dt = rhs.dtype
            if dt.is_bool and op in (ReduceOp.ADD, ReduceOp.MUL):
                dt = DType.INT32
            info.dtype = dt
        if info.shape is None:
            by_index = {r.index: r for r in ranges}
            info.shape = tuple(by_index[i.id].hi for i in st.indices)
        info.written = True
        value = self.check_limits(st, cast(rhs.expr, info.dtype))
        return Statement(st.tensor.id, tuple(i.id for i in st.indices), op, init,
                         value, ranges, st.tensor.loc)

    def check_limits(self, st: ast.StatementAST, e: Expr, node: ast.Node | None = None) -> Expr:
        """``e`` if it fits the limits of depth and size: the parser bounds the text, but
        a binding is copied into every use and an implicit conversion adds a level."""
        depth, size = expr_depth(e), expr_size(e)
        if depth > MAX_EXPR_DEPTH or size > MAX_EXPR_NODES:
            what = (f"{depth} levels deep, more than {MAX_EXPR_DEPTH}" if depth > MAX_EXPR_DEPTH
                    else f"{size} nodes, more than {MAX_EXPR_NODES}")
            raise self.error(
                f"with its 'where' bindings substituted and its implicit conversions, the "
                f"expression of '{st.tensor.id}' is {what}", (node or st.rhs).loc,
                hint="compute a part into a temporary output in an earlier statement: a "
                     "'where x = ...' binding is copied into every place that uses it")
        return e


def analyze_definition(node: ast.DefAST, source: str, given_sizes: tuple[str, ...] = ()) -> Definition:
    return DefinitionAnalyzer(node, source, given_sizes).definition()
