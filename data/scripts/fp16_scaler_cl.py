"""torchvision ResNet-50, channels_last, fp16 autocast with GradScaler, SGD with momentum."""
import torch
import torch.nn.functional as F
import torchvision

model = torchvision.models.resnet50(num_classes=1000).cuda().to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
scaler = torch.amp.GradScaler("cuda")
for step in range(3):
    x = torch.randn(96, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (96,), device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
print("peak", torch.cuda.max_memory_allocated())
