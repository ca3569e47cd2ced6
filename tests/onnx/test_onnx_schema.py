"""The element-type table the op library reads without onnx agrees with onnx's."""

import onnx
import pytest

from polyfuse.errors import DTypeError
from polyfuse.frontends.onnx_schema import (ELEMENT_TYPES, SUPPORTED_DTYPES, check_signature, dtype_of,
                                            type_str)
from polyfuse.ir.graph import Node, TensorType
from polyfuse.ir.types import DType

pytestmark = pytest.mark.unit


def test_element_types_are_onnx_codes():
    for code, dt in ELEMENT_TYPES.items():
        name = onnx.TensorProto.DataType.Name(code)
        assert type_str(dt) == f"tensor({name.lower()})"
        if dt is not DType.BFLOAT16:   # numpy has no bfloat16
            assert onnx.helper.tensor_dtype_to_np_dtype(code) == dt.numpy
    assert SUPPORTED_DTYPES == set(ELEMENT_TYPES.values())
    assert dtype_of(onnx.TensorProto.STRING) is None and dtype_of(onnx.TensorProto.COMPLEX64) is None
    assert dtype_of(onnx.TensorProto.INT4) is DType.INT4


def test_every_dtype_has_its_onnx_type_name():
    names = {f"tensor({n.lower()})" for n in onnx.TensorProto.DataType.keys()}
    assert all(type_str(dt) in names for dt in DType)


def test_signature_dtypes():
    add = Node("Add", "add", ("a", "b"), ("c",))
    f32, i64 = TensorType(DType.FLOAT32, (2,)), TensorType(DType.INT64, (2,))
    check_signature(add, [f32, f32], 17)
    with pytest.raises(DTypeError, match=r"node 'add' \(Add-14\): input 1 \('b'\) is int64 but "
                                         r"input 0 \('a'\) is float32"):
        check_signature(add, [f32, i64], 17)
