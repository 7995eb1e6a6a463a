"""A small mixture-of-experts language model written by hand: a softmax router, top-2 of 8 SwiGLU experts, and the
usual loop over experts with ``torch.where(ids == e)`` and ``index_add_``; nn.MultiheadAttention with a causal mask;
bf16 autocast, the loss on float32 logits, AdamW."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Expert(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.w1 = nn.Linear(d, f, bias=False)
        self.w3 = nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    def __init__(self, d, f, experts, k):
        super().__init__()
        self.k = k
        self.gate = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(Expert(d, f) for _ in range(experts))

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float)
        weights, ids = torch.topk(probs, self.k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            tok, slot = torch.where(ids == e)
            if tok.numel() == 0:
                continue
            out.index_add_(0, tok, expert(x[tok]) * weights[tok, slot, None])
        return out.view(shape)


class Block(nn.Module):
    def __init__(self, d, heads, f, experts, k):
        super().__init__()
        self.n1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.n2 = nn.LayerNorm(d)
        self.moe = MoE(d, f, experts, k)

    def forward(self, x, mask):
        h = self.n1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False, is_causal=True)[0]
        return x + self.moe(self.n2(x))


class LM(nn.Module):
    def __init__(self, vocab, d, heads, f, layers, experts, k):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, f, experts, k) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        mask = nn.Transformer.generate_square_subsequent_mask(idx.shape[1], device=idx.device)
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.norm(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    torch.manual_seed(0)
    model = LM(a.vocab, a.dim, a.dim // 64, 8 * a.dim // 3, a.layers, a.experts, 2).to("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step in range(a.steps):
        idx = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(idx)
        loss = F.cross_entropy(logits.float().view(-1, a.vocab), idx.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step} loss {loss.item():.3f}")
    print("max_memory_allocated", torch.cuda.max_memory_allocated())


if __name__ == "__main__":
    main()
