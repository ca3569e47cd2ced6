"""PyTorch through polyfuse: torch.compile(backend="polyfuse"), and pf.compile of a
torch.export program. Runs in a few seconds on a CPU."""

import copy

import numpy as np
import torch

import polyfuse as pf

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4)).eval()
x = torch.randn(2, 3, 16, 16)

# 1. torch.compile: the ATen graph's supported parts run as compiled polyfuse programs
compiled = torch.compile(model, backend="polyfuse", options={"target": "host"})
with torch.no_grad():
    y = compiled(x)
    print("torch.compile  max |polyfuse - eager| =", float((y - model(x)).abs().max()))
    assert torch.allclose(y, model(x), rtol=1e-4, atol=1e-4)

# 2. a training step: AOTAutograd's backward graph is compiled too
train = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
eager = copy.deepcopy(train)
batch = torch.randn(8, 16)
for net in (torch.compile(train, backend="polyfuse"), eager):
    net(batch).square().mean().backward()
print("training step  max |grad polyfuse - grad eager| =",
      float((train[0].weight.grad - eager[0].weight.grad).abs().max()))
assert torch.allclose(train[0].weight.grad, eager[0].weight.grad, rtol=1e-4, atol=1e-5)

# 3. torch.export -> pf.compile: one polyfuse program, weights folded in
program = torch.export.export(model, (x,))
compiled_program = pf.compile(program, target="host")
out = compiled_program(x.numpy())
print("pf.compile     max |polyfuse - eager| =", float(np.abs(out - model(x).detach().numpy()).max()))
np.testing.assert_allclose(out, model(x).detach().numpy(), rtol=1e-4, atol=1e-4)
print(compiled_program.dump("groups").splitlines()[0])
