"""A temporal convolutional network for audio-length sequences, every Conv1d under
torch.nn.utils.parametrizations.weight_norm (weight = g * v / ||v||, recomputed each forward), dilated causal
residual blocks, the whole model cast to bfloat16 (pure bf16: model.to(torch.bfloat16), no autocast), Adam.

Tiny: --channels 16 --levels 2 --batch 2 --length 256 --steps 1"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.parametrizations import weight_norm

ap = argparse.ArgumentParser()
ap.add_argument("--channels", type=int, default=256)
ap.add_argument("--levels", type=int, default=10)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--length", type=int, default=16000)
ap.add_argument("--steps", type=int, default=3)
args = ap.parse_args()


class TemporalBlock(nn.Module):
    def __init__(self, cin, cout, dilation):
        super().__init__()
        self.pad = 2 * dilation
        self.conv1 = weight_norm(nn.Conv1d(cin, cout, 3, dilation=dilation))
        self.conv2 = weight_norm(nn.Conv1d(cout, cout, 3, dilation=dilation))
        self.down = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        h = self.drop(F.relu(self.conv1(F.pad(x, (self.pad, 0)))))
        h = self.drop(F.relu(self.conv2(F.pad(h, (self.pad, 0)))))
        return F.relu(h + self.down(x))


c = args.channels
model = nn.Sequential(*[TemporalBlock(1 if i == 0 else c, c, 2 ** i) for i in range(args.levels)],
                      nn.Conv1d(c, 256, 1))   # 256-way mu-law classes per sample
model = model.to(device="cuda", dtype=torch.bfloat16)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(args.steps):
    wav = torch.rand(args.batch, 1, args.length, device="cuda", dtype=torch.bfloat16) * 2 - 1
    target = torch.randint(0, 256, (args.batch, args.length), device="cuda")
    loss = F.cross_entropy(model(wav), target)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
print("peak", torch.cuda.max_memory_allocated())
