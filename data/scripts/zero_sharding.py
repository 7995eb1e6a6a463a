"""ZeRO-style optimizer sharding on one GPU: ZeroRedundancyOptimizer(AdamW) in a one-process group."""
import os

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from transformers import GPT2Config, GPT2LMHeadModel

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29517")
dist.init_process_group("nccl", rank=0, world_size=1)
model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12)).cuda()
opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4)
for step in range(3):
    ids = torch.randint(0, 50257, (8, 1024), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print("peak", torch.cuda.max_memory_allocated())
dist.destroy_process_group()
