"""A convolutional VAE: torch.distributions Normal rsample and kl_divergence, BCE reconstruction, Adam."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Normal, kl_divergence

enc = nn.Sequential(nn.Conv2d(3, 64, 4, 2, 1), nn.ReLU(), nn.Conv2d(64, 128, 4, 2, 1), nn.ReLU(), nn.Flatten(),
                    nn.Linear(128 * 16 * 16, 512)).cuda()
dec = nn.Sequential(nn.Linear(256, 128 * 16 * 16), nn.Unflatten(1, (128, 16, 16)), nn.ReLU(),
                    nn.ConvTranspose2d(128, 64, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(64, 3, 4, 2, 1)).cuda()
opt = torch.optim.Adam([*enc.parameters(), *dec.parameters()], lr=2e-4)
for step in range(3):
    x = torch.rand(128, 3, 64, 64, device="cuda")
    mu, logvar = enc(x).chunk(2, 1)
    q = Normal(mu, (0.5 * logvar).exp())
    z = q.rsample()
    recon = F.binary_cross_entropy_with_logits(dec(z), x, reduction="sum") / x.shape[0]
    kl = kl_divergence(q, Normal(torch.zeros_like(mu), torch.ones_like(mu))).sum(1).mean()
    loss = recon + kl
    opt.zero_grad()
    loss.backward()
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
