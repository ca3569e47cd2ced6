"""ATen ops that move data: views, permutes, expand, cat, slices, index/gather, and
those that make tensors (full, arange) and read sizes (sym_size, getitem)."""

from __future__ import annotations

from typing import Any

import numpy as np

from polyfuse.frontends.torch.builder import Builder, Size, Tensor, Unsupported
from polyfuse.frontends.torch.registry import register
from polyfuse.ir.types import DType

INT64_MAX = 2 ** 63 - 1


def dim(d: int, rank: int) -> int:
    if not -max(rank, 1) <= d < max(rank, 1):
        raise Unsupported(f"dimension {d} is out of range for rank {rank}")
    return d % rank if rank else 0


@register("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
          "aten.view_copy.default")
def _view(b: Builder, out: Tensor, x: Tensor, size: Any) -> str:
    return b.op("Reshape", [x, b.shape(size)])


@register("aten.permute.default", "aten.permute_copy.default")
def _permute(b: Builder, out: Tensor, x: Tensor, dims: Any) -> str:
    return b.op("Transpose", [x], perm=tuple(dim(d, x.rank) for d in dims))


@register("aten.transpose.int")
def _transpose(b: Builder, out: Tensor, x: Tensor, d0: int, d1: int) -> str:
    perm = list(range(x.rank))
    d0, d1 = dim(d0, x.rank), dim(d1, x.rank)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return b.op("Transpose", [x], perm=tuple(perm))


@register("aten.t.default", "aten.numpy_T.default")
def _t(b: Builder, out: Tensor, x: Tensor) -> str:
    return b.op("Transpose", [x], perm=tuple(reversed(range(x.rank))))


@register("aten.expand.default", "aten.expand_copy.default")
def _expand(b: Builder, out: Tensor, x: Tensor, size: Any, *, implicit: bool = False) -> str:
    # -1 keeps a dimension: Expand's broadcasting keeps it for a target size of 1
    return b.op("Expand", [x, b.shape([1 if isinstance(s, int) and s == -1 else s for s in size])])


@register("aten.unsqueeze.default", "aten.unsqueeze_copy.default")
def _unsqueeze(b: Builder, out: Tensor, x: Tensor, d: int) -> str:
    return b.op("Unsqueeze", [x, b.ints([dim(d, x.rank + 1)])])


@register("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default",
          "aten.squeeze_copy.dims", "aten.squeeze_copy.dim")
def _squeeze(b: Builder, out: Tensor, x: Tensor, dims: Any = None) -> str:
    if dims is None:
        dims = [k for k, s in enumerate(x.shape) if s == 1]
    dims = [dims] if isinstance(dims, int) else list(dims)
    # torch leaves a dimension that is not 1 in place; squeezing it is an error in ONNX
    dims = [dim(d, x.rank) for d in dims if x.shape[dim(d, x.rank)] == 1]
    return b.op("Identity", [x]) if not dims else b.op("Squeeze", [x, b.ints(dims)])


@register("aten.cat.default", "aten.concat.default")
def _cat(b: Builder, out: Tensor, tensors: Any, d: int = 0) -> str:
    parts = [t for t in tensors if not (t.rank == 1 and t.shape[0] == 0)]  # torch skips empty 1-d
    if not parts:
        return b.constant(np.zeros(tuple(int(s) for s in out.shape), out.dtype.numpy))
    return b.op("Concat", [b.operand(t, out.dtype) for t in parts], axis=dim(d, out.rank))


def _bound(v: Any) -> Any:
    return min(v, INT64_MAX) if isinstance(v, int) else v


@register("aten.slice.Tensor", "aten.slice_copy.Tensor")
def _slice(b: Builder, out: Tensor, x: Tensor, d: int = 0, start: Any = None, end: Any = None,
           step: int = 1) -> str:
    d = dim(d, x.rank)
    start = 0 if start is None else _bound(start)
    end = INT64_MAX if end is None else _bound(end)
    if start == 0 and end == INT64_MAX and step == 1:
        return b.op("Identity", [x])
    return b.op("Slice", [x, b.shape([start]), b.shape([end]), b.ints([d]), b.ints([step])])


@register("aten.narrow.default")
def _narrow(b: Builder, out: Tensor, x: Tensor, d: int, start: int, length: int) -> str:
    if not isinstance(start, int) or not isinstance(length, int):
        raise Unsupported("narrow with symbolic bounds")
    return _slice(b, out, x, d, start, start + length)


@register("aten.select.int", "aten.select_copy.int")
def _select(b: Builder, out: Tensor, x: Tensor, d: int, index: Any) -> str:
    if not isinstance(index, int):
        raise Unsupported("select at a symbolic index")
    return b.op("Gather", [x, b.constant(np.array(index, np.int64), "index")], axis=dim(d, x.rank))


def _pieces(b: Builder, x: Tensor, d: int, sizes: list[int]) -> tuple[str, ...]:
    names, start = [], 0
    for s in sizes:
        names.append(b.op("Slice", [x, b.ints([start]), b.ints([start + s]), b.ints([d])]))
        start += s
    return tuple(names)


@register("aten.split.Tensor", "aten.split_copy.Tensor")
def _split(b: Builder, out: tuple, x: Tensor, size: int, d: int = 0) -> tuple[str, ...]:
    d = dim(d, x.rank)
    return _pieces(b, x, d, [int(t.shape[d]) for t in out])


@register("aten.split_with_sizes.default", "aten.split_with_sizes_copy.default")
def _split_sizes(b: Builder, out: tuple, x: Tensor, sizes: Any, d: int = 0) -> tuple[str, ...]:
    if not all(isinstance(s, int) for s in sizes):
        raise Unsupported("split into symbolic sizes")
    return _pieces(b, x, dim(d, x.rank), list(sizes))


