"""ATen's neural-network ops: convolution (and its backward), matrix products, layer and
batch norm (inference), softmax, reductions and pools."""

from __future__ import annotations

from typing import Any

import numpy as np

from polyfuse.frontends.torch.aten_shape import dim
from polyfuse.frontends.torch.builder import Builder, Tensor, Unsupported
from polyfuse.frontends.torch.registry import register
from polyfuse.ir.types import DType


def _spatial(values: Any, n: int, what: str) -> tuple[int, ...]:
    """A per-spatial-dimension list (torch allows one value for all)."""
    values = [values] if isinstance(values, int) else list(values)
    if len(values) == 1:
        values = values * n
    if len(values) != n or not all(isinstance(v, int) for v in values):
        raise Unsupported(f"{what} {values} for {n} spatial dimensions")
    return tuple(values)


def _conv_attrs(n: int, stride: Any, padding: Any, dilation: Any) -> dict[str, Any]:
    pads = _spatial(padding, n, "padding")
    return {"strides": _spatial(stride, n, "stride"), "pads": pads + pads,
            "dilations": _spatial(dilation, n, "dilation")}


@register("aten.convolution.default")
def _convolution(b: Builder, out: Tensor, x: Tensor, w: Tensor, bias: Tensor | None, stride: Any,
                 padding: Any, dilation: Any, transposed: bool, output_padding: Any, groups: int) -> str:
    n = x.rank - 2
    attrs = _conv_attrs(n, stride, padding, dilation)
    if transposed:
        return b.op("ConvTranspose", [x, w, bias], group=groups,
                    output_padding=_spatial(output_padding, n, "output_padding"), **attrs)
    return b.op("Conv", [x, w, bias], group=groups, **attrs)


@register("aten.convolution_backward.default")
def _convolution_backward(b: Builder, out: tuple, grad: Tensor, x: Tensor, w: Tensor, bias_sizes: Any,
                          stride: Any, padding: Any, dilation: Any, transposed: bool,
                          output_padding: Any, groups: int, mask: Any) -> tuple:
    if transposed or groups != 1:
        raise Unsupported("the backward of a transposed or grouped convolution")
    n = x.rank - 2
    attrs = _conv_attrs(n, stride, padding, dilation)
    strides, pads, dilations = attrs["strides"], attrs["pads"][:n], attrs["dilations"]
    results: list[str | None] = [None, None, None]
    if mask[0]:
        spatial = [x.shape[2 + k] for k in range(n)] + [grad.shape[2 + k] for k in range(n)]
        if not all(isinstance(s, int) for s in spatial):
            raise Unsupported("the input gradient of a convolution of symbolic spatial size")
        kernel = w.shape[2:]
        # the transposed convolution covers the input but for rows the stride skipped
        extra = tuple(int(x.shape[2 + k]) - ((int(grad.shape[2 + k]) - 1) * strides[k] - 2 * pads[k]
                                             + dilations[k] * (int(kernel[k]) - 1) + 1) for k in range(n))
        results[0] = b.op("ConvTranspose", [grad, w], output_padding=extra, **attrs)
    if mask[1]:
        swap = (1, 0) + tuple(range(2, x.rank))
        xt = b.op("Transpose", [x], perm=swap)
        gt = b.op("Transpose", [grad], perm=swap)
        # grad_w[o, c, i, j] = sum over n, y, x of grad[n, o, y, x] * x[n, c, y*s + i*d, x*s + j*d]:
        # a convolution of x (channels as batch) by grad, strides and dilations exchanged
        full = b.op("Conv", [xt, gt], strides=dilations, pads=pads + pads, dilations=strides)
        kernel = [int(k) for k in w.shape[2:]]
        cut = b.op("Slice", [full, b.ints([0] * n), b.ints(kernel), b.ints(list(range(2, x.rank)))])
        results[1] = b.op("Transpose", [cut], perm=swap)
    if mask[2]:
        results[2] = b.op("ReduceSum", [grad, b.ints([0] + list(range(2, x.rank)))], keepdims=0)
    return tuple(results)


@register("aten.addmm.default")
def _addmm(b: Builder, out: Tensor, bias: Tensor, m1: Tensor, m2: Tensor, *, beta: float = 1,
           alpha: float = 1) -> str:
    return b.op("Gemm", [m1, m2, bias], alpha=float(alpha), beta=float(beta))


