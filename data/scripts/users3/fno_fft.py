"""A Fourier neural operator (2-D spectral convolutions with rfft2/irfft2 and complex weights), fp32, Adam."""
import torch
import torch.nn as nn


class Spectral(nn.Module):
    def __init__(self, c, m):
        super().__init__()
        self.m = m
        self.w = nn.Parameter(torch.randn(c, c, m, m, dtype=torch.cfloat) / c)

    def forward(self, x):
        f = torch.fft.rfft2(x)
        out = torch.zeros(x.shape[0], x.shape[1], x.shape[2], x.shape[3] // 2 + 1, dtype=torch.cfloat, device=x.device)
        out[:, :, :self.m, :self.m] = torch.einsum("bixy,ioxy->boxy", f[:, :, :self.m, :self.m], self.w)
        return torch.fft.irfft2(out, s=x.shape[-2:])


class FNO(nn.Module):
    def __init__(self, c=64, m=16):
        super().__init__()
        self.lift = nn.Conv2d(3, c, 1)
        self.spec = nn.ModuleList(Spectral(c, m) for _ in range(4))
        self.pw = nn.ModuleList(nn.Conv2d(c, c, 1) for _ in range(4))
        self.proj = nn.Conv2d(c, 1, 1)

    def forward(self, x):
        x = self.lift(x)
        for s, p in zip(self.spec, self.pw):
            x = torch.nn.functional.gelu(s(x) + p(x))
        return self.proj(x)


model = FNO().cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(3):
    x = torch.randn(32, 3, 128, 128, device="cuda")
    loss = (model(x) - x[:, :1]).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
