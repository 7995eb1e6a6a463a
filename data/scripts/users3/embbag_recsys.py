"""A DLRM-style recommender: nn.EmbeddingBag tables (sum, offsets), dot interactions, an MLP, BCE, Adagrad."""
import torch
import torch.nn as nn
import torch.nn.functional as F

tables = nn.ModuleList(nn.EmbeddingBag(100_000, 64, mode="sum") for _ in range(8)).cuda()
bottom = nn.Sequential(nn.Linear(13, 256), nn.ReLU(), nn.Linear(256, 64)).cuda()
top = nn.Sequential(nn.Linear(64 + 36, 512), nn.ReLU(), nn.Linear(512, 1)).cuda()
opt = torch.optim.Adagrad([*tables.parameters(), *bottom.parameters(), *top.parameters()], lr=0.01)
B = 2048
for step in range(3):
    dense = torch.randn(B, 13, device="cuda")
    feats = [bottom(dense)]
    for t in tables:
        idx = torch.randint(0, 100_000, (B * 4,), device="cuda")
        off = torch.arange(0, B * 4, 4, device="cuda")
        feats.append(t(idx, off))
    z = torch.stack(feats, 1)
    inter = torch.bmm(z, z.transpose(1, 2))
    iu = torch.triu_indices(9, 9, 1)
    x = torch.cat([feats[0], inter[:, iu[0], iu[1]]], 1)
    loss = F.binary_cross_entropy_with_logits(top(x).squeeze(1), torch.rand(B, device="cuda").round())
    opt.zero_grad()
    loss.backward()
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
