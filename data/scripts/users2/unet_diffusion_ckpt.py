"""A denoising-diffusion training loop on a hand-written U-Net: sinusoidal time embeddings, GroupNorm residual
blocks with self-attention at the low resolutions, each block under torch.utils.checkpoint.checkpoint
(use_reentrant=False), the noise-prediction MSE loss at random timesteps of a linear beta schedule, an EMA copy
kept with torch._foreach_lerp_, bf16 autocast, AdamW.

Tiny: --ch 32 --batch 2 --size 16 --steps 1"""
import argparse
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

ap = argparse.ArgumentParser()
ap.add_argument("--ch", type=int, default=128)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--size", type=int, default=128)
ap.add_argument("--steps", type=int, default=3)
args = ap.parse_args()


def time_embedding(t, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device) / half)
    a = t.float()[:, None] * freqs[None]
    return torch.cat([a.sin(), a.cos()], dim=1)


class ResBlock(nn.Module):
    def __init__(self, cin, cout, tdim):
        super().__init__()
        self.n1, self.n2 = nn.GroupNorm(32, cin), nn.GroupNorm(32, cout)
        self.c1, self.c2 = nn.Conv2d(cin, cout, 3, padding=1), nn.Conv2d(cout, cout, 3, padding=1)
        self.t = nn.Linear(tdim, cout)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, temb):
        h = self.c1(F.silu(self.n1(x))) + self.t(temb)[:, :, None, None]
        return self.skip(x) + self.c2(F.silu(self.n2(h)))


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm, self.qkv, self.proj = nn.GroupNorm(32, c), nn.Conv2d(c, 3 * c, 1), nn.Conv2d(c, c, 1)

    def forward(self, x, temb=None):
        b, c, hh, ww = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, 4, c // 4, hh * ww).transpose(-1, -2).unbind(1)
        a = F.scaled_dot_product_attention(q, k, v).transpose(-1, -2).reshape(b, c, hh, ww)
        return x + self.proj(a)


class UNet(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.tdim = 4 * ch
        self.temb = nn.Sequential(nn.Linear(ch, self.tdim), nn.SiLU(), nn.Linear(self.tdim, self.tdim))
        mult = (1, 2, 2, 4)
        self.inc = nn.Conv2d(3, ch, 3, padding=1)
        self.down, chans, c = nn.ModuleList(), [ch], ch
        for i, m in enumerate(mult):
            for _ in range(2):
                blocks = [ResBlock(c, ch * m, self.tdim)]
                c = ch * m
                if i >= 2:
                    blocks.append(Attention(c))
                self.down.append(nn.ModuleList(blocks))
                chans.append(c)
            if i < len(mult) - 1:
                self.down.append(nn.ModuleList([nn.Conv2d(c, c, 3, stride=2, padding=1)]))
                chans.append(c)
        self.mid = nn.ModuleList([ResBlock(c, c, self.tdim), Attention(c), ResBlock(c, c, self.tdim)])
        self.up = nn.ModuleList()
        for i, m in reversed(list(enumerate(mult))):
            for _ in range(3):
                blocks = [ResBlock(c + chans.pop(), ch * m, self.tdim)]
                c = ch * m
                if i >= 2:
                    blocks.append(Attention(c))
                self.up.append(nn.ModuleList(blocks))
            if i > 0:
                self.up.append(nn.ModuleList([nn.Upsample(scale_factor=2), nn.Conv2d(c, c, 3, padding=1)]))
        self.out = nn.Sequential(nn.GroupNorm(32, c), nn.SiLU(), nn.Conv2d(c, 3, 3, padding=1))

    @staticmethod
    def run(blocks, h, temb):
        for blk in blocks:
            h = blk(h, temb) if isinstance(blk, (ResBlock, Attention)) else blk(h)
        return h

    def forward(self, x, t):
        temb = self.temb(time_embedding(t, self.tdim // 4))
        h = self.inc(x)
        skips = [h]
        for blocks in self.down:
            h = checkpoint(self.run, blocks, h, temb, use_reentrant=False)
            skips.append(h)
        h = checkpoint(self.run, self.mid, h, temb, use_reentrant=False)
        for blocks in self.up:
            if isinstance(blocks[0], ResBlock):
                h = torch.cat([h, skips.pop()], dim=1)
            h = checkpoint(self.run, blocks, h, temb, use_reentrant=False)
        return self.out(h)


model = UNet(args.ch).cuda()
ema = copy.deepcopy(model).requires_grad_(False)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
betas = torch.linspace(1e-4, 0.02, 1000, device="cuda")
alpha_bar = torch.cumprod(1 - betas, dim=0)
for step in range(args.steps):
    x0 = torch.rand(args.batch, 3, args.size, args.size, device="cuda") * 2 - 1
    t = torch.randint(0, 1000, (args.batch,), device="cuda")
    noise = torch.randn_like(x0)
    ab = alpha_bar[t][:, None, None, None]
    xt = ab.sqrt() * x0 + (1 - ab).sqrt() * noise
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.mse_loss(model(xt, t).float(), noise)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    with torch.no_grad():
        torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 1 - 0.999)
    print(f"step {step} loss {loss.item():.4f}")
print("peak", torch.cuda.max_memory_allocated())