@register("aten.unbind.int")
def _unbind(b: Builder, out: tuple, x: Tensor, d: int = 0) -> tuple[str, ...]:
    d = dim(d, x.rank)
    return tuple(b.op("Squeeze", [p, b.ints([d])]) for p in _pieces(b, x, d, [1] * len(out)))


@register("aten.repeat.default")
def _repeat(b: Builder, out: Tensor, x: Tensor, repeats: Any) -> str:
    repeats = list(repeats)
    if len(repeats) > x.rank:   # torch adds leading dimensions of size 1 first
        x = Tensor(b.op("Reshape", [x, b.ints([1] * (len(repeats) - x.rank) + [0] * x.rank)]),
                   x.dtype, (1,) * (len(repeats) - x.rank) + x.shape)
    return b.op("Tile", [x, b.shape(repeats)])


@register("aten.constant_pad_nd.default")
def _pad(b: Builder, out: Tensor, x: Tensor, pad: Any, value: float = 0) -> str:
    pad = list(pad)
    if not all(isinstance(p, int) for p in pad):
        raise Unsupported("padding by symbolic sizes")
    begins, ends = [0] * x.rank, [0] * x.rank
    for k in range(len(pad) // 2):   # torch lists (begin, end) pairs from the last dimension
        begins[x.rank - 1 - k], ends[x.rank - 1 - k] = pad[2 * k], pad[2 * k + 1]
    return b.op("Pad", [x, b.ints(begins + ends), b.scalar(value, x.dtype)], mode="constant")


@register("aten.embedding.default")
def _embedding(b: Builder, out: Tensor, weight: Tensor, indices: Tensor, *args: Any) -> str:
    return b.op("Gather", [weight, indices], axis=0)


@register("aten.index.Tensor", "aten._unsafe_index.Tensor")
def _index(b: Builder, out: Tensor, x: Tensor, indices: Any) -> str:
    given = [(k, i) for k, i in enumerate(indices) if i is not None]
    if len(given) != 1:
        raise Unsupported("indexing with more than one index tensor")
    k, index = given[0]
    if index.dtype.is_bool:
        raise Unsupported("indexing with a boolean mask (the result's size depends on the data)")
    return b.op("Gather", [x, b.operand(index, DType.INT64)], axis=k)


@register("aten.gather.default")
def _gather(b: Builder, out: Tensor, x: Tensor, d: int, index: Tensor, *, sparse_grad: bool = False) -> str:
    return b.op("GatherElements", [x, index], axis=dim(d, x.rank))


def _static(out: Tensor) -> tuple[int, ...]:
    if not all(isinstance(s, int) for s in out.shape):
        raise Unsupported("a new tensor of symbolic size")
    return tuple(int(s) for s in out.shape)


def _filled(b: Builder, out: Tensor, value: Any, like: Tensor | None = None) -> str:
    if like is not None and not all(isinstance(s, int) for s in like.shape):
        return b.op("Expand", [b.scalar(value, out.dtype), b.op("Shape", [like])])
    return b.constant(np.full(_static(out), value, out.dtype.numpy), "full")


@register("aten.full.default", "aten.new_full.default")
def _full(b: Builder, out: Tensor, *args: Any, **kwargs: Any) -> str:
    value = args[-1] if args else kwargs["fill_value"]
    if not isinstance(value, (bool, int, float)):
        raise Unsupported("a fill value that is not a number")
    if not all(isinstance(s, int) for s in out.shape):
        return b.op("Expand", [b.scalar(value, out.dtype), b.shape(args[-2])])
    return _filled(b, out, value)


@register("aten.full_like.default")
def _full_like(b: Builder, out: Tensor, x: Tensor, value: Any, **kwargs: Any) -> str:
    return _filled(b, out, value, x)


@register("aten.zeros_like.default", "aten.empty_like.default")
def _zeros_like(b: Builder, out: Tensor, x: Tensor, **kwargs: Any) -> str:
    return _filled(b, out, 0, x)


@register("aten.ones_like.default")
def _ones_like(b: Builder, out: Tensor, x: Tensor, **kwargs: Any) -> str:
    return _filled(b, out, 1, x)


@register("aten.zeros.default", "aten.new_zeros.default", "aten.empty.memory_format",
          "aten.new_empty.default")
def _zeros(b: Builder, out: Tensor, *args: Any, **kwargs: Any) -> str:
    return _filled(b, out, 0)


@register("aten.ones.default", "aten.new_ones.default")
def _ones(b: Builder, out: Tensor, *args: Any, **kwargs: Any) -> str:
    return _filled(b, out, 1)


@register("aten.scalar_tensor.default")
def _scalar_tensor(b: Builder, out: Tensor, value: Any, **kwargs: Any) -> str:
    return _filled(b, out, value)


@register("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def _arange(b: Builder, out: Tensor, *args: Any, **kwargs: Any) -> str:
    if not all(isinstance(a, (int, float)) for a in args):
        raise Unsupported("arange with symbolic bounds")
    return b.constant(np.arange(*args, dtype=out.dtype.numpy), "arange")


@register("aten.sym_size.int")
def _sym_size(b: Builder, out: Any, x: Tensor, d: int) -> str:
    d = dim(d, x.rank)
    return b.op("Shape", [x], start=d, end=d + 1)


@register("operator.getitem")
def _getitem(b: Builder, out: Any, values: Any, k: int) -> Any:
    if not isinstance(values, tuple) or not isinstance(k, int):
        raise Unsupported("getitem of something other than an op's outputs")
    got = values[k]
    if got is None:
        raise Unsupported(f"output {k} of the op is not computed")
    return got.name if isinstance(got, (Tensor, Size)) else got
