"""A timm training script: timm.create_model("convnext_small") with drop_path, timm's Mixup/CutMix and
SoftTargetCrossEntropy, create_optimizer_v2 (AdamW, no weight decay on norms and biases), CosineLRScheduler
stepped per update, a ModelEmaV2 copy, bf16 autocast, channels_last.

Tiny: --model convnext_atto --batch 4 --size 64 --steps 2"""
import argparse

import timm
import torch
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from timm.utils import ModelEmaV2

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="convnext_small")
ap.add_argument("--batch", type=int, default=128)
ap.add_argument("--size", type=int, default=224)
ap.add_argument("--steps", type=int, default=3)
args = ap.parse_args()

model = timm.create_model(args.model, pretrained=False, num_classes=1000, drop_path_rate=0.2)
model = model.to("cuda", memory_format=torch.channels_last)
ema = ModelEmaV2(model, decay=0.9998)
opt = create_optimizer_v2(model, opt="adamw", lr=4e-3, weight_decay=0.05)
sched = CosineLRScheduler(opt, t_initial=args.steps, warmup_t=1, warmup_lr_init=1e-6)
mixup = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=1000)
criterion = SoftTargetCrossEntropy()
for step in range(args.steps):
    x = torch.randn(args.batch, 3, args.size, args.size, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (args.batch,), device="cuda")
    x, y_soft = mixup(x, y)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = criterion(model(x), y_soft)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sched.step_update(step + 1)
    ema.update(model)
    print(f"step {step} loss {loss.item():.4f} lr {opt.param_groups[0]['lr']:.2e}")
print("peak", torch.cuda.max_memory_allocated())
