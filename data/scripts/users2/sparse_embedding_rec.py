"""A recommendation model (DLRM-like): large nn.Embedding(sparse=True) tables trained with torch.optim.SparseAdam,
the dense bottom and top MLPs with Adam (two optimizers), feature interaction by pairwise dot products, fp32,
binary cross-entropy on click labels.

Tiny: --rows 1000 --dim 16 --batch 32 --steps 1"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--tables", type=int, default=8)
ap.add_argument("--rows", type=int, default=4_000_000)
ap.add_argument("--dim", type=int, default=128)
ap.add_argument("--batch", type=int, default=16384)
ap.add_argument("--hotness", type=int, default=4)
ap.add_argument("--steps", type=int, default=3)
args = ap.parse_args()


class DLRM(nn.Module):
    def __init__(self):
        super().__init__()
        d = args.dim
        self.tables = nn.ModuleList(nn.Embedding(args.rows, d, sparse=True) for _ in range(args.tables))
        self.bottom = nn.Sequential(nn.Linear(13, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, d))
        n = args.tables + 1
        self.top = nn.Sequential(nn.Linear(d + n * (n - 1) // 2, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                                 nn.Linear(1024, 1))

    def forward(self, dense, sparse):
        x = self.bottom(dense)
        embs = [t(sparse[:, i]).sum(1) for i, t in enumerate(self.tables)]   # multi-hot: sum pooling
        z = torch.stack([x, *embs], dim=1)
        inter = z @ z.transpose(1, 2)
        i, j = torch.triu_indices(z.shape[1], z.shape[1], offset=1, device=z.device)
        return self.top(torch.cat([x, inter[:, i, j]], dim=1)).squeeze(1)


model = DLRM().to("cuda")
sparse_opt = torch.optim.SparseAdam(list(model.tables.parameters()), lr=1e-3)
dense_opt = torch.optim.Adam([*model.bottom.parameters(), *model.top.parameters()], lr=1e-3)
for step in range(args.steps):
    dense = torch.randn(args.batch, 13, device="cuda")
    sparse = torch.randint(0, args.rows, (args.batch, args.tables, args.hotness), device="cuda")
    clicks = torch.randint(0, 2, (args.batch,), device="cuda").float()
    loss = F.binary_cross_entropy_with_logits(model(dense, sparse), clicks)
    sparse_opt.zero_grad()
    dense_opt.zero_grad()
    loss.backward()
    sparse_opt.step()
    dense_opt.step()
    print(f"step {step} loss {loss.item():.4f}")
print("peak", torch.cuda.max_memory_allocated())
