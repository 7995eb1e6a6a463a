"""A Llama-style decoder written the way Meta's reference code writes it: rotary embeddings as complex numbers
(``torch.polar``, ``view_as_complex``, ``view_as_real``), RMSNorm, SwiGLU, fused QKV, SDPA with ``is_causal``;
bf16 autocast, the loss on float32 logits, fused AdamW."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def rotary_table(head_dim, length, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    angles = torch.outer(torch.arange(length, device=freqs.device), freqs).float()
    return torch.polar(torch.ones_like(angles), angles)


def rotate(q, k, table):
    q_ = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
    k_ = torch.view_as_complex(k.float().reshape(*k.shape[:-1], -1, 2))
    table = table.view(1, q_.shape[1], 1, q_.shape[-1])
    return torch.view_as_real(q_ * table).flatten(3).type_as(q), torch.view_as_real(k_ * table).flatten(3).type_as(k)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.n1 = nn.RMSNorm(d)
        self.n2 = nn.RMSNorm(d)
        hidden = 4 * d
        self.w1 = nn.Linear(d, hidden, bias=False)
        self.w3 = nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)

    def forward(self, x, table):
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k = rotate(q, k, table)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, d))
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Decoder(nn.Module):
    def __init__(self, vocab, d, heads, layers, length):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm = nn.RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("table", rotary_table(d // heads, length), persistent=False)

    def forward(self, idx):
        x = self.emb(idx)
        table = self.table[: idx.shape[1]]
        for b in self.blocks:
            x = b(x, table)
        return self.head(self.norm(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    torch.manual_seed(0)
    model = Decoder(a.vocab, a.dim, a.dim // 64, a.layers, a.seq).to("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    for step in range(a.steps):
        idx = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(idx)
        loss = F.cross_entropy(logits.float().flatten(0, 1), idx.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step} loss {loss.item():.3f}")
    print("max_memory_allocated", torch.cuda.max_memory_allocated())


if __name__ == "__main__":
    main()
