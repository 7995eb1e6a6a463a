"""A 2-layer LSTM language model (cuDNN, hidden 1024) trained at batch 64 x 256 tokens with Adam and clipping,
then a validation loop at batch 128 in eval mode under torch.inference_mode()."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, HIDDEN = 16000, 1024


class LSTMLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, HIDDEN)
        self.rnn = nn.LSTM(HIDDEN, HIDDEN, num_layers=2, dropout=0.2, batch_first=True)
        self.drop = nn.Dropout(0.2)
        self.out = nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        h, _ = self.rnn(self.drop(self.emb(ids)))
        return self.out(self.drop(h))


model = LSTMLM().cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(3):
    ids = torch.randint(0, VOCAB, (64, 257), device="cuda")
    loss = F.cross_entropy(model(ids[:, :-1]).reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    opt.step()
model.eval()
total = 0.0
with torch.inference_mode():
    for _ in range(2):
        ids = torch.randint(0, VOCAB, (128, 257), device="cuda")
        total += F.cross_entropy(model(ids[:, :-1]).reshape(-1, VOCAB), ids[:, 1:].reshape(-1)).item()
print("val ppl", math.exp(total / 2), "peak", torch.cuda.max_memory_allocated())
