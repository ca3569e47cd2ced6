"""ONNX models -> graph IR (the only module that imports onnx).

Loads a path, bytes or ``ModelProto`` (external-data weights included), runs onnx's
checker, turns initializers and ``Constant`` nodes into constants, and refuses a
model with ops polyfuse cannot lower, naming every such op and its nodes at once.
Dimensions exporters mark unknown (``dim_value -1``, ``'?'``, an empty name or none)
are each their own size, as onnxruntime reads them. :func:`check_signature` holds a
node's inputs to its op's schema (count, required inputs, dtypes) when it is lowered.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from polyfuse.errors import DTypeError, ModelError, UnsupportedOpError
from polyfuse.ir.graph import Constant, Graph, Node, TensorType, Value
from polyfuse.ir.types import DType

_DTYPES = {
    onnx.TensorProto.FLOAT: DType.FLOAT32, onnx.TensorProto.DOUBLE: DType.FLOAT64,
    onnx.TensorProto.FLOAT16: DType.FLOAT16, onnx.TensorProto.BFLOAT16: DType.BFLOAT16,
    onnx.TensorProto.INT8: DType.INT8, onnx.TensorProto.INT16: DType.INT16,
    onnx.TensorProto.INT32: DType.INT32, onnx.TensorProto.INT64: DType.INT64,
    onnx.TensorProto.UINT8: DType.UINT8, onnx.TensorProto.BOOL: DType.BOOL,
}


def dtype_of(elem_type: int) -> DType | None:
    return _DTYPES.get(elem_type)


def onnx_dtype(dt: DType) -> int:
    return next(k for k, v in _DTYPES.items() if v is dt)


def load_model(model: str | os.PathLike | bytes | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        if isinstance(model, (bytes, bytearray)):
            proto = onnx.load_model_from_string(bytes(model))
        else:
            path = Path(model)
            if not path.exists():
                raise ModelError(f"no model file at '{path}'")
            proto = onnx.load(str(path))
    except ModelError:
        raise
    except Exception as err:  # protobuf's DecodeError, truncated files, bad external data
        raise ModelError(f"cannot read the ONNX model: {err}") from None
    if not proto.graph.node and not proto.graph.output:
        raise ModelError("the bytes do not hold an ONNX model (no graph)")
    return proto


# dim_params exporters write for "unknown", not for a size shared by several dimensions
# (paddle2onnx writes dim_value -1 instead, which is read the same way)
UNKNOWN_DIM_PARAMS = frozenset({"", "?", "-1", "None", "unk"})


def _type_of(vi: onnx.ValueInfoProto) -> TensorType:
    t = vi.type.tensor_type
    dt = dtype_of(t.elem_type)
    if dt is None:
        raise UnsupportedOpError(f"value '{vi.name}' has element type "
                                 f"{onnx.TensorProto.DataType.Name(t.elem_type)}, which polyfuse "
                                 "does not support")
    dims: list[int | str] = []
    for k, d in enumerate(t.shape.dim):
        if d.HasField("dim_value") and d.dim_value >= 0:
            dims.append(d.dim_value)
        elif d.HasField("dim_param") and d.dim_param.strip() not in UNKNOWN_DIM_PARAMS:
            dims.append(d.dim_param)
        else:  # unknown: each such dimension is its own size, as onnxruntime reads it
            dims.append(f"{vi.name}_dim{k}")
    return TensorType(dt, tuple(dims))


def _attr(a: onnx.AttributeProto) -> Any:
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list):
        return tuple(x.decode() if isinstance(x, bytes) else x for x in v)
    return v


def _constant_value(a: onnx.AttributeProto) -> np.ndarray | None:
    """The value of a Constant node (any of its attribute forms but sparse and strings)."""
    forms = {"value": lambda: numpy_helper.to_array(a.t),
             "value_float": lambda: np.array(a.f, np.float32),
             "value_floats": lambda: np.array(list(a.floats), np.float32),
             "value_int": lambda: np.array(a.i, np.int64),
             "value_ints": lambda: np.array(list(a.ints), np.int64)}
    make = forms.get(a.name)
    return make() if make is not None else None


def to_graph(model: str | os.PathLike | bytes | onnx.ModelProto,
             supported: set[str] | None = None) -> Graph:
    """The graph IR of an ONNX model; ops outside ``supported`` are all reported at once."""
    proto = load_model(model)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as err:
        raise ModelError(f"the ONNX model is invalid: {str(err).splitlines()[0]}") from None
    g = proto.graph
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    constants = [Constant(t.name, numpy_helper.to_array(t)) for t in g.initializer]
    initialized = {c.name for c in constants}
    nodes: list[Node] = []
    unsupported: dict[str, list[str]] = {}
    for k, n in enumerate(g.node):
        name = n.name or f"{n.op_type}_{k}"
        if n.domain not in ("", "ai.onnx"):
            unsupported.setdefault(f"{n.domain}.{n.op_type}", []).append(name)
            continue
        if n.op_type == "Constant" and len(n.attribute) == 1:
            value = _constant_value(n.attribute[0])
            if value is not None:
                constants.append(Constant(n.output[0], value))
                continue
        if supported is not None and n.op_type not in supported:
            unsupported.setdefault(n.op_type, []).append(name)
            continue
        nodes.append(Node(n.op_type, name, tuple(n.input), tuple(n.output),
                          tuple((a.name, _attr(a)) for a in n.attribute)))
    for c in constants:
        if DType.from_numpy(c.array.dtype) not in _DTYPES.values():
            unsupported.setdefault(f"constants of element type {c.array.dtype}", []).append(c.name)
    if unsupported:
        listing = "; ".join(f"{op} (nodes: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
                            for op, names in sorted(unsupported.items()))
        raise UnsupportedOpError(f"the model uses {len(unsupported)} op type"
                                 f"{'s' if len(unsupported) > 1 else ''} polyfuse does not "
                                 f"support: {listing}")
    inputs = tuple(Value(v.name, _type_of(v)) for v in g.input if v.name not in initialized)
    outputs = tuple(Value(v.name, _type_of(v)) for v in g.output)
    return Graph(g.name or "model", inputs, outputs, tuple(nodes), tuple(constants), opset,
                 _inferred_types(proto, {v.name for v in inputs + outputs} | initialized))


def _inferred_types(proto: onnx.ModelProto, known: set[str]) -> tuple[Value, ...]:
    """The types onnx's shape inference gives the model's intermediate values (those it
    could infer completely); none if inference fails (polyfuse infers shapes itself when
    it lowers each node for concrete input shapes)."""
    if any(_crashes_inference(n) for n in proto.graph.node):
        return ()
    proto = _without_negative_dims(proto)
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - onnx raises many kinds; the types are optional
        return ()
    values = []
    for vi in inferred.graph.value_info:
        t = vi.type.tensor_type
        if vi.name in known or not vi.type.HasField("tensor_type") or dtype_of(t.elem_type) is None \
                or not t.HasField("shape") or any(not (d.HasField("dim_value") or d.dim_param)
                                                  for d in t.shape.dim):
            continue
        values.append(Value(vi.name, _type_of(vi)))
    return tuple(values)


def _crashes_inference(node: onnx.NodeProto) -> bool:
    """Whether onnx's shape inference (C++, in this process) is known to crash on
    ``node``: a GatherND with negative batch_dims is read out of bounds (a segfault)."""
    return node.op_type == "GatherND" and any(a.name == "batch_dims" and a.i < 0
                                              for a in node.attribute)


def _without_negative_dims(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto``, or a copy whose negative dim_values (exporters' "unknown") are unknown
    dims: onnx's shape inference aborts the process on some of them (a Slice)."""
    g = proto.graph
    values = list(g.input) + list(g.output) + list(g.value_info)
    if not any(d.HasField("dim_value") and d.dim_value < 0
               for v in values for d in v.type.tensor_type.shape.dim):
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    g = copy.graph
    for v in list(g.input) + list(g.output) + list(g.value_info):
        for d in v.type.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value < 0:
                d.Clear()
    return copy


