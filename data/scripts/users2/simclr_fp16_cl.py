"""SimCLR-style contrastive pretraining: two augmented views of a big batch through a channels_last ResNet-50
and a projection head under fp16 autocast, the NT-Xent loss over the 2N x 2N cosine-similarity matrix (the
diagonal masked out), GradScaler with scaler.unscale_ before clip_grad_norm_, LARS-like SGD stand-in (SGD with
momentum).

Tiny: --batch 4 --size 32 --steps 1"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=256)
ap.add_argument("--size", type=int, default=160)
ap.add_argument("--steps", type=int, default=3)
args = ap.parse_args()

backbone = torchvision.models.resnet50()
backbone.fc = nn.Identity()
model = nn.ModuleDict({"backbone": backbone,
                       "head": nn.Sequential(nn.Linear(2048, 2048), nn.BatchNorm1d(2048), nn.ReLU(),
                                             nn.Linear(2048, 128))})
model = model.to("cuda", memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9, weight_decay=1e-6)
scaler = torch.amp.GradScaler("cuda")


def nt_xent(z, temperature=0.1):
    z = F.normalize(z.float(), dim=1)
    n = z.shape[0] // 2
    sim = z @ z.t() / temperature
    sim.fill_diagonal_(float("-inf"))
    target = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to("cuda")
    return F.cross_entropy(sim, target)


for step in range(args.steps):
    imgs = torch.rand(args.batch, 3, args.size, args.size, device="cuda")
    v1 = (imgs + 0.1 * torch.randn_like(imgs)).flip(3)
    v2 = imgs * torch.empty(args.batch, 1, 1, 1, device="cuda").uniform_(0.6, 1.4)
    x = torch.cat([v1, v2]).contiguous(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.float16):
        z = model["head"](model["backbone"](x))
        loss = nt_xent(z)
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    print(f"step {step} loss {loss.item():.4f}")
print("peak", torch.cuda.max_memory_allocated())
