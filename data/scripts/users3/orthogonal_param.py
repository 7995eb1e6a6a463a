"""An RNN with an orthogonal recurrent weight (nn.utils.parametrizations.orthogonal) and a pruned input layer
(torch.nn.utils.prune), Adam, fp32."""
import torch
import torch.nn as nn
import torch.nn.utils.prune as prune
from torch.nn.utils.parametrizations import orthogonal

rnn = nn.RNN(256, 512, batch_first=True, nonlinearity="relu").cuda()
orthogonal(rnn, "weight_hh_l0")
inp = nn.Linear(128, 256).cuda()
prune.l1_unstructured(inp, "weight", amount=0.5)
out = nn.Linear(512, 10).cuda()
opt = torch.optim.Adam([*rnn.parameters(), *inp.parameters(), *out.parameters()])
for step in range(3):
    h, _ = rnn(inp(torch.randn(64, 200, 128, device="cuda")))
    loss = nn.functional.cross_entropy(out(h[:, -1]), torch.randint(0, 10, (64,), device="cuda"))
    opt.zero_grad()
    loss.backward()
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
