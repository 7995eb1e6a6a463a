"""Optimizer states on the host: gradients copied to pinned CPU buffers, Adam stepping on the CPU, weights copied back
(a ZeRO-offload habit by hand), bf16 weights on the GPU."""
import torch
import torch.nn as nn

model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(8)]).cuda().to(torch.bfloat16)
master = [p.detach().float().cpu().pin_memory().requires_grad_() for p in model.parameters()]
opt = torch.optim.Adam(master, lr=1e-4)
for step in range(3):
    x = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16)
    loss = model(x).float().pow(2).mean()
    loss.backward()
    for p, m in zip(model.parameters(), master):
        m.grad = p.grad.float().cpu()
        p.grad = None
    opt.step()
    with torch.no_grad():
        for p, m in zip(model.parameters(), master):
            p.copy_(m.to("cuda", non_blocking=True))
print("peak", torch.cuda.max_memory_allocated())
