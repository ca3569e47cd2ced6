"""aarch64 code and ahead-of-time bundles: a TC kernel compiled for ARM (NEON and SVE) and
an int8 dot-product kernel (I8MM's usdot), run under qemu-user, then an ONNX model saved
as a bundle (object file, C header, weights, example main.c) that a C compiler links into
a program with no Python in it."""

import subprocess
import tempfile
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import polyfuse as pf
from polyfuse.runtime.cross import c_compiler, runner_prefix

mod = pf.define("""
def gelu(float(N) X) -> (Y) {
    Y(n) = 0.5 * X(n) * (1 + erf(X(n) * 0.7071067811865476))
}""", target="aarch64+sve")
x = np.linspace(-3, 3, 1000, dtype=np.float32)
spec = mod.gelu.specialize(x)
print("SVE instructions in the kernel:", sum(" z" in line for line in spec.stages["asm"].splitlines()))
try:
    y = mod.gelu(x)                           # under qemu-aarch64 -cpu a64fx on an x86 machine
    want = pf.define(mod.gelu.source).gelu(x)  # the reference interpreter
    print("aarch64 gelu, max |error| vs the interpreter:", float(np.abs(y - want).max()))
except pf.TargetError as err:                 # no qemu-user / cross compiler installed
    print("compiled for aarch64, not run here:", err)

# int8 dot products: dot4 sums 4 uint8 x int8 products of two int32 words; with I8MM
# that is NEON's usdot (with +dotprod only: sdot, the unsigned bytes offset by 128)
dots = pf.define("def d(int32(M, K) A, int32(K, N) B) -> (C) { C(m, n) +=! dot4(A(m, k), B(k, n)) }",
                 target="aarch64+i8mm")
rng = np.random.default_rng(0)
a8, b8 = rng.integers(0, 256, (3, 8, 4), np.uint8), rng.integers(-128, 128, (8, 10, 4), np.int8)
words = a8.view(np.int32)[..., 0], b8.view(np.int32)[..., 0]
asm = dots.d.specialize(*words).stages["asm"]
print("usdot instructions in the dot4 kernel:", sum("usdot" in line for line in asm.splitlines()))
try:
    want = np.einsum("mkj,knj->mn", a8.astype(np.int32), b8.astype(np.int32))
    print("aarch64 dot4 equals numpy:", bool((dots.d(*words) == want).all()))  # qemu -cpu max
except pf.TargetError as err:
    print("compiled for aarch64, not run here:", err)

init = {"W": rng.standard_normal((8, 16)).astype(np.float32) / 4,
        "b": rng.standard_normal(8).astype(np.float32)}
model = helper.make_model(helper.make_graph(
    [helper.make_node("Gemm", ["x", "W", "b"], ["h"], transB=1),
     helper.make_node("Relu", ["h"], ["y"])], "tiny",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
    [numpy_helper.from_array(a, n) for n, a in init.items()]),
    opset_imports=[helper.make_opsetid("", 17)])

for target in ("x86", "aarch64"):
    compiled = pf.compile(model, target=target)
    out = Path(tempfile.mkdtemp()) / target
    files = compiled.save_bundle(out, "tiny")            # what `polyfuse compile -o` writes
    print(f"{target} bundle:", " ".join(f.name for f in files))
    print("\n".join((out / "tiny.h").read_text().splitlines()[7:13]))
    try:
        tgt = pf.Target.parse(target)
        subprocess.run([*c_compiler(tgt), str(out / "main.c"), str(out / "tiny.o"), "-o",
                        str(out / "tiny_main"), "-lm"], check=True)
        printed = subprocess.run([*runner_prefix(tgt), str(out / "tiny_main"),
                                  str(out / "tiny.weights.bin")], capture_output=True, text=True,
                                 check=True).stdout
    except pf.TargetError as err:
        print("not linked here:", err)
        continue
    print(printed.strip())
    # main.c fills x with 0.25 * ((i % 7) - 3); polyfuse.compile(...).run agrees
    x = (0.25 * (np.arange(32) % 7 - 3)).astype(np.float32).reshape(2, 16)
    ours = np.array(printed.splitlines()[1].split(), np.float32).reshape(2, 8)
    assert np.allclose(ours, compiled.run({"x": x})["y"], rtol=1e-6, atol=1e-6)
    print(f"the {target} program prints what compiled.run returns")
