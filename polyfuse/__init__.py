"""polyfuse: a polyhedral ML compiler for TC comprehensions and ONNX models."""

from polyfuse.driver import define, einsum
from polyfuse.errors import (ArgumentError, BoundsError, DTypeError, FrontendError,
                             IRVerificationError, PolyfuseError, RangeInferenceError, ShapeError,
                             TargetError, TCSemanticError, TCSyntaxError)
from polyfuse.runtime.kernel import Kernel, KernelModule, SpecializedKernel
from polyfuse.targets import Target

__version__ = "0.1.0"

__all__ = [
    "define", "einsum", "Target", "Kernel", "KernelModule", "SpecializedKernel",
    "PolyfuseError", "FrontendError", "TCSyntaxError", "TCSemanticError", "RangeInferenceError",
    "IRVerificationError", "ArgumentError", "ShapeError", "DTypeError", "BoundsError",
    "TargetError", "__version__",
]
