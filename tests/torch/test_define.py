"""TC definitions as torch operators: forward against eager PyTorch, derived backward
through torch.autograd.gradcheck and gradgradcheck (float64), torch.compile, one kernel
per gradient."""

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import numpy as np  # noqa: E402

import polyfuse as pf  # noqa: E402
from polyfuse.frontends.tc import parse  # noqa: E402
from polyfuse.torch.define import define, grad  # noqa: E402
from tests.tc_programs import PROGRAMS_BY_NAME  # noqa: E402

# the canonical programs' definitions, and an embedding with an integer input and a scalar
SOURCE = "\n".join(PROGRAMS_BY_NAME[p].source for p in (
    "matmul", "conv2d_stride2", "group_conv", "kronecker3", "layernorm", "softmax", "maxpool")) + """
def embedding(float(V,D) E, int32(B) Idx, float scale) -> (O) {
    O(b,d) = scale * E(Idx(b), d)
}
"""

OPS = define(SOURCE)


def _inputs(dtype):
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype, requires_grad=True)
    return {
        "matmul": (r(5, 7), r(7, 4)),
        "conv2d_s2": (r(2, 3, 9, 8), r(4, 3, 3, 3)),
        "group_conv": (r(1, 2, 3, 6, 5), r(2, 2, 3, 3, 2)),
        "kru3": (r(2, 3, 2, 4), r(3, 4), r(2, 2), r(2, 3)),
        "layernorm": (r(3, 6), r(6), r(6), 1e-5),
        "softmax": (r(3, 7),),
        "embedding": (r(6, 4), torch.tensor([0, 5, 2, 2, 3], dtype=torch.int32), 1.5),
        "maxpool": (r(1, 2, 7, 7),),
    }


def _eager(name, *a):
    if name == "matmul":
        return a[0] @ a[1]
    if name == "conv2d_s2":
        return F.conv2d(a[0], a[1], stride=2)
    if name == "group_conv":
        I, W = a
        n, g, c, h, w = I.shape
        out = F.conv2d(I.reshape(n, g * c, h, w), W.reshape(-1, c, *W.shape[3:]), groups=g)
        return out.reshape(n, g, W.shape[1], *out.shape[2:])
    if name == "kru3":
        X, W2, W1, W0 = a
        xw2 = torch.einsum("mabc,dc->mabd", X, W2)
        xw2w1 = torch.einsum("mabd,eb->maed", xw2, W1)
        return xw2, xw2w1, torch.einsum("maed,fa->mfed", xw2w1, W0)
    if name == "layernorm":
        X, gamma, beta, eps = a
        mean, var = X.mean(1), X.var(1, unbiased=False)
        return F.layer_norm(X, X.shape[1:], gamma, beta, eps), mean, var
    if name == "softmax":
        x = a[0]
        mx = x.amax(1)
        return torch.softmax(x, 1), mx, torch.exp(x - mx[:, None]).sum(1)
    if name == "embedding":
        return a[2] * F.embedding(a[1].long(), a[0])
    if name == "maxpool":
        return F.max_pool2d(a[0], 3, stride=2)
    raise KeyError(name)


NAMES = sorted(_inputs(torch.float64))


@pytest.mark.unit
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_forward_equals_eager(name, dtype):
    args = _inputs(dtype)[name]
    got = getattr(OPS, name)(*args)
    want = _eager(name, *args)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for g, w in zip(got, want):
        assert g.dtype == dtype and g.shape == w.shape
        torch.testing.assert_close(g, w.detach(), rtol=tol, atol=tol)


@pytest.mark.unit
@pytest.mark.parametrize("name", NAMES)
def test_gradcheck(name):
    args = _inputs(torch.float64)[name]
    # the larger ones along random directions (fast mode), the others element by element
    fast = name in ("conv2d_s2", "group_conv", "kru3", "maxpool")
    assert torch.autograd.gradcheck(getattr(OPS, name), args, fast_mode=fast)


