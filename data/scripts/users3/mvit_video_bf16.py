"""torchvision MViT-v2-S video classification, 16 frames at 224, bf16 autocast, AdamW."""
import torch
import torchvision

m = torchvision.models.video.mvit_v2_s(num_classes=10).cuda()
opt = torch.optim.AdamW(m.parameters())
for step in range(2):
    x = torch.randn(2, 3, 16, 224, 224, device="cuda")
    y = torch.randint(0, 10, (2,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(m(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
