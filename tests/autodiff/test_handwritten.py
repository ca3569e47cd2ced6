"""Derived gradients equal backward definitions written by hand (float64, reference)."""

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.lowering.autodiff import gradients
from tests.autodiff.fd import compiled, outputs, run_gradient, widened
from tests.tc_programs import PROGRAMS_BY_NAME

pytestmark = pytest.mark.unit

HAND = {
    # C = A B: each gradient is one contraction
    "matmul": ("""
def matmul_bwd(float(M,K) A, float(K,N) B, float(M,N) gC) -> (dA, dB) {
    dA(m,k) +=! gC(m,n) * B(k,n)
    dB(k,n) +=! A(m,k) * gC(m,n)
}
""", ["A", "B", "gC"], {"A": "dA", "B": "dB"}),
    # stride 2: dO spread onto every other pixel, then a full correlation with Wt
    "conv2d_stride2": ("""
def conv_bwd(float(N,C,H,W) I, float(M,C,KH,KW) Wt, float(N,M,HO,WO) gO) -> (U, dI, dWt) {
    U(n,m,y,x) = (y % 2 == 0 && x % 2 == 0) ? gO(n,m,y/2,x/2) : 0.0
        where y in 0:2*HO-1, x in 0:2*WO-1
    dI(n,c,h,w) +=! (h >= kh && h - kh < 2*HO-1 && w >= kw && w - kw < 2*WO-1)
                    ? U(n,m,h-kh,w-kw) * Wt(m,c,kh,kw) : 0.0
        where h in 0:H, w in 0:W, n in 0:N, c in 0:C, m in 0:M, kh in 0:KH, kw in 0:KW
    dWt(m,c,kh,kw) +=! gO(n,m,h,w) * I(n,c,2*h+kh,2*w+kw) where kh in 0:KH, kw in 0:KW
}
""", ["I", "Wt", "gO"], {"I": "dI", "Wt": "dWt"}),
    # dO padded by the kernel size, convolved with the flipped kernel
    "group_conv": ("""
def gconv_bwd(float(N,G,C,H,W) I, float(G,F,C,KH,KW) Wt, float(N,G,F,HO,WO) gO) -> (P, dI, dWt) {
    P(n,g,f,y,x) = (y >= KH-1 && y-(KH-1) < HO && x >= KW-1 && x-(KW-1) < WO)
                   ? gO(n,g,f,y-(KH-1),x-(KW-1)) : 0.0
        where n in 0:N, g in 0:G, f in 0:F, y in 0:HO+2*KH-2, x in 0:WO+2*KW-2
    dI(n,g,c,h,w) +=! P(n,g,f,h+kh,w+kw) * Wt(g,f,c,KH-1-kh,KW-1-kw)
        where h in 0:H, w in 0:W, kh in 0:KH, kw in 0:KW
    dWt(g,f,c,kh,kw) +=! gO(n,g,f,h,w) * I(n,g,c,h+kh,w+kw) where kh in 0:KH, kw in 0:KW
}
""", ["I", "Wt", "gO"], {"I": "dI", "Wt": "dWt"}),
    # each temporary gets its own incoming gradient plus what the next product sends back
    "kronecker3": ("""
def kru3_bwd(float(M,N0,N1,N2) X, float(D2,N2) W2, float(D1,N1) W1, float(D0,N0) W0,
             float(M,N0,N1,D2) XW2, float(M,N0,D1,D2) XW2W1,
             float(M,N0,N1,D2) gA, float(M,N0,D1,D2) gB, float(M,D0,D1,D2) gY)
    -> (dB, dA, dX, dW2, dW1, dW0)
{
    dB(m,n0,d1,d2) +=! gY(m,d0,d1,d2) * W0(d0,n0)
    dB(m,n0,d1,d2) = dB(m,n0,d1,d2) + gB(m,n0,d1,d2)
    dW0(d0,n0) +=! gY(m,d0,d1,d2) * XW2W1(m,n0,d1,d2)
    dA(m,n0,n1,d2) +=! dB(m,n0,d1,d2) * W1(d1,n1)
    dA(m,n0,n1,d2) = dA(m,n0,n1,d2) + gA(m,n0,n1,d2)
    dW1(d1,n1) +=! dB(m,n0,d1,d2) * XW2(m,n0,n1,d2)
    dX(m,n0,n1,n2) +=! dA(m,n0,n1,d2) * W2(d2,n2)
    dW2(d2,n2) +=! dA(m,n0,n1,d2) * X(m,n0,n1,n2)
}
""", ["X", "W2", "W1", "W0", "XW2", "XW2W1", "gA", "gB", "gY"],
        {"X": "dX", "W2": "dW2", "W1": "dW1", "W0": "dW0"}),
    # g = gY * gamma; the mean and variance outputs have gradients of their own
    "layernorm": ("""
def layernorm_bwd(float(N,D) X, float(D) gamma, float eps, float(N) mean, float(N) var,
                  float(N,D) gY, float(N) gmean, float(N) gvar) -> (Sg, Sgx, dvar, dmean, dX, dgamma, dbeta) {
    Sg(n) +=! gY(n,d) * gamma(d)
    Sgx(n) +=! gY(n,d) * gamma(d) * (X(n,d) - mean(n))
    dvar(n) = gvar(n) - 0.5 * Sgx(n) * rsqrt(var(n) + eps) / (var(n) + eps)
    dmean(n) = gmean(n) - Sg(n) * rsqrt(var(n) + eps)
    dX(n,d) = gY(n,d) * gamma(d) * rsqrt(var(n) + eps)
              + dvar(n) * 2.0 * (X(n,d) - mean(n)) / float(D) + dmean(n) / float(D)
    dgamma(d) +=! gY(n,d) * (X(n,d) - mean(n)) * rsqrt(var(n) + eps)
    dbeta(d) +=! gY(n,d)
}
""", ["X", "gamma", "eps", "mean", "var", "gY", "gmean", "gvar"],
        {"X": "dX", "gamma": "dgamma", "beta": "dbeta"}),
    # O does not depend on the max; expSum does, and the max goes to its arg-max
    "softmax": ("""
def softmax_bwd(float(N,D) I, float(N,D) O, float(N) maxVal, float(N) expSum,
                float(N,D) gO, float(N) gM, float(N) gS) -> (Dot, Ties, dI) {
    Dot(n) +=! gO(n,d) * O(n,d)
    Ties(n) +=! I(n,d) == maxVal(n) ? 1.0 : 0.0
    dI(n,d) = O(n,d) * (gO(n,d) - Dot(n)) + gS(n) * exp(I(n,d) - maxVal(n))
              + (I(n,d) == maxVal(n) ? (gM(n) - gS(n) * expSum(n)) / Ties(n) : 0.0)
}
""", ["I", "O", "maxVal", "expSum", "gO", "gM", "gS"], {"I": "dI"}),
}


