"""DP-SGD by hand with torch.func: per-sample gradients of a small CNN from vmap(grad(loss)) over
functional_call, each sample's gradient clipped to norm 1, summed, Gaussian noise added, written into .grad and
stepped with SGD; fp32.

Tiny: --batch 4 --width 8 --steps 1"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=512)
ap.add_argument("--width", type=int, default=96)
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--clip", type=float, default=1.0)
ap.add_argument("--sigma", type=float, default=1.0)
args = ap.parse_args()
w = args.width
model = nn.Sequential(
    nn.Conv2d(3, w, 3, padding=1), nn.GroupNorm(8, w), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(w, 2 * w, 3, padding=1), nn.GroupNorm(8, 2 * w), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(2 * w, 4 * w, 3, padding=1), nn.GroupNorm(8, 4 * w), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
    nn.Flatten(), nn.Linear(4 * w, 512), nn.ReLU(), nn.Linear(512, 10),
).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
params = {k: v.detach() for k, v in model.named_parameters()}


def sample_loss(p, x, y):
    out = functional_call(model, p, (x.unsqueeze(0),))
    return F.cross_entropy(out, y.unsqueeze(0))


per_sample = vmap(grad(sample_loss), in_dims=(None, 0, 0))
for step in range(args.steps):
    x = torch.randn(args.batch, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (args.batch,), device="cuda")
    grads = per_sample(params, x, y)
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads.values()], dim=1).norm(dim=1)
    factor = (args.clip / (norms + 1e-6)).clamp(max=1.0)
    for name, p in model.named_parameters():
        g = torch.einsum("b,b...->...", factor, grads[name])
        p.grad = (g + args.sigma * args.clip * torch.randn_like(g)) / args.batch
    del grads
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"step {step} mean norm {norms.mean().item():.3f}")
print("peak", torch.cuda.max_memory_allocated())
