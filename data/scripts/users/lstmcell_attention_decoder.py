"""A sequence-to-sequence model of the pre-transformer kind: a bidirectional GRU encoder (cuDNN) and a decoder that
steps an nn.LSTMCell over the target with additive (Bahdanau) attention over the encoder states, teacher forcing,
the loss over all steps at once; float32, Adam, gradient clipping."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Seq2Seq(nn.Module):
    def __init__(self, vocab, emb, hidden):
        super().__init__()
        self.src_emb = nn.Embedding(vocab, emb)
        self.tgt_emb = nn.Embedding(vocab, emb)
        self.encoder = nn.GRU(emb, hidden, batch_first=True, bidirectional=True)
        self.bridge = nn.Linear(2 * hidden, hidden)
        self.cell = nn.LSTMCell(emb + 2 * hidden, hidden)
        self.att_enc = nn.Linear(2 * hidden, hidden, bias=False)
        self.att_dec = nn.Linear(hidden, hidden)
        self.att_v = nn.Linear(hidden, 1, bias=False)
        self.out = nn.Linear(hidden + 2 * hidden, vocab)

    def forward(self, src, tgt_in):
        enc, _ = self.encoder(self.src_emb(src))               # (B, S, 2H)
        keys = self.att_enc(enc)
        h = torch.tanh(self.bridge(enc.mean(1)))
        c = torch.zeros_like(h)
        context = enc.new_zeros(enc.shape[0], enc.shape[2])
        emb = self.tgt_emb(tgt_in)
        outs = []
        for t in range(tgt_in.shape[1]):
            h, c = self.cell(torch.cat([emb[:, t], context], -1), (h, c))
            scores = self.att_v(torch.tanh(keys + self.att_dec(h)[:, None])).squeeze(-1)
            weights = F.softmax(scores, dim=-1)
            context = torch.bmm(weights[:, None], enc).squeeze(1)
            outs.append(torch.cat([h, context], -1))
        return self.out(torch.stack(outs, 1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--src-len", type=int, default=60)
    p.add_argument("--tgt-len", type=int, default=50)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=16000)
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    torch.manual_seed(0)
    model = Seq2Seq(a.vocab, 512, a.hidden).to("cuda")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(a.steps):
        src = torch.randint(0, a.vocab, (a.batch, a.src_len), device="cuda")
        tgt = torch.randint(0, a.vocab, (a.batch, a.tgt_len + 1), device="cuda")
        logits = model(src, tgt[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, a.vocab), tgt[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step} loss {loss.item():.3f}")
    print("max_memory_allocated", torch.cuda.max_memory_allocated())


if __name__ == "__main__":
    main()
