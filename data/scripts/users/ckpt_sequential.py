"""A deep convolutional stack (nn.Sequential of 32 residual-free conv blocks at 128 px) trained in fp32 with
torch.utils.checkpoint.checkpoint_sequential in 4 segments (use_reentrant=False), Adam."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint_sequential


def block(c):
    return nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.SiLU())


body = nn.Sequential(nn.Conv2d(3, 128, 3, padding=1), *[block(128) for _ in range(32)]).cuda()
head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 100)).cuda()
params = list(body.parameters()) + list(head.parameters())
opt = torch.optim.Adam(params, lr=1e-3)
for step in range(3):
    x = torch.randn(64, 3, 128, 128, device="cuda")
    y = torch.randint(0, 100, (64,), device="cuda")
    feats = checkpoint_sequential(body, 4, x, use_reentrant=False)
    loss = F.cross_entropy(head(feats), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
