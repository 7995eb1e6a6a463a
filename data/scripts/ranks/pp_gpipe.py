"""torchrun script: pipeline parallelism over 2 ranks with torch.distributed.pipelining (PipelineStage and
ScheduleGPipe, or Schedule1F1B with --1f1b): a GPT-style model (embedding, 8 pre-norm blocks, LM head) cut in
two stages, 4 micro-batches per step, fp32, AdamW. Rank 0 holds the embedding and the first 4 blocks, rank 1
the last 4, the final norm, the head and the loss."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

ap = argparse.ArgumentParser()
ap.add_argument("--1f1b", dest="one_f_one_b", action="store_true")
ap.add_argument("--micro-batches", type=int, default=4)
ap.add_argument("--small", action="store_true", help="a model of a few MB (tests)")
args = ap.parse_args()
D, H, T, V, B = (256, 4, 128, 1000, 16) if args.small else (1024, 8, 1024, 32000, 16)  # width, heads, seq, vocab, batch


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.up, self.down = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, H, D // H).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, D))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class First(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.blocks = nn.Sequential(*[Block() for _ in range(4)])

    def forward(self, ids):
        return self.blocks(self.emb(ids))


class Last(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(*[Block() for _ in range(4)])
        self.norm, self.head = nn.LayerNorm(D), nn.Linear(D, V, bias=False)

    def forward(self, x):
        return self.head(self.norm(self.blocks(x)))


def loss_fn(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
assert world == 2, "two pipeline stages: run with --nproc-per-node 2"
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
mb = B // args.micro_batches
module = (First() if rank == 0 else Last()).to(device)
# each micro-batch's input and output shapes given (meta tensors: no memory), so the stages exchange no shape
# metadata; the activations between the stages require grad, so that their gradients are sent back
act = torch.empty(mb, T, D, device="meta", requires_grad=True)
example_in = (torch.empty(mb, T, dtype=torch.long, device="meta"),) if rank == 0 else (act,)
example_out = (act,) if rank == 0 else (torch.empty(mb, T, V, device="meta"),)
stage = PipelineStage(module, rank, world, device, input_args=example_in, output_args=example_out)
schedule = (Schedule1F1B if args.one_f_one_b else ScheduleGPipe)(stage, n_microbatches=args.micro_batches,
                                                                     loss_fn=loss_fn)
opt = torch.optim.AdamW(module.parameters(), lr=1e-4)
for step in range(3):
    ids = torch.randint(0, V, (B, T), device=device)
    if rank == 0:
        schedule.step(ids)
    else:
        schedule.step(target=ids)
    opt.step()
    opt.zero_grad(set_to_none=True)
print(f"rank {rank} peak", torch.cuda.max_memory_allocated())
dist.destroy_process_group()
