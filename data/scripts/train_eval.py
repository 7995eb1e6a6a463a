"""GPT-2 medium (HF) training at batch 4, then an evaluation pass at batch 16 under no_grad (a larger batch
than training: the cache the training steps left is reused, or not)."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

model = GPT2LMHeadModel(GPT2Config(n_layer=24, n_embd=1024, n_head=16)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
for step in range(2):
    ids = torch.randint(0, 50257, (4, 1024), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
model.eval()
total = 0.0
with torch.no_grad():
    for _ in range(2):
        ids = torch.randint(0, 50257, (16, 1024), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            total += model(input_ids=ids, labels=ids).loss.item()
model.train()
print("eval loss", total / 2, "peak", torch.cuda.max_memory_allocated())
