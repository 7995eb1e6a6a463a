"""A spatial transformer classifier: affine_grid and grid_sample ahead of a small CNN, bf16 autocast."""
import torch
import torch.nn as nn
import torch.nn.functional as F

loc = nn.Sequential(nn.Conv2d(3, 32, 7), nn.MaxPool2d(2), nn.ReLU(), nn.Conv2d(32, 32, 5), nn.AdaptiveAvgPool2d(4),
                    nn.Flatten(), nn.Linear(512, 6)).cuda()
cls = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                    nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                    nn.Flatten(), nn.Linear(128, 100)).cuda()
opt = torch.optim.SGD([*loc.parameters(), *cls.parameters()], lr=0.05, momentum=0.9, nesterov=True)
for step in range(3):
    x = torch.randn(256, 3, 96, 96, device="cuda")
    y = torch.randint(0, 100, (256,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        theta = loc(x).view(-1, 2, 3)
        grid = F.affine_grid(theta.float(), x.shape, align_corners=False)
        xs = F.grid_sample(x, grid, align_corners=False)
        loss = F.cross_entropy(cls(xs), y, label_smoothing=0.1)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
