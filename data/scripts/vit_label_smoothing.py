"""torchvision ViT-B/16, amp-bf16, label smoothing, AdamW, a OneCycle schedule."""
import torch
import torch.nn.functional as F
import torchvision

model = torchvision.models.vit_b_16(num_classes=1000).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=10)
for step in range(3):
    x = torch.randn(64, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (64,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
print("peak", torch.cuda.max_memory_allocated())
