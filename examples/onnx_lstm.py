"""A 2-layer bidirectional LSTM exported by torch, compiled by polyfuse and checked
against onnxruntime. Each LSTM node runs as one projection (X times W for every time step
and direction, one contraction) and one fused kernel per time step, compiled once."""

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch

import polyfuse as pf

torch.manual_seed(0)
net = torch.nn.LSTM(input_size=10, hidden_size=20, num_layers=2, bidirectional=True,
                    batch_first=True).eval()
x = torch.randn(3, 12, 10)   # batch 3, 12 time steps
buffer = io.BytesIO()
with warnings.catch_warnings():   # the TorchScript exporter's notices
    warnings.simplefilter("ignore")
    torch.onnx.export(net, (x,), buffer, dynamo=False, input_names=["x"],
                      output_names=["y", "h", "c"])
model = onnx.load_from_string(buffer.getvalue())

compiled = pf.compile(model, target="host")
feed = {"x": x.numpy()}
ours = compiled.run(feed)
theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
for name, want in zip(["y", "h", "c"], theirs):
    print(f"{name}: shape {want.shape}, max |polyfuse - onnxruntime| = "
          f"{np.abs(ours[name] - want).max():.2g}")
    np.testing.assert_allclose(ours[name], want, rtol=1e-4, atol=1e-5, err_msg=name)

plan = compiled.plan_for()
kernels = list(plan.steps())
steps = [(st, k) for st, k in kernels if "/step" in st.label]
print(f"the plan runs {len(kernels)} kernels, {len(steps)} of them LSTM steps (2 layers x 2 "
      f"directions x 12 time steps); the steps share {len({id(k) for _, k in steps})} compiled "
      "kernel(s): each step is one kernel of the same TC text")
print("one step's kernel:")
print(steps[0][0].definition)
