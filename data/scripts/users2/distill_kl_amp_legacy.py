"""Knowledge distillation with the deprecated AMP spellings: a torchvision ResNet-50 teacher in eval() under
torch.no_grad(), a ResNet-18 student trained on temperature-scaled KL divergence plus cross-entropy inside
torch.cuda.amp.autocast(), torch.cuda.amp.GradScaler(), SGD with momentum and a cosine schedule.

Tiny: --batch 2 --size 32 --steps 1"""
import argparse

import torch
import torch.nn.functional as F
import torchvision

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=256)
ap.add_argument("--size", type=int, default=224)
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--temperature", type=float, default=4.0)
args = ap.parse_args()

teacher = torchvision.models.resnet50(num_classes=1000).cuda().eval()
for p in teacher.parameters():
    p.requires_grad_(False)
student = torchvision.models.resnet18(num_classes=1000).cuda()
opt = torch.optim.SGD(student.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
scaler = torch.cuda.amp.GradScaler()
T = args.temperature
for step in range(args.steps):
    x = torch.randn(args.batch, 3, args.size, args.size, device="cuda")
    y = torch.randint(0, 1000, (args.batch,), device="cuda")
    with torch.no_grad(), torch.cuda.amp.autocast():
        t_logits = teacher(x)
    with torch.cuda.amp.autocast():
        s_logits = student(x)
        kd = F.kl_div(F.log_softmax(s_logits / T, dim=1), F.softmax(t_logits / T, dim=1),
                      reduction="batchmean") * T * T
        loss = 0.9 * kd + 0.1 * F.cross_entropy(s_logits, y)
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    sched.step()
    print(f"step {step} loss {loss.item():.4f}")
print("peak", torch.cuda.max_memory_allocated())
