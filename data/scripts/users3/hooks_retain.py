"""Forward hooks that keep every activation (a feature-extraction habit), a backward hook, retain_graph=True for two
losses, torch.autograd.functional.jacobian on a small head."""
import torch
import torch.nn as nn

model = nn.Sequential(*[nn.Sequential(nn.Linear(1024, 1024), nn.GELU()) for _ in range(6)]).cuda()
kept = []
for m in model:
    m.register_forward_hook(lambda mod, inp, out: kept.append(out))
    m.register_full_backward_hook(lambda mod, gin, gout: None)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    kept.clear()
    x = torch.randn(512, 1024, device="cuda")
    out = model(x)
    l1 = out.pow(2).mean()
    l2 = sum(k.abs().mean() for k in kept)
    opt.zero_grad()
    l1.backward(retain_graph=True)
    l2.backward()
    opt.step()
head = nn.Linear(64, 8).cuda()
J = torch.autograd.functional.jacobian(lambda z: head(z).tanh(), torch.randn(16, 64, device="cuda"))
print("jacobian", tuple(J.shape), "peak", torch.cuda.max_memory_allocated())