def _float64(source: str) -> str:
    return source.replace("float(", "double(").replace("float eps", "double eps")


@pytest.mark.parametrize("name", sorted(HAND))
def test_derived_gradient_equals_hand_written(name):
    program = PROGRAMS_BY_NAME[name]
    hand_source, hand_args, results = HAND[name]
    d = widened(program.source, program.entry)
    rng = np.random.default_rng(3)
    args = [np.asarray(a, np.float64) if isinstance(a, np.ndarray) else a
            for a in program.make_inputs(rng)]
    forward = outputs(compiled(d), args)
    weights = [rng.standard_normal(o.shape) for o in forward]
    values = {p.name: a for p, a in zip(d.params, args)}
    values.update({t.name: o for t, o in zip(d.outputs, forward)})
    # the hand-written definitions call the output gradients g<first letters>
    hand = getattr(pf.define(_float64(hand_source)), hand_source.split("def ")[1].split("(")[0])
    grads = [a for a in hand_args if a.startswith("g") and a not in values]
    by_output = dict(zip(grads, _order(grads, [t.name for t in d.outputs], weights)))
    hand_out = outputs(hand, [values.get(a, by_output.get(a)) for a in hand_args])
    hand_by_name = dict(zip(_outputs_of(hand_source), hand_out))
    derived = {g.wrt: g for g in gradients(d)}
    assert set(derived) == set(results)
    for wrt, result in results.items():
        got = run_gradient(derived[wrt], d, args, weights)
        np.testing.assert_allclose(got, hand_by_name[result], rtol=1e-10, atol=1e-11,
                                   err_msg=f"{name}: gradient of {wrt}")


def _order(grads: list[str], outs: list[str], weights: list[np.ndarray]) -> list[np.ndarray]:
    """The output gradient each hand parameter g<Name> stands for: the output whose name
    starts like <Name> (gO -> O, gM -> maxVal, gS -> expSum, gA -> XW2, gB -> XW2W1)."""
    aliases = {"gM": "maxVal", "gS": "expSum", "gA": "XW2", "gB": "XW2W1"}
    by_name = dict(zip(outs, weights))
    return [by_name[aliases.get(g, g[1:])] for g in grads]


def _outputs_of(source: str) -> list[str]:
    head = source.split("->")[1].split("{")[0]
    return [n.strip() for n in head.strip().strip("()").split(",")]