def _type_str(dt: DType) -> str:
    """The name ONNX schemas give a tensor of ``dt``: ``tensor(float)``."""
    return f"tensor({onnx.TensorProto.DataType.Name(onnx_dtype(dt)).lower()})"


_FROM_TYPE_STR = {_type_str(dt): dt for dt in _DTYPES.values()}


def check_signature(node: Node, types: list[TensorType | None], opset: int) -> None:
    """``node``'s inputs against its op's ONNX schema at ``opset``: how many, that the
    required ones are given, and each one's dtype (inputs sharing a type parameter share
    one dtype). Ops without a schema, and graphs of no known opset (0), are left to the
    lowerings."""
    if opset < 1:
        return
    try:
        schema = onnx.defs.get_schema(node.op, opset, "")
    except onnx.defs.SchemaError:
        return
    where = f"node '{node.name}' ({node.op}-{schema.since_version})"
    formals = list(schema.inputs)
    count = len(node.inputs)
    if not schema.min_input <= count <= schema.max_input:
        most = "or more" if schema.max_input > 1 << 20 else f"to {schema.max_input}"
        raise ModelError(f"{where} has {count} inputs; it takes {schema.min_input} {most} "
                         f"({', '.join(f.name for f in formals)})")
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    first: dict[str, tuple[int, DType]] = {}
    Option = onnx.defs.OpSchema.FormalParameterOption
    for k, name in enumerate(node.inputs):
        if not formals:
            break
        f = formals[min(k, len(formals) - 1)]
        if k >= len(formals) and f.option != Option.Variadic:
            break
        t = types[k] if k < len(types) else None
        if not name or t is None:
            if f.option == Option.Single and not name:
                raise ModelError(f"{where} lacks its required input {k} ('{f.name}'); give it "
                                 "a value")
            continue
        ok = allowed.get(f.type_str, [f.type_str])
        if _type_str(t.dtype) not in ok:
            names = sorted(str(_FROM_TYPE_STR[x]) for x in ok if x in _FROM_TYPE_STR)
            raise DTypeError(f"{where}: input {k} ('{name}', {f.name}) is {t.dtype}; it takes "
                             f"{', '.join(names) or 'no type polyfuse supports'} (insert a Cast)")
        if f.type_str in allowed and (f.option != Option.Variadic or f.is_homogeneous):
            j, dt = first.setdefault(f.type_str, (k, t.dtype))
            if dt is not t.dtype:
                raise DTypeError(f"{where}: input {k} ('{name}') is {t.dtype} but input {j} "
                                 f"('{node.inputs[j]}') is {dt}; inputs of type {f.type_str} "
                                 "must have one dtype (insert a Cast)")
