"""torchvision Swin-T in fp32, SGD with Nesterov momentum and a OneCycleLR schedule stepped every batch."""
import torch
import torch.nn as nn
import torchvision

model = torchvision.models.swin_t(num_classes=1000).cuda()
criterion = nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-5)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=10, pct_start=0.3)
for step in range(4):
    x = torch.randn(48, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (48,), device="cuda")
    loss = criterion(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
print("peak", torch.cuda.max_memory_allocated())
