"""Gradients of TC definitions: polyfuse derives the backward definitions (TC text you
can read), compiles them like any other, and makes each definition a torch operator."""

import numpy as np

import polyfuse as pf

CONV = """
def conv_stride2(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
  O(n, f, h, w) +=! I(n, c, 2 * h + kh, 2 * w + kw) * Wt(f, c, kh, kw)
}
"""

# one derived definition per float input; each is one kernel
print(pf.grad(CONV))

# the derived definitions run on numpy like any other: check one against finite differences
rng = np.random.default_rng(0)
I = rng.standard_normal((1, 2, 7, 7))
Wt = rng.standard_normal((3, 2, 3, 3))
src = CONV.replace("float(", "double(")
forward = pf.define(src).conv_stride2
dO = rng.standard_normal(forward(I, Wt).shape)
dWt = pf.define(pf.grad(src, wrt="Wt")).conv_stride2_grad_Wt(I, Wt, dO)
V = rng.standard_normal(Wt.shape)
eps = 1e-6
numeric = (np.sum(dO * forward(I, Wt + eps * V)) - np.sum(dO * forward(I, Wt - eps * V))) / (2 * eps)
print(f"d<dO, O>/dWt along a direction: derived {np.sum(dWt * V):.8f}, finite differences {numeric:.8f}")
assert abs(np.sum(dWt * V) - numeric) < 1e-6 * max(1.0, abs(numeric))

try:
    import torch
except ImportError:
    print("torch is not installed: skipping the torch operators")
else:
    from polyfuse.torch.define import define

    ops = define(CONV + """
def layernorm(float(N, D) X, float(D) gamma, float(D) beta) -> (Y, mean, var) {
  mean(n) +=! X(n, d) / float(D)
  var(n) +=! (X(n, d) - mean(n)) * (X(n, d) - mean(n)) / float(D)
  Y(n, d) = (X(n, d) - mean(n)) * rsqrt(var(n) + 1e-5) * gamma(d) + beta(d)
}
""", target="host")
    x = torch.randn(4, 16, requires_grad=True)
    g, b = torch.ones(16, requires_grad=True), torch.zeros(16, requires_grad=True)
    y, _, _ = ops.layernorm(x, g, b)
    (y * torch.arange(16.0)).sum().backward()
    x2 = x.detach().requires_grad_()
    (torch.nn.functional.layer_norm(x2, (16,), eps=1e-5) * torch.arange(16.0)).sum().backward()
    print("layernorm: max |dX - torch's dX| =", float((x.grad - x2.grad).abs().max()))
    assert torch.allclose(x.grad, x2.grad, atol=1e-4)
    xd = torch.randn(1, 2, 7, 6, dtype=torch.float64, requires_grad=True)
    wd = torch.randn(3, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    checked = torch.autograd.gradcheck(ops.conv_stride2, (xd, wd), fast_mode=True)
    print("conv gradcheck (float64):", checked)
    assert checked
