"""torchrun script: DDP (gradient_as_bucket_view) on GPT-2 medium (HF), amp-bf16, AdamW."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import GPT2Config, GPT2LMHeadModel

dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = GPT2LMHeadModel(GPT2Config(n_layer=24, n_embd=1024, n_head=16)).cuda()
model = DDP(model, device_ids=[local_rank], gradient_as_bucket_view=True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(3):
    ids = torch.randint(0, 50257, (4, 1024), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
if dist.get_rank() == 0:
    print("peak", torch.cuda.max_memory_allocated())
dist.destroy_process_group()
