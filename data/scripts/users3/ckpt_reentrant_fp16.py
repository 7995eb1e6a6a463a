"""Eight pre-LN MLP blocks in pure float16 (model.half()), each checkpointed with use_reentrant=True, a hand-scaled
loss, Adam."""
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(1024), nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)) for _ in range(8)).cuda().half()
opt = torch.optim.Adam(blocks.parameters(), eps=1e-4)
for step in range(3):
    x = torch.randn(16, 512, 1024, device="cuda", dtype=torch.half, requires_grad=True)
    for b in blocks:
        x = x + checkpoint(b, x, use_reentrant=True)
    loss = x.float().pow(2).mean() * 1024
    opt.zero_grad()
    loss.backward()
    for p in blocks.parameters(): p.grad.div_(1024)
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
