"""TC compiled for NVIDIA GPUs: the GPU mapping, CUDA C, PTX, ptxas's resources and the
SASS of the inner loop, the tensor cores with precision="tf32", split-k (its epilogue in
the launch that adds the slices), 32-bit indices and softmax's 128-bit row accesses; run
where a GPU exists.

Compiling needs only NVRTC (pip install cuda-python nvidia-cuda-nvrtc), so this example
shows every stage on any machine; with an NVIDIA GPU and its driver it also runs the
kernels and checks them against numpy.
"""

import numpy as np

import polyfuse as pf
from polyfuse.runtime.arguments import placeholder
from polyfuse.targets.cuda_sass import Mix, instruction_mix, nvdisasm, resources

SOURCE = """
def matmul(float(M, K) A, float(K, N) B) -> (C) {
  C(m, n) +=! A(m, k) * B(k, n)
}
def fc_relu(float(B, M) I, float(N, M) W, float(N) bias) -> (O) {
  O(b, n) +=! I(b, m) * W(n, m)
  O(b, n) = fmax(O(b, n) + bias(n), 0.0)
}
def softmax(float(N, D) I) -> (O, maxVal, expSum) {
  maxVal(n) max=! I(n, d)
  O(n, d) = exp(I(n, d) - maxVal(n))
  expSum(n) +=! O(n, d)
  O(n, d) = O(n, d) / expSum(n)
}
"""

mod = pf.define(SOURCE, target="cuda")

# specialize with placeholders: shapes and dtypes only, no data and no GPU needed
matmul = mod.matmul.specialize(placeholder((512, 256), np.float32), placeholder((256, 384), np.float32))
print(matmul.stages["options"])
print("\n".join(matmul.stages["gpu"].splitlines()[:22]), "\n  ...")   # blocks, threads, shared tiles
cuda = matmul.stages["cuda"]
print(cuda[cuda.index('extern "C"'):][:900], "\n  ...")
ptx = matmul.stages["ptx"]
print(f"PTX: {len(ptx.splitlines())} lines, {ptx.count('bar.sync')} barriers, "
      f"{ptx.count('ld.shared')} shared loads; {matmul.stages['cubin']}")

# what ptxas made of it, read without a GPU: resources, and the SASS of the inner loop
(used,) = resources(matmul.stages["ptxas"]).values()
print(f"ptxas: {used.registers} registers, {used.shared_bytes} B shared memory, "
      f"{used.spill_stores + used.spill_loads} B spilled")
if nvdisasm() is not None:
    (mix,) = instruction_mix(matmul.stages["sass"]).values()
    ffma, lds = Mix.count(mix.inner_loop, "FFMA"), Mix.count(mix.inner_loop, "LDS")
    print(f"SASS inner loop: {ffma} FFMA, {lds} LDS ({ffma / lds:.2f} FFMA per shared load)")
    assert ffma > 0 and lds > 0

# tensor cores: bfloat16 operands always, float32 ones where precision="tf32" allows
tf32 = pf.define(SOURCE, target="cuda", precision="tf32").matmul
on_units = tf32.specialize(placeholder((512, 256), np.float32), placeholder((256, 384), np.float32))
print("\n".join(line for line in on_units.stages["gpu"].splitlines() if "warps" in line or "tile mma" in line))
if nvdisasm() is not None:
    (mix,) = instruction_mix(on_units.stages["sass"]).values()
    print(f"precision='tf32': {Mix.count(mix.inner_loop, 'HMMA')} HMMA in the inner loop")
    assert Mix.count(mix.inner_loop, "HMMA") > 0

# a deep sum over few output tiles: split-k, its slices on blocks of their own, then a
# second launch adds them (the slices' sums in scratch memory, "temp"); indices in int
skinny = mod.matmul.specialize(placeholder((128, 4096), np.float32), placeholder((4096, 256), np.float32))
gpu = skinny.stages["gpu"].splitlines()
print(f"128x4096x256: split_k={skinny.stages['options'].split('split_k=')[1].rstrip(')')}, "
      f"{sum('launch ' in line for line in gpu)} launches;", gpu[0].split("(", 1)[1].rstrip(" {)"))
print("32-bit indices:", "for (int " in skinny.stages["cuda"] and "for (long long" not in skinny.stages["cuda"])
# with a bias and a ReLU after it: the launch that adds the slices applies them too (the
# launches over the same blocks, each block reading back only its own outputs, fused)
layer = mod.fc_relu.specialize(placeholder((128, 4096), np.float32), placeholder((256, 4096), np.float32),
                               placeholder((256,), np.float32))
print("fc + bias + ReLU, split-k:", sum("launch " in line for line in layer.stages["gpu"].splitlines()), "launches")

softmax = mod.softmax.specialize(placeholder((64, 1000), np.float32))
launches = [line.strip() for line in softmax.stages["gpu"].splitlines() if "launch" in line or "vector" in line]
print("softmax (each thread four neighbouring columns at a time):", *launches, sep="\n  ")
ptx = softmax.stages["ptx"]
loads = ptx.count("ld.global.nc.v4.f32") + ptx.count("ld.global.v4.f32")
print(f"  {loads} 128-bit loads and {ptx.count('st.global.v4.f32')} 128-bit stores in its PTX")

try:
    rng = np.random.default_rng(0)
    A = rng.standard_normal((512, 256), dtype=np.float32)
    B = rng.standard_normal((256, 384), dtype=np.float32)
    C = mod.matmul(A, B)
    assert np.allclose(C, A @ B, rtol=1e-3, atol=1e-3)
    X = rng.standard_normal((64, 1000), dtype=np.float32)
    O, _, _ = mod.softmax(X)
    e = np.exp(X - X.max(axis=1, keepdims=True))
    assert np.allclose(O, e / e.sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-6)
    print("ran on the GPU: matmul and softmax match numpy")
except pf.DeviceError as err:
    print(f"not run: {err}")