@pytest.mark.unit
@pytest.mark.parametrize("name", ["matmul", "layernorm", "softmax"])
def test_float32_backward_equals_eager(name):
    args = _inputs(torch.float32)[name]
    outs = getattr(OPS, name)(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    weights = [torch.randn(o.shape, generator=torch.Generator().manual_seed(1)) for o in outs]
    tensors = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    got = torch.autograd.grad(sum((w * o).sum() for w, o in zip(weights, outs)), tensors)
    eager = _eager(name, *args)
    eager = eager if isinstance(eager, tuple) else (eager,)
    want = torch.autograd.grad(sum((w * o).sum() for w, o in zip(weights, eager)), tensors)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.unit
def test_integer_inputs_and_scalars_get_no_gradient():
    E, idx, scale = _inputs(torch.float64)["embedding"]
    out = OPS.embedding(E, idx, scale)
    out.sum().backward()
    expected = torch.zeros_like(E).index_add_(0, idx.long(), torch.full((5, 4), scale, dtype=torch.float64))
    torch.testing.assert_close(E.grad, expected)


def _backward_graph(fn, *args):
    """The ops of the backward graph AOTAutograd makes for ``fn``, and its forward result."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    graphs = {}

    def keep(kind):
        def compiler(gm, _):
            graphs[kind] = gm
            return make_boxed_func(gm.forward)
        return compiler
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=aot_autograd(fw_compiler=keep("forward"),
                                                      bw_compiler=keep("backward")), fullgraph=True)
    compiled(*args).sum().backward()
    return [str(n.target) for n in graphs["backward"].graph.nodes if n.op == "call_function"]


@pytest.mark.unit
@pytest.mark.parametrize("name", ["matmul", "conv2d_s2"])
def test_derived_backward_is_one_kernel_per_gradient(name):
    ops = _backward_graph(getattr(OPS, name), *_inputs(torch.float32)[name])
    polyfuse_ops = [o for o in ops if o.startswith("polyfuse.")]
    assert len(polyfuse_ops) == 2 and len({o.split("_grad_")[1] for o in polyfuse_ops}) == 2
    for g in parse(grad(SOURCE, name=name)).definitions:
        assert len(g.statements) == 1 and len(g.outputs) == 1


def test_torch_compile_forward_and_backward():
    A, B = _inputs(torch.float32)["matmul"]
    f = torch.compile(lambda a, b: torch.relu(OPS.matmul(a, b)).sum(), fullgraph=True)
    f(A, B).backward()
    A2, B2 = (t.detach().requires_grad_() for t in (A, B))
    torch.relu(A2 @ B2).sum().backward()
    torch.testing.assert_close(A.grad, A2.grad)
    torch.testing.assert_close(B.grad, B2.grad)


@pytest.mark.unit
def test_opcheck():
    result = torch.library.opcheck(OPS.matmul, (torch.randn(3, 4), torch.randn(4, 2)))
    assert set(result.values()) == {"SUCCESS"}


def test_host_target():
    op = define(SOURCE, target="host", name="conv2d_s2")
    I, W = _inputs(torch.float32)["conv2d_s2"]
    out = op(I, W)
    torch.testing.assert_close(out, F.conv2d(I, W, stride=2), rtol=1e-4, atol=1e-4)
    out.sum().backward()
    I2, W2 = (t.detach().requires_grad_() for t in (I, W))
    F.conv2d(I2, W2, stride=2).sum().backward()
    torch.testing.assert_close(I.grad, I2.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(W.grad, W2.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.unit
def test_strided_and_numpy_backed_inputs():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    A = torch.from_numpy(a)                      # the same memory as a
    B = torch.arange(8, dtype=torch.float32).reshape(2, 4).T     # not contiguous
    torch.testing.assert_close(OPS.matmul(A, B), torch.from_numpy(a @ B.numpy()))


@pytest.mark.unit
def test_names_and_errors():
    assert define(SOURCE, name="matmul") is OPS.matmul      # one op per definition and source
    assert grad is pf.grad
    with pytest.raises(pf.ArgumentError, match="no definition 'mm'"):
        define(SOURCE, name="mm")
    with pytest.raises(AttributeError, match="no definition 'mm'"):
        OPS.mm
    with pytest.raises(pf.DTypeError):
        OPS.matmul(torch.ones(2, 2, dtype=torch.int32), torch.ones(2, 2, dtype=torch.int32))


@pytest.mark.parametrize("name", ["matmul", "softmax", "layernorm"])
def test_gradients_of_gradients(name):
    # the derived gradient definitions are torch operators with derived gradients too
    assert torch.autograd.gradgradcheck(getattr(OPS, name), _inputs(torch.float64)[name])
