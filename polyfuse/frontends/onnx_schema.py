"""What ONNX says about ops and element types, for code that must not load onnx itself.

:func:`dtype_of` turns an ONNX ``TensorProto`` element-type code into a
:class:`~polyfuse.ir.types.DType` (the front end turns the element-type attributes of
Cast, EyeLike and BitCast into dtype names with it). The table is written out (the codes are
fixed by the ONNX standard) so that importing the op library, and so ``import
polyfuse``, does not import onnx. :func:`check_signature` holds a node's inputs to its
op's schema; it imports onnx the first time a node is checked (compiling a model).
"""

from __future__ import annotations

from polyfuse.errors import DTypeError, ModelError
from polyfuse.ir.graph import Node, TensorType
from polyfuse.ir.types import DType

# TensorProto.DataType code -> DType, for the element types polyfuse supports
ELEMENT_TYPES = {
    1: DType.FLOAT32, 11: DType.FLOAT64, 10: DType.FLOAT16, 16: DType.BFLOAT16,
    3: DType.INT8, 5: DType.INT16, 6: DType.INT32, 7: DType.INT64,
    2: DType.UINT8, 4: DType.UINT16, 12: DType.UINT32, 13: DType.UINT64, 9: DType.BOOL,
    # the narrow types, held in a wider storage type (see polyfuse.ir.types)
    17: DType.FLOAT8E4M3FN, 18: DType.FLOAT8E4M3FNUZ, 19: DType.FLOAT8E5M2,
    20: DType.FLOAT8E5M2FNUZ, 21: DType.UINT4, 22: DType.INT4, 23: DType.FLOAT4E2M1,
    24: DType.FLOAT8E8M0, 25: DType.UINT2, 26: DType.INT2,
}
_CODES = {dt: code for code, dt in ELEMENT_TYPES.items()}
SUPPORTED_DTYPES = frozenset(_CODES)
# the DTypes ONNX names otherwise (the others' names agree)
_ONNX_NAMES = {DType.FLOAT32: "float", DType.FLOAT64: "double"}


def dtype_of(elem_type: int) -> DType | None:
    """The DType of an ONNX element-type code; None for a type polyfuse does not support."""
    return ELEMENT_TYPES.get(elem_type)


def onnx_dtype(dt: DType) -> int:
    """The ONNX element-type code of ``dt`` (one of :data:`SUPPORTED_DTYPES`)."""
    return _CODES[dt]


def type_str(dt: DType) -> str:
    """The name ONNX schemas give a tensor of ``dt``: ``tensor(float)``."""
    return f"tensor({_ONNX_NAMES.get(dt, dt.value)})"


_FROM_TYPE_STR = {type_str(dt): dt for dt in SUPPORTED_DTYPES}


def _schema(op: str, opset: int):  # noqa: ANN202 - onnx's OpSchema, imported lazily
    import onnx  # here, not at module level: see the module docstring
    try:
        return onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return None


def narrow_outputs(node: Node, types: list[TensorType | None], opset: int) -> tuple[DType | None, ...]:
    """The narrow element types (float8, int4, ...) of ``node``'s outputs that its op's
    schema ties to a narrow input's type (Reshape's output is its data's type; CastLike's
    the type of its second input): None for the others, which hold their own type."""
    schema = _schema(node.op, opset) if opset >= 1 else None
    if schema is None:
        return (None,) * len(node.outputs)
    formals = list(schema.inputs)
    tied: dict[str, DType] = {}
    for k, t in enumerate(types):
        if t is not None and t.dtype.is_narrow and formals:
            tied.setdefault(formals[min(k, len(formals) - 1)].type_str, t.dtype)
    outs = list(schema.outputs)
    return tuple(tied.get(outs[min(k, len(outs) - 1)].type_str) if outs else None
                 for k in range(len(node.outputs)))


def check_signature(node: Node, types: list[TensorType | None], opset: int) -> None:
    """``node``'s inputs against its op's ONNX schema at ``opset``: how many, that the
    required ones are given, and each one's dtype (inputs sharing a type parameter share
    one dtype). Ops without a schema, and graphs of no known opset (0), are left to the
    lowerings."""
    if opset < 1:
        return
    import onnx  # here, not at module level: see the module docstring
    schema = _schema(node.op, opset)
    if schema is None:
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
        if type_str(t.dtype) not in ok:
            names = sorted(str(_FROM_TYPE_STR[x]) for x in ok if x in _FROM_TYPE_STR)
            raise DTypeError(f"{where}: input {k} ('{name}', {f.name}) is {t.dtype}; it takes "
                             f"{', '.join(names) or 'no type polyfuse supports'} (insert a Cast)")
        if f.type_str in allowed and (f.option != Option.Variadic or f.is_homogeneous):
            j, dt = first.setdefault(f.type_str, (k, t.dtype))
            if dt is not t.dtype:
                raise DTypeError(f"{where}: input {k} ('{name}') is {t.dtype} but input {j} "
                                 f"('{node.inputs[j]}') is {dt}; inputs of type {f.type_str} "
                                 "must have one dtype (insert a Cast)")
