"""torchrun script: DTensor tensor parallelism (ColwiseParallel / RowwiseParallel) of a stack of transformer-style
MLP and attention projections, fp32, AdamW."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class Block(nn.Module):
    def __init__(self, d=2048, h=16):
        super().__init__()
        self.h = h
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, _ = x.shape
        y = self.norm1(x)
        q, k, v = (m(y).view(b, t, -1, 128).transpose(1, 2) for m in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        x = x + self.o(a)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (dist.get_world_size(),))
model = nn.Sequential(*[Block() for _ in range(8)]).cuda()
for blk in model:
    parallelize_module(blk, mesh, {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
                                   "o": RowwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()})
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
for step in range(3):
    torch.manual_seed(step)
    x = torch.randn(8, 1024, 2048, device="cuda")
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
if dist.get_rank() == 0:
    print("peak", torch.cuda.max_memory_allocated())
dist.destroy_process_group()
