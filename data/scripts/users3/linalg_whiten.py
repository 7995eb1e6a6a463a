"""ZCA whitening with torch.linalg.eigh and a Cholesky solve in a training step, an SVD-based orthogonal penalty."""
import torch
import torch.nn as nn

enc = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 256)).cuda()
opt = torch.optim.AdamW(enc.parameters())
for step in range(3):
    z = enc(torch.randn(4096, 784, device="cuda"))
    zc = z - z.mean(0)
    cov = zc.T @ zc / zc.shape[0] + 1e-3 * torch.eye(256, device="cuda")
    evals, evecs = torch.linalg.eigh(cov)
    white = zc @ evecs @ torch.diag(evals.rsqrt()) @ evecs.T
    L = torch.linalg.cholesky(cov)
    sol = torch.cholesky_solve(zc.T[:, :128], L)
    s = torch.linalg.svdvals(enc[2].weight)
    loss = white.pow(2).mean() + sol.abs().mean() + (s - 1).pow(2).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
