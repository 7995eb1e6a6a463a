"""A 3-layer GCN with a sparse COO adjacency (torch.sparse.mm) and scatter_add_ message passing."""
import torch
import torch.nn as nn
import torch.nn.functional as F

N, E, D = 50_000, 400_000, 128
src = torch.randint(0, N, (E,), device="cuda")
dst = torch.randint(0, N, (E,), device="cuda")
adj = torch.sparse_coo_tensor(torch.stack([src, dst]), torch.ones(E, device="cuda"), (N, N)).coalesce()
x = torch.randn(N, D, device="cuda")
y = torch.randint(0, 10, (N,), device="cuda")
lins = nn.ModuleList([nn.Linear(D, 256), nn.Linear(256, 256), nn.Linear(256, 10)]).cuda()
opt = torch.optim.Adam(lins.parameters(), lr=1e-2)
for step in range(3):
    h = x
    for i, lin in enumerate(lins):
        h = torch.sparse.mm(adj, lin(h))
        agg = torch.zeros_like(h).scatter_add_(0, dst[:, None].expand(-1, h.shape[1]), h[src])
        h = h + agg
        if i < 2:
            h = F.relu(h)
    loss = F.cross_entropy(h, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
