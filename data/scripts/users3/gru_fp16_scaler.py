"""A GRU sequence classifier under float16 autocast with a GradScaler and gradient accumulation of 2."""
import torch
import torch.nn as nn
import torch.nn.functional as F

emb = nn.Embedding(20000, 300).cuda()
gru = nn.GRU(300, 768, num_layers=2, batch_first=True).cuda()
fc = nn.Linear(768, 5).cuda()
params = [*emb.parameters(), *gru.parameters(), *fc.parameters()]
opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
scaler = torch.amp.GradScaler("cuda")
for step in range(6):
    ids = torch.randint(0, 20000, (64, 300), device="cuda")
    y = torch.randint(0, 5, (64,), device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        h, _ = gru(emb(ids))
        loss = F.cross_entropy(fc(h[:, -1]), y) / 2
    scaler.scale(loss).backward()
    if step % 2 == 1:
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(params, 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
print("peak", torch.cuda.max_memory_allocated())
