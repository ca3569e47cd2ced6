"""Front ends: the TC language, einsum subscripts (later ONNX)."""
