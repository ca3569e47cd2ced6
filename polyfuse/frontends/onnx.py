"""ONNX models -> graph IR (onnx is imported here, lazily in onnx_schema, and by backend.py).

Loads a path, bytes or ``ModelProto`` (external-data weights included), runs onnx's
checker (loading, with one :class:`ModelWarning`, what onnxruntime loads despite the
checker: an unnamed graph, outputs without a type or shape, which onnx's shape inference
then gives them, IR-version-3 initializers not listed as graph inputs), turns initializers and ``Constant`` nodes into constants, and refuses a
model with ops polyfuse cannot lower, naming every such op and its nodes at once.
Dimensions exporters mark unknown (``dim_value -1``, ``'?'``, an empty name or none)
are each their own size, as onnxruntime reads them. Element types and op schemas, which
the op library needs without loading onnx, are in :mod:`polyfuse.frontends.onnx_schema`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx.external_data_helper import (ExternalDataInfo, _get_all_tensors, load_external_data_for_model,
                                       uses_external_data)
from onnx import numpy_helper

from polyfuse.errors import ModelError, UnsupportedOpError
from polyfuse.frontends.onnx_schema import SUPPORTED_DTYPES, dtype_of
from polyfuse.ir.control import batched_scan, control_parts
from polyfuse.ir.graph import Constant, Graph, Node, TensorType, Value
from polyfuse.ir.types import DType


def load_model(model: str | os.PathLike | bytes | onnx.ModelProto) -> onnx.ModelProto:
    return model if isinstance(model, onnx.ModelProto) else read_model(model)[0]


def read_model(model: str | os.PathLike | bytes | onnx.ModelProto) -> tuple[onnx.ModelProto, bytes, list[str]]:
    """The model, its ONNX bytes (a file's read once: what its digest hashes) and the
    files (relative to a model file's folder) its weights stored beside it (external data)
    were loaded from."""
    if isinstance(model, onnx.ModelProto):
        return model, model.SerializeToString(), external_files(model)
    try:
        if isinstance(model, (bytes, bytearray)):
            data = bytes(model)
            proto = onnx.load_model_from_string(data)
            external = external_files(proto)
        else:
            path = Path(model)
            if not path.exists():
                raise ModelError(f"no model file at '{path}'")
            data = path.read_bytes()
            proto = onnx.load_model_from_string(data)
            external = external_files(proto)
            load_external_data_for_model(proto, str(path.parent))
    except ModelError:
        raise
    except Exception as err:  # protobuf's DecodeError, truncated files, bad external data
        raise ModelError(f"cannot read the ONNX model: {err}") from None
    if not proto.graph.node and not proto.graph.output:
        raise ModelError("the bytes do not hold an ONNX model (no graph)")
    return proto, data, external


def external_files(proto: onnx.ModelProto) -> list[str]:
    """The files a model's tensors stored outside it (external data) name, in order."""
    return list(dict.fromkeys(ExternalDataInfo(t).location for t in _get_all_tensors(proto) if uses_external_data(t)))


# dim_params exporters write for "unknown", not for a size shared by several dimensions
# (paddle2onnx writes dim_value -1 instead, which is read the same way)
UNKNOWN_DIM_PARAMS = frozenset({"", "?", "-1", "None", "unk"})


def _type_of(vi: onnx.ValueInfoProto) -> TensorType:
    kind = vi.type.WhichOneof("value")
    if kind not in (None, "tensor_type"):
        raise UnsupportedOpError(f"value '{vi.name}' is of {kind.replace('_type', '')} type; polyfuse "
                                 "supports tensors only")
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


# attributes naming an element type: ONNX TensorProto codes in the model, polyfuse dtype
# names (DType values, e.g. "float32") in the graph IR
ELEMENT_TYPE_ATTRS = {"Cast": ("to",), "EyeLike": ("dtype",), "BitCast": ("to",),
                      "QuantizeLinear": ("output_dtype", "precision"),
                      "DequantizeLinear": ("output_dtype",),
                      **{op: ("output_datatype",) for op in ("HannWindow", "HammingWindow",
                                                             "BlackmanWindow", "MelWeightMatrix")}}


def _type_name(code: int) -> str:
    try:
        return onnx.TensorProto.DataType.Name(code)
    except ValueError:
        return str(code)


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


# ops of other domains polyfuse lowers, under their bare names (no default-domain op has them)
OTHER_DOMAIN_OPS = {("ai.onnx.preview", "FlexAttention")}


def to_graph(model: str | os.PathLike | bytes | onnx.ModelProto,
             supported: set[str] | None = None) -> Graph:
    """The graph IR of an ONNX model; ops outside ``supported`` are all reported at once."""
    loaded = load_model(model)
    light = _without_weights(loaded)   # (read once: each read of raw_data copies the weights)
    proto = checked(loaded, light)
    g = proto.graph
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    unsupported: dict[str, list[str]] = {}
    inferred = _inferred(proto, light if proto is loaded else _without_weights(proto))
    # the nodes as inferred: subgraphs' inputs and outputs then have element types
    nodes, constants = _import_nodes(g if inferred is None else inferred.graph, opset, supported,
                                     unsupported, initializers=g.initializer)
    initialized = {t.name for t in g.initializer}
    if unsupported:
        listing = "; ".join(f"{op} (nodes: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
                            for op, names in sorted(unsupported.items()))
        raise UnsupportedOpError(f"the model uses {len(unsupported)} op type"
                                 f"{'s' if len(unsupported) > 1 else ''} polyfuse does not "
                                 f"support: {listing}")
    inputs = tuple(Value(v.name, _type_of(v)) for v in g.input if v.name not in initialized)
    outputs = tuple(Value(v.name, _type_of(v)) for v in g.output)
    return Graph(g.name or "model", inputs, outputs, tuple(nodes), tuple(constants), opset,
                 _inferred_types(inferred, {v.name for v in inputs + outputs} | initialized))


def _import_nodes(g: onnx.GraphProto, opset: int, supported: set[str] | None,
                  unsupported: dict[str, list[str]], scope: str = "",
                  initializers: Iterable[onnx.TensorProto] | None = None) -> tuple[list[Node], list[Constant]]:
    """The nodes and constants of ``g`` (a model's graph or a subgraph, whose unnamed
    nodes are named after ``scope``); ops outside ``supported`` and constants of element
    types polyfuse lacks go to ``unsupported`` (what -> node names), bodies' included.
    ``initializers``: the weights, where ``g`` is a copy inferred without them."""
    constants = [Constant(t.name, numpy_helper.to_array(t))
                 for t in (g.initializer if initializers is None else initializers)]
    nodes: list[Node] = []
    for k, n in enumerate(g.node):
        name = n.name or f"{scope}{n.op_type}_{k}"
        if n.domain not in ("", "ai.onnx") and (n.domain, n.op_type) not in OTHER_DOMAIN_OPS:
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
        attrs = tuple((a.name, _subgraph(a.g, name, opset, supported, unsupported)
                       if a.type == onnx.AttributeProto.GRAPH else _attr(a)) for a in n.attribute)
        keys = ELEMENT_TYPE_ATTRS.get(n.op_type, ())
        codes = {k: v for k, v in attrs if k in keys and isinstance(v, int)}
        types = {k: dtype_of(code) for k, code in codes.items() if code}
        unknown = [k for k, dt in types.items() if dt is None]
        if unknown:
            unsupported.setdefault(f"{n.op_type} {unknown[0]} element type "
                                   f"{_type_name(codes[unknown[0]])}", []).append(name)
            continue
        known = {k: dt for k, dt in types.items() if dt is not None}
        # UNDEFINED (0) is such an attribute's default: the op picks the type itself
        attrs = tuple((k, known[k].value if k in known else v) for k, v in attrs if codes.get(k, 1))
        node = Node(n.op_type, name, tuple(n.input), tuple(n.output), attrs)
        if node.subgraphs:
            node = _with_captures(node)
            if node.op == "Scan" and opset < 9:
                node = batched_scan(node)
            control_parts(node)   # refuses malformed bodies now
        nodes.append(node)
    for c in constants:
        if DType.from_numpy(c.array.dtype) not in SUPPORTED_DTYPES:
            unsupported.setdefault(f"constants of element type {c.array.dtype}", []).append(c.name)
    return nodes, constants


def _subgraph(g: onnx.GraphProto, owner: str, opset: int, supported: set[str] | None,
              unsupported: dict[str, list[str]]) -> Graph:
    """A body or branch of node ``owner``; the names it reads and does not define are
    its captures (values of the enclosing graphs)."""
    nodes, constants = _import_nodes(g, opset, supported, unsupported, f"{owner}/")
    try:
        inputs = tuple(Value(v.name, _type_of(v)) for v in g.input)
        outputs = tuple(Value(v.name, _type_of(v)) for v in g.output)
    except UnsupportedOpError as err:
        raise UnsupportedOpError(f"node '{owner}': its subgraph '{g.name}': {err}") from None
    defined = {v.name for v in inputs} | {c.name for c in constants}
    captures: list[str] = []
    for n in nodes:
        captures += [i for i in n.inputs if i and i not in defined and i not in captures]
        defined.update(n.outputs)
    captures += [v.name for v in outputs if v.name not in defined and v.name not in captures]
    return Graph(g.name or owner, inputs, outputs, tuple(nodes), tuple(constants), opset,
                 captures=tuple(captures))


def _with_captures(node: Node) -> Node:
    """``node`` reading its subgraphs' captures as inputs after its own, once each in the
    order first captured; each subgraph lists them all (the node's inputs feed them by
    position), so renaming enclosing values renames what the bodies read."""
    captured: list[str] = []
    for body in node.subgraphs:
        captured += [c for c in body.captures if c not in captured]
    attrs = tuple((k, replace(v, captures=tuple(captured)) if isinstance(v, Graph) else v)
                  for k, v in node.attrs)
    return replace(node, inputs=node.inputs + tuple(captured), attrs=attrs)


class ModelWarning(UserWarning):
    """A model breaks a rule of onnx's checker that does not change what it computes
    (onnxruntime loads it too); polyfuse loads it and says what it assumed."""


# onnx checker complaints polyfuse repairs: what the message says -> the repair, which
# returns what it assumed (a sentence of the warning)
def _name_graph(proto: onnx.ModelProto) -> str:
    proto.graph.name = "model"
    return "the graph has no name (it is called 'model')"


def _list_initializers(proto: onnx.ModelProto) -> str:
    g = proto.graph
    listed = {v.name for v in g.input}
    missing = [t for t in g.initializer if t.name not in listed]
    g.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                   for t in missing)
    return (f"{len(missing)} initializer{'s are' if len(missing) > 1 else ' is'} not listed as "
            f"graph input{'s' if len(missing) > 1 else ''} (IR version {proto.ir_version} asks it; "
            "they are read as weights)")


def _type_outputs(proto: onnx.ModelProto) -> str:
    """Gives graph outputs without an element type or shape those of onnx's shape
    inference; an output whose element type cannot be inferred is a ModelError, one whose
    rank cannot be is left without dimensions (polyfuse computes every shape itself)."""
    g = proto.graph
    untyped = [v for v in g.output if not (v.type.HasField("tensor_type") and
                                           v.type.tensor_type.elem_type and
                                           v.type.tensor_type.HasField("shape"))]
    if not untyped or any(v.type.HasField(kind) for v in untyped for kind in ("sequence_type", "map_type",
                                                               "optional_type")):
        return ""
    inferred: dict[str, onnx.TypeProto] = {}
    if not any(_crashes_inference(n) for n in g.node):
        try:
            done = onnx.shape_inference.infer_shapes(_without_negative_dims(_without_weights(proto)),
                                                     strict_mode=False, data_prop=True)
            inferred = {v.name: v.type for v in list(done.graph.value_info) + list(done.graph.output)}
        except Exception:  # noqa: BLE001 - onnx raises many kinds; checked below
            pass
    for v in untyped:
        t = v.type.tensor_type
        found = inferred.get(v.name)
        if found is not None and found.HasField("tensor_type"):
            if not t.elem_type:
                t.elem_type = found.tensor_type.elem_type
            if not t.HasField("shape") and found.tensor_type.HasField("shape"):
                t.shape.CopyFrom(found.tensor_type.shape)
        if not t.elem_type:
            raise ModelError(f"graph output '{v.name}' has no element type and onnx's shape "
                             "inference cannot infer one; give the output a type")
        t.shape.SetInParent()   # present, perhaps without dimensions
    names = ", ".join(f"'{v.name}'" for v in untyped[:5]) + (", ..." if len(untyped) > 5 else "")
    return f"graph outputs {names} lack a type or shape (inferred by onnx's shape inference)"


_REPAIRS = {"Field 'name' of 'graph' is required to be non-empty": _name_graph,
            "in initializer but not in graph input": _list_initializers,
            "Field 'type' of 'value_info' is required but missing": _type_outputs,
            "Field 'shape' of 'type' is required but missing": _type_outputs,
            "Field 'elem_type' of 'tensor_type' is required but missing": _type_outputs}


def checked(proto: onnx.ModelProto, light: onnx.ModelProto | None = None) -> onnx.ModelProto:
    """``proto`` if onnx's checker passes it, else a repaired copy (with one
    :class:`ModelWarning` listing what polyfuse assumed) when every complaint is one that
    onnxruntime overlooks; a model with any other complaint is a ModelError. ``light``:
    ``_without_weights(proto)``, where the caller has it."""
    assumed: list[str] = []
    copy = proto
    for _ in range(len(_REPAIRS) + 1):
        try:
            onnx.checker.check_model(light if copy is proto and light is not None else _without_weights(copy))
            break
        except onnx.checker.ValidationError as err:
            complaint = str(err).splitlines()[0]
        repair = next((fix for text, fix in _REPAIRS.items() if text in complaint), None)
        if copy is proto:
            copy = onnx.ModelProto()
            copy.CopyFrom(proto)
        said = repair(copy) if repair is not None else ""
        if not said or said in assumed:
            raise ModelError(f"the ONNX model is invalid: {complaint}")
        assumed.append(said)
    else:
        raise ModelError(f"the ONNX model is invalid: {complaint}")
    if assumed:
        warnings.warn(f"the ONNX model does not pass onnx's checker; polyfuse loads it as "
                      f"onnxruntime does: {'; '.join(assumed)}", ModelWarning, stacklevel=3)
    return copy


def _inferred(proto: onnx.ModelProto, light: onnx.ModelProto) -> onnx.ModelProto | None:
    """The model after onnx's shape inference (of ``light``, ``proto`` without its large
    weights), or None where it fails."""
    if any(_crashes_inference(n) for n in proto.graph.node):
        return None
    try:
        return onnx.shape_inference.infer_shapes(_without_negative_dims(light),
                                                 strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - onnx raises many kinds; the types are optional
        return None


def _inferred_types(inferred: onnx.ModelProto | None, known: set[str]) -> tuple[Value, ...]:
    """The types onnx's shape inference gives the model's intermediate values (those it
    could infer completely); none if inference failed (polyfuse infers shapes itself when
    it lowers each node for concrete input shapes)."""
    if inferred is None:
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


# Initializers of more bytes than this are left out of the copy of the model that onnx's
# checker and shape inference see, declared as graph inputs of their type instead: each
# of the two serialized every weight (1 s of ResNet-50's 1.7 s load). No shape is
# computed from a tensor this large, and its size is checked here instead.
HEAVY_BYTES = 1 << 16

# element types whose raw data is a whole number of bytes per element
_ELEMENT_BYTES = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.DOUBLE: 8, onnx.TensorProto.FLOAT16: 2,
                  onnx.TensorProto.BFLOAT16: 2, onnx.TensorProto.INT8: 1, onnx.TensorProto.UINT8: 1,
                  onnx.TensorProto.INT16: 2, onnx.TensorProto.UINT16: 2, onnx.TensorProto.INT32: 4,
                  onnx.TensorProto.UINT32: 4, onnx.TensorProto.INT64: 8, onnx.TensorProto.UINT64: 8}


def _without_weights(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto``, or a copy without its large initializers (:data:`HEAVY_BYTES`), each
    declared as a graph input of its type and shape (where the IR version lets an input
    go without an initializer, or it is listed already). A large initializer whose data
    is not the size its shape and type need is a ModelError, as onnx's checker says."""
    g = proto.graph
    listed = {v.name for v in g.input}

    # (each read of raw_data copies the tensor's bytes: its size is read once)
    sizes = [len(t.raw_data) if t.data_type in _ELEMENT_BYTES and (proto.ir_version >= 4 or t.name in listed)
             else 0 for t in g.initializer]
    if not any(n > HEAVY_BYTES for n in sizes):
        return proto
    light = onnx.ModelProto()
    _copy_fields(light, proto, "graph")
    _copy_fields(light.graph, g, "initializer")
    for t, size in zip(g.initializer, sizes):
        if size <= HEAVY_BYTES:
            light.graph.initializer.append(t)
            continue
        need = int(np.prod(t.dims, dtype=np.int64)) * _ELEMENT_BYTES[t.data_type]
        if size != need:
            raise ModelError(f"the ONNX model is invalid: initializer '{t.name}' holds {size} "
                             f"bytes; its shape {list(t.dims)} and type need {need}")
        if t.name not in listed:
            light.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return light


def _copy_fields(dst: Any, src: Any, skip: str) -> None:
    """Every field set in protobuf message ``src`` but ``skip`` copied into ``dst``."""
    for field, value in src.ListFields():
        if field.name == skip:
            continue
        target = getattr(dst, field.name)
        if hasattr(target, "extend"):
            target.extend(value)
        elif hasattr(target, "CopyFrom"):
            target.CopyFrom(value)
        else:
            setattr(dst, field.name, value)


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
