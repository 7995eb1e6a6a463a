"""A word-level GRU language model trained with truncated backpropagation through time: the hidden state carried
across chunks and .detach()-ed at each, batches from a DataLoader with pin_memory=True copied with
non_blocking=True, tied input and output embeddings, zero_grad(set_to_none=False), clip_grad_norm_, SGD; fp32
(cuDNN's GRU).

Tiny: --vocab 100 --hidden 32 --layers 1 --batch 2 --bptt 8 --chunks 2"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

ap = argparse.ArgumentParser()
ap.add_argument("--vocab", type=int, default=50000)
ap.add_argument("--hidden", type=int, default=1536)
ap.add_argument("--layers", type=int, default=3)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--bptt", type=int, default=256)
ap.add_argument("--chunks", type=int, default=3)
args = ap.parse_args()


class Chunks(Dataset):
    """Consecutive BPTT windows of one long token stream per batch row."""
    def __init__(self):
        self.stream = torch.randint(0, args.vocab, (args.batch, args.chunks * args.bptt + 1))

    def __len__(self):
        return args.chunks

    def __getitem__(self, i):
        s = i * args.bptt
        return self.stream[:, s:s + args.bptt], self.stream[:, s + 1:s + args.bptt + 1]


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(args.vocab, args.hidden)
        self.rnn = nn.GRU(args.hidden, args.hidden, args.layers, dropout=0.2, batch_first=True)
        self.out = nn.Linear(args.hidden, args.vocab)
        self.out.weight = self.emb.weight

    def forward(self, x, h):
        y, h = self.rnn(self.emb(x), h)
        return self.out(y), h


model = LM().cuda()
opt = torch.optim.SGD(model.parameters(), lr=1.0)
loader = DataLoader(Chunks(), batch_size=None, pin_memory=True)
hidden = torch.zeros(args.layers, args.batch, args.hidden, device="cuda")
for i, (x, y) in enumerate(loader):
    x, y = x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)
    hidden = hidden.detach()
    logits, hidden = model(x, hidden)
    loss = F.cross_entropy(logits.view(-1, args.vocab), y.reshape(-1))
    opt.zero_grad(set_to_none=False)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    opt.step()
    print(f"chunk {i} loss {loss.item():.3f}")
print("peak", torch.cuda.max_memory_allocated())
