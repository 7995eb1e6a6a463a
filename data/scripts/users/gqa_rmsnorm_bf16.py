"""A Llama-style decoder trained in pure bfloat16 (the model cast with .to(torch.bfloat16), no autocast): grouped-query
attention through F.scaled_dot_product_attention(enable_gqa=True), nn.RMSNorm, rotary embeddings computed in float32
and cast, SwiGLU, tied input and output embeddings; AdamW with foreach off."""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def rotary(x, cos, sin):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, d, heads, kv_heads):
        super().__init__()
        self.h, self.kv, self.hd = heads, kv_heads, d // heads
        self.q = nn.Linear(d, d, bias=False)
        self.kv_proj = nn.Linear(d, 2 * kv_heads * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        q = self.q(x).view(b, t, self.h, self.hd).transpose(1, 2)
        k, v = self.kv_proj(x).view(b, t, 2, self.kv, self.hd).permute(2, 0, 3, 1, 4)
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d, heads, kv_heads, hidden):
        super().__init__()
        self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.attn = Attention(d, heads, kv_heads)
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.n1(x), cos, sin)
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Decoder(nn.Module):
    def __init__(self, vocab, d, layers, heads, kv_heads, hidden):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, kv_heads, hidden) for _ in range(layers))
        self.norm = nn.RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight
        self.hd = d // heads

    def forward(self, idx):
        t = idx.shape[1]
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2, device=idx.device, dtype=torch.float32) / self.hd))
        ang = torch.outer(torch.arange(t, device=idx.device, dtype=torch.float32), inv)
        cos, sin = ang.cos().to(self.emb.weight.dtype), ang.sin().to(self.emb.weight.dtype)
        x = self.emb(idx) * math.sqrt(self.emb.embedding_dim)
        for b in self.blocks:
            x = b(x, cos, sin)
        return self.head(self.norm(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    torch.manual_seed(0)
    model = Decoder(a.vocab, a.dim, a.layers, a.dim // 128, a.dim // 512, int(8 * a.dim / 3) // 256 * 256)
    model = model.to(device="cuda", dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, foreach=False)
    for step in range(a.steps):
        idx = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device="cuda")
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.view(-1, a.vocab).float(), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step} loss {loss.item():.3f}")
    print("max_memory_allocated", torch.cuda.max_memory_allocated())


if __name__ == "__main__":
    main()
