"""A word-level LSTM LM with nn.AdaptiveLogSoftmaxWithLoss (cutoffs 2k/10k over a 50k vocabulary)."""
import torch
import torch.nn as nn

V = 50_000
emb = nn.Embedding(V, 512).cuda()
rnn = nn.LSTM(512, 512, num_layers=2, batch_first=True).cuda()
crit = nn.AdaptiveLogSoftmaxWithLoss(512, V, cutoffs=[2000, 10000], div_value=4.0).cuda()
opt = torch.optim.Adam([*emb.parameters(), *rnn.parameters(), *crit.parameters()], lr=1e-3)
for step in range(3):
    ids = torch.randint(0, V, (32, 129), device="cuda")
    h, _ = rnn(emb(ids[:, :-1]))
    out = crit(h.reshape(-1, 512), ids[:, 1:].reshape(-1))
    opt.zero_grad()
    out.loss.backward()
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
