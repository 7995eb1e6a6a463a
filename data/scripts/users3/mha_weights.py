"""Cross-attention with nn.MultiheadAttention returning per-head weights (kdim/vdim, bias_kv, a float mask)."""
import torch
import torch.nn as nn

q_proj = nn.Linear(256, 512).cuda()
mha = nn.MultiheadAttention(512, 8, dropout=0.1, kdim=384, vdim=320, add_bias_kv=True, batch_first=True).cuda()
out = nn.Linear(512, 10).cuda()
opt = torch.optim.Adam(list(q_proj.parameters()) + list(mha.parameters()) + list(out.parameters()))
for step in range(3):
    q = torch.randn(16, 200, 256, device="cuda")
    k = torch.randn(16, 300, 384, device="cuda")
    v = torch.randn(16, 300, 320, device="cuda")
    mask = torch.zeros(200, 300, device="cuda")
    mask[:, 250:] = float("-inf")
    y, w = mha(q_proj(q), k, v, attn_mask=mask, need_weights=True, average_attn_weights=False)
    loss = out(y).logsumexp(-1).mean() + w.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
