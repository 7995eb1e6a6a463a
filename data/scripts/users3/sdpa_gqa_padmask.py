"""Grouped-query attention by hand: F.scaled_dot_product_attention with enable_gqa and a boolean padding-and-causal
mask, bf16 autocast."""
import torch
import torch.nn as nn
import torch.nn.functional as F

q_p = nn.Linear(2048, 2048).cuda()
kv_p = nn.Linear(2048, 1024).cuda()
opt = torch.optim.AdamW([*q_p.parameters(), *kv_p.parameters()])
for step in range(3):
    x = torch.randn(8, 1024, 2048, device="cuda")
    pad = torch.ones(8, 1024, dtype=torch.bool, device="cuda")
    pad[:, 900:] = False
    with torch.autocast("cuda", dtype=torch.bfloat16):
        q = q_p(x).view(8, 1024, 16, 128).transpose(1, 2)
        k, v = kv_p(x).view(8, 1024, 2, 4, 128).permute(2, 0, 3, 1, 4)
        mask = pad[:, None, None, :] & torch.ones(1024, 1024, dtype=torch.bool, device="cuda").tril()
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        loss = o.float().pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
