"""GPT-2 small (HF), amp-bf16, gradient accumulation over 4 micro-batches, clipping, a cosine LR schedule."""
import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel

ap = argparse.ArgumentParser()
ap.add_argument("--micro-batch", type=int, default=8)
ap.add_argument("--seq", type=int, default=512)
ap.add_argument("--accum", type=int, default=4)
ap.add_argument("--steps", type=int, default=3)
args = ap.parse_args()

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
for step in range(args.steps):
    for micro in range(args.accum):
        ids = torch.randint(0, 50257, (args.micro_batch, args.seq), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss / args.accum
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    print(f"step {step} loss {loss.item() * args.accum:.3f}")
print(f"peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
