"""polyfuse: a polyhedral ML compiler for TC comprehensions and ONNX models."""

from polyfuse.driver import compile, define, einsum
from polyfuse.errors import (AccessRangeError, ArgumentError, BoundsError, CodegenError, DeviceError, DTypeError,
                             FrontendError,
                             GraphSyntaxError, IRVerificationError, ModelError, OptionError, PolyfuseError,
                             RangeInferenceError, ScheduleError, ShapeError, SizeLimitError, TargetError,
                             TCSemanticError, TCSyntaxError, UnsupportedOpError, WeightError)
from polyfuse.ir.profile import Profile
from polyfuse.lowering.autodiff import grad
from polyfuse.lowering.calibration import QuantizeOptions
from polyfuse.runtime.kernel import Kernel, KernelModule, SpecializedKernel
from polyfuse.scheduler.options import Fusion, MappingOptions
from polyfuse.targets import Target
from polyfuse.version import __version__

__all__ = [
    "compile", "define", "einsum", "grad", "Target", "Kernel", "KernelModule", "SpecializedKernel",
    "MappingOptions", "Fusion", "Profile", "QuantizeOptions",
    "PolyfuseError", "FrontendError", "TCSyntaxError", "TCSemanticError", "RangeInferenceError",
    "IRVerificationError", "ArgumentError", "ShapeError", "DTypeError", "BoundsError",
    "AccessRangeError", "TargetError", "DeviceError", "ModelError", "UnsupportedOpError", "ScheduleError", "CodegenError",
    "GraphSyntaxError", "WeightError", "OptionError", "SizeLimitError", "__version__",
]