@register("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def _matmul(b: Builder, out: Tensor, x: Tensor, y: Tensor) -> str:
    return b.op("MatMul", [x, y])


def _ones(b: Builder, shape: tuple, dtype: DType) -> str:
    if not all(isinstance(s, int) for s in shape):
        raise Unsupported("a norm without weights over symbolic sizes")
    return b.constant(np.ones(tuple(int(s) for s in shape), dtype.numpy), "ones")


def _zeros(b: Builder, shape: tuple, dtype: DType) -> str:
    return b.constant(np.zeros(tuple(int(s) for s in shape), dtype.numpy), "zeros")


@register("aten.native_layer_norm.default")
def _layer_norm(b: Builder, out: tuple, x: Tensor, normalized: Any, w: Tensor | None,
                bias: Tensor | None, eps: float) -> tuple:
    k = len(normalized)
    scale = w if w is not None else _ones(b, x.shape[x.rank - k:], x.dtype)
    names = b.op("LayerNormalization", [x, scale, bias], outputs=3, axis=-k, epsilon=float(eps))
    return tuple(name if i == 0 or i in b.used else None for i, name in enumerate(names))


def _batch_norm(b: Builder, out: tuple, x: Tensor, w: Tensor | None, bias: Tensor | None,
                mean: Tensor, var: Tensor, eps: float) -> tuple:
    channels = (x.shape[1],)
    y = b.op("BatchNormalization", [x, w if w is not None else _ones(b, channels, x.dtype),
                                    bias if bias is not None else _zeros(b, channels, x.dtype),
                                    mean, var], epsilon=float(eps))
    empty = [_zeros(b, tuple(t.shape), t.dtype) if t is not None and k in b.used else None
             for k, t in enumerate(out[1:], 1)]
    return (y, *empty)


@register("aten._native_batch_norm_legit_no_training.default")
def _batch_norm_inference(b: Builder, out: tuple, x: Tensor, w: Tensor | None, bias: Tensor | None,
                          mean: Tensor, var: Tensor, momentum: float, eps: float) -> tuple:
    return _batch_norm(b, out, x, w, bias, mean, var, eps)


@register("aten.native_batch_norm.default", "aten._native_batch_norm_legit.default")
def _native_batch_norm(b: Builder, out: tuple, x: Tensor, w: Tensor | None, bias: Tensor | None,
                       mean: Any, var: Any, training: bool, momentum: float, eps: float) -> tuple:
    if training or not isinstance(mean, Tensor):
        raise Unsupported("batch norm in training mode (it updates the running statistics)")
    return _batch_norm(b, out, x, w, bias, mean, var, eps)


@register("aten._softmax.default", "aten.softmax.int")
def _softmax(b: Builder, out: Tensor, x: Tensor, d: int, half_to_float: Any = False) -> str:
    return b.op("Softmax", [b.operand(x, out.dtype)], axis=dim(d, x.rank))


@register("aten._log_softmax.default", "aten.log_softmax.int")
def _log_softmax(b: Builder, out: Tensor, x: Tensor, d: int, half_to_float: Any = False) -> str:
    return b.op("LogSoftmax", [b.operand(x, out.dtype)], axis=dim(d, x.rank))


@register("aten._softmax_backward_data.default")
def _softmax_backward(b: Builder, out: Tensor, grad: Tensor, y: Tensor, d: int, dtype: Any) -> str:
    gy = b.op("Mul", [grad, y])
    total = b.op("ReduceSum", [gy, b.ints([dim(d, y.rank)])], keepdims=1)
    return b.op("Sub", [gy, b.op("Mul", [y, total])])


# --- reductions -----------------------------------------------------------------------------

def _axes(x: Tensor, dims: Any) -> list[int]:
    if dims is None or (not isinstance(dims, int) and len(dims) == 0):
        return list(range(x.rank))
    return sorted(dim(d, x.rank) for d in ([dims] if isinstance(dims, int) else dims))


def _reduce(op: str, cast: DType | None = None):
    def lower(b: Builder, out: Tensor, x: Tensor, dims: Any = None, keepdim: bool = False,
              *, dtype: Any = None) -> str:
        if x.rank == 0:
            return b.op("Identity", [b.operand(x, out.dtype)])
        src = b.operand(x, cast or out.dtype)
        r = b.op(op, [src, b.ints(_axes(x, dims))], keepdims=int(bool(keepdim)))
        return b.cast(r, cast or out.dtype, out.dtype)
    return lower


def _reduce_all(op: str, cast: DType | None = None):
    reduce = _reduce(op, cast)
    return lambda b, out, x, *, dtype=None: reduce(b, out, x, None, False)


# the default overloads of these take dims too; those of the others reduce everything
_TAKE_DIMS = ("amax", "amin", "logsumexp")
for _name, _op in {"sum": "ReduceSum", "mean": "ReduceMean", "amax": "ReduceMax",
                   "amin": "ReduceMin", "prod": "ReduceProd", "logsumexp": "ReduceLogSumExp"}.items():
    register(f"aten.{_name}.dim_IntList", f"aten.{_name}.dim", f"aten.{_name}.dim_int")(_reduce(_op))
    register(f"aten.{_name}.default")((_reduce if _name in _TAKE_DIMS else _reduce_all)(_op))
for _name, _op in {"any": "ReduceMax", "all": "ReduceMin"}.items():
    register(f"aten.{_name}.dim", f"aten.{_name}.dims")(_reduce(_op, DType.BOOL))
    register(f"aten.{_name}.default")(_reduce_all(_op, DType.BOOL))
register("aten.max.default")(_reduce_all("ReduceMax"))
register("aten.min.default")(_reduce_all("ReduceMin"))


def _extreme(reduce: str, arg: str):
    def lower(b: Builder, out: tuple, x: Tensor, d: int, keepdim: bool = False) -> tuple:
        d, keep = dim(d, x.rank), int(bool(keepdim))
        values = b.op(reduce, [x, b.ints([d])], keepdims=keep)
        indices = b.op(arg, [x], axis=d, keepdims=keep) if 1 in b.used else None
        return values, indices
    return lower


register("aten.max.dim")(_extreme("ReduceMax", "ArgMax"))
register("aten.min.dim")(_extreme("ReduceMin", "ArgMin"))


def _arg(op: str):
    def lower(b: Builder, out: Tensor, x: Tensor, d: int | None = None, keepdim: bool = False) -> str:
        if d is None:
            flat = b.op("Reshape", [x, b.ints([-1])])
            r = b.op(op, [flat], axis=0, keepdims=0)
            return b.op("Reshape", [r, b.ints([1] * x.rank)]) if keepdim else r
        return b.op(op, [x], axis=dim(d, x.rank), keepdims=int(bool(keepdim)))
    return lower


register("aten.argmax.default")(_arg("ArgMax"))
register("aten.argmin.default")(_arg("ArgMin"))


@register("aten.var.correction", "aten.var.dim")
def _var(b: Builder, out: Tensor, x: Tensor, dims: Any = None, unbiased: Any = None, keepdim: bool = False,
         *, correction: Any = None) -> str:
    axes = _axes(x, dims)
    if not all(isinstance(x.shape[a], int) for a in axes):
        raise Unsupported("variance over symbolic sizes")
    count = int(np.prod([x.shape[a] for a in axes]))
    c = correction if correction is not None else (1 if unbiased in (None, True) else 0)
    mean = b.op("ReduceMean", [x, b.ints(axes)], keepdims=1)
    diff = b.op("Sub", [x, mean])
    total = b.op("ReduceSum", [b.op("Mul", [diff, diff]), b.ints(axes)], keepdims=int(bool(keepdim)))
    return b.op("Div", [total, b.scalar(max(count - c, 0), out.dtype)])


# --- pools ----------------------------------------------------------------------------------

def _pool_attrs(n: int, kernel: Any, stride: Any, padding: Any, ceil_mode: bool) -> dict[str, Any]:
    kernel = _spatial(kernel, n, "kernel_size")
    stride = _spatial(stride, n, "stride") if stride else kernel
    pads = _spatial(padding, n, "padding")
    return {"kernel_shape": kernel, "strides": stride, "pads": pads + pads, "ceil_mode": int(bool(ceil_mode))}


def _max_pool(b: Builder, x: Tensor, kernel: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
              ceil_mode: bool = False) -> str:
    n = x.rank - 2
    return b.op("MaxPool", [x], dilations=_spatial(dilation, n, "dilation"),
                **_pool_attrs(n, kernel, stride, padding, ceil_mode))


@register("aten.max_pool2d_with_indices.default", "aten.max_pool3d_with_indices.default")
def _max_pool_with_indices(b: Builder, out: tuple, x: Tensor, *args: Any) -> tuple:
    if 1 in b.used:
        raise Unsupported("max pooling whose indices are used (its backward)")
    return _max_pool(b, x, *args), None


@register("aten.max_pool2d.default", "aten.max_pool1d.default", "aten.max_pool3d.default")
def _max_pool_values(b: Builder, out: Tensor, x: Tensor, *args: Any) -> str:
    return _max_pool(b, x, *args)


@register("aten.avg_pool2d.default", "aten.avg_pool1d.default", "aten.avg_pool3d.default")
def _avg_pool(b: Builder, out: Tensor, x: Tensor, kernel: Any, stride: Any = (), padding: Any = 0,
              ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: Any = None) -> str:
    if divisor_override is not None:
        raise Unsupported("average pooling with divisor_override")
    return b.op("AveragePool", [x], count_include_pad=int(bool(count_include_pad)),
                **_pool_attrs(x.rank - 2, kernel, stride, padding, ceil_mode))


@register("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default",
          "aten._adaptive_avg_pool3d.default", "aten.adaptive_avg_pool1d.default")
def _adaptive_avg_pool(b: Builder, out: Tensor, x: Tensor, size: Any) -> str:
    n = x.rank - 2
    size = _spatial(size, n, "output_size")
    if all(s == 1 for s in size):
        return b.op("GlobalAveragePool", [x])
    spatial = x.shape[2:]
    if not all(isinstance(s, int) and s % o == 0 for s, o in zip(spatial, size)):
        raise Unsupported(f"adaptive average pooling of {tuple(spatial)} to {size} (windows of "
                          "unequal sizes)")
    kernel = tuple(int(s) // o for s, o in zip(spatial, size))
    return b.op("AveragePool", [x], kernel_shape=kernel, strides=kernel)
