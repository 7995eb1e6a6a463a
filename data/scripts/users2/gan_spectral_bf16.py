"""A GAN with a spectral-norm discriminator (torch.nn.utils.parametrizations.spectral_norm) under bf16 autocast:
the generator's output .detach()-ed for the discriminator's step, BCE-with-logits losses, separate G and D Adam
optimizers, the generator stepped after the discriminator on the same fake batch.

Tiny: --batch 4 --width 16 --steps 1"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.parametrizations import spectral_norm

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=256)
ap.add_argument("--width", type=int, default=96)
ap.add_argument("--steps", type=int, default=3)
args = ap.parse_args()
w, z_dim = args.width, 128


class Up(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.bn1, self.bn2 = nn.BatchNorm2d(cin), nn.BatchNorm2d(cout)
        self.c1, self.c2 = nn.Conv2d(cin, cout, 3, padding=1), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1)

    def forward(self, x):
        h = F.interpolate(F.relu(self.bn1(x)), scale_factor=2)
        h = self.c2(F.relu(self.bn2(self.c1(h))))
        return h + self.skip(F.interpolate(x, scale_factor=2))


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(z_dim, 4 * 4 * 8 * w)
        self.ups = nn.Sequential(Up(8 * w, 8 * w), Up(8 * w, 4 * w), Up(4 * w, 2 * w), Up(2 * w, w))
        self.out = nn.Sequential(nn.BatchNorm2d(w), nn.ReLU(), nn.Conv2d(w, 3, 3, padding=1), nn.Tanh())

    def forward(self, z):
        return self.out(self.ups(self.fc(z).view(-1, 8 * w, 4, 4)))


def sn_conv(cin, cout, k, s, p):
    return spectral_norm(nn.Conv2d(cin, cout, k, s, p))


D = nn.Sequential(
    sn_conv(3, w, 3, 1, 1), nn.LeakyReLU(0.1), sn_conv(w, w, 4, 2, 1), nn.LeakyReLU(0.1),
    sn_conv(w, 2 * w, 3, 1, 1), nn.LeakyReLU(0.1), sn_conv(2 * w, 2 * w, 4, 2, 1), nn.LeakyReLU(0.1),
    sn_conv(2 * w, 4 * w, 3, 1, 1), nn.LeakyReLU(0.1), sn_conv(4 * w, 4 * w, 4, 2, 1), nn.LeakyReLU(0.1),
    sn_conv(4 * w, 8 * w, 3, 1, 1), nn.LeakyReLU(0.1), nn.Flatten(), spectral_norm(nn.Linear(8 * w * 8 * 8, 1)),
).cuda()
G = Generator().cuda()
opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
opt_g = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
ones = torch.ones(args.batch, 1, device="cuda")
zeros = torch.zeros(args.batch, 1, device="cuda")
for step in range(args.steps):
    real = torch.rand(args.batch, 3, 64, 64, device="cuda") * 2 - 1
    z = torch.randn(args.batch, z_dim, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        fake = G(z)
        d_loss = (F.binary_cross_entropy_with_logits(D(real), ones)
                  + F.binary_cross_entropy_with_logits(D(fake.detach()), zeros))
    opt_d.zero_grad()
    d_loss.backward()
    opt_d.step()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        g_loss = F.binary_cross_entropy_with_logits(D(fake), ones)
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()
    print(f"step {step} d {d_loss.item():.3f} g {g_loss.item():.3f}")
print("peak", torch.cuda.max_memory_allocated())
