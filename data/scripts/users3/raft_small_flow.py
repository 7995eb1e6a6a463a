"""torchvision RAFT-small optical flow, six flow updates, an L1 loss over every update, AdamW, fp32."""
import torch
import torchvision

m = torchvision.models.optical_flow.raft_small(weights=None).cuda()
opt = torch.optim.AdamW(m.parameters())
for step in range(2):
    a = torch.randn(4, 3, 256, 320, device="cuda")
    b = torch.randn(4, 3, 256, 320, device="cuda")
    flows = m(a, b, num_flow_updates=6)
    loss = sum((f - torch.zeros_like(f)).abs().mean() for f in flows)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
