"""torchvision EfficientNet-B0 trained at batch 64 under bf16 autocast, then evaluated in eval mode under
torch.no_grad() at batch 256 (a bigger evaluation batch, as people do to finish validation faster)."""
import torch
import torch.nn.functional as F
import torchvision

model = torchvision.models.efficientnet_b0(num_classes=1000).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    x = torch.randn(64, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (64,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
model.eval()
correct = 0
with torch.no_grad():
    for _ in range(2):
        x = torch.randn(256, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (256,), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            correct += (model(x).argmax(1) == y).sum().item()
print("accuracy", correct / 512, "peak", torch.cuda.max_memory_allocated())
