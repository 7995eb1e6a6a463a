"""An MLP fitted with torch.optim.LBFGS (a closure, five inner iterations, history 10) and ReduceLROnPlateau."""
import torch
import torch.nn as nn

net = nn.Sequential(nn.Linear(512, 2048), nn.Tanh(), nn.Linear(2048, 512)).cuda()
opt = torch.optim.LBFGS(net.parameters(), lr=0.5, max_iter=5, history_size=10)
sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
x = torch.randn(4096, 512, device="cuda")
y = torch.randn(4096, 512, device="cuda")
for step in range(3):
    def closure():
        opt.zero_grad()
        loss = (net(x) - y).pow(2).mean()
        loss.backward()
        return loss
    loss = opt.step(closure)
    sched.step(loss)
print("peak", torch.cuda.max_memory_allocated())
