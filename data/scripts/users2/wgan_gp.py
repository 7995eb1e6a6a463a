"""WGAN-GP on 64x64 images in fp32: a DCGAN-style generator and critic, five critic steps per generator step,
the gradient penalty through torch.autograd.grad(create_graph=True) (a double backward), two Adam optimizers.

Tiny: --batch 4 --width 16 --iters 1"""
import argparse

import torch
import torch.nn as nn

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=512)
ap.add_argument("--width", type=int, default=128)
ap.add_argument("--iters", type=int, default=2)
ap.add_argument("--n-critic", type=int, default=5)
args = ap.parse_args()
w, z_dim = args.width, 128

G = nn.Sequential(
    nn.ConvTranspose2d(z_dim, 8 * w, 4, 1, 0, bias=False), nn.BatchNorm2d(8 * w), nn.ReLU(True),
    nn.ConvTranspose2d(8 * w, 4 * w, 4, 2, 1, bias=False), nn.BatchNorm2d(4 * w), nn.ReLU(True),
    nn.ConvTranspose2d(4 * w, 2 * w, 4, 2, 1, bias=False), nn.BatchNorm2d(2 * w), nn.ReLU(True),
    nn.ConvTranspose2d(2 * w, w, 4, 2, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(True),
    nn.ConvTranspose2d(w, 3, 4, 2, 1, bias=False), nn.Tanh(),
).to("cuda")
# no BatchNorm in a WGAN-GP critic: the penalty is per sample
D = nn.Sequential(
    nn.Conv2d(3, w, 4, 2, 1), nn.LeakyReLU(0.2, True),
    nn.Conv2d(w, 2 * w, 4, 2, 1), nn.InstanceNorm2d(2 * w, affine=True), nn.LeakyReLU(0.2, True),
    nn.Conv2d(2 * w, 4 * w, 4, 2, 1), nn.InstanceNorm2d(4 * w, affine=True), nn.LeakyReLU(0.2, True),
    nn.Conv2d(4 * w, 8 * w, 4, 2, 1), nn.InstanceNorm2d(8 * w, affine=True), nn.LeakyReLU(0.2, True),
    nn.Conv2d(8 * w, 1, 4, 1, 0),
).to("cuda")
opt_g = torch.optim.Adam(G.parameters(), lr=1e-4, betas=(0.0, 0.9))
opt_d = torch.optim.Adam(D.parameters(), lr=1e-4, betas=(0.0, 0.9))


def gradient_penalty(real, fake):
    eps = torch.rand(real.size(0), 1, 1, 1, device="cuda")
    mixed = (eps * real + (1 - eps) * fake).requires_grad_(True)
    score = D(mixed)
    (grad,) = torch.autograd.grad(score.sum(), mixed, create_graph=True)
    return ((grad.flatten(1).norm(2, dim=1) - 1) ** 2).mean()


for it in range(args.iters):
    for _ in range(args.n_critic):
        real = torch.rand(args.batch, 3, 64, 64, device="cuda") * 2 - 1
        z = torch.randn(args.batch, z_dim, 1, 1, device="cuda")
        fake = G(z).detach()
        loss_d = D(fake).mean() - D(real).mean() + 10.0 * gradient_penalty(real, fake)
        opt_d.zero_grad(set_to_none=True)
        loss_d.backward()
        opt_d.step()
    z = torch.randn(args.batch, z_dim, 1, 1, device="cuda")
    loss_g = -D(G(z)).mean()
    opt_g.zero_grad(set_to_none=True)
    loss_g.backward()
    opt_g.step()
    print(f"iter {it} loss_d {loss_d.item():.3f} loss_g {loss_g.item():.3f}")
print("peak", torch.cuda.max_memory_allocated())
