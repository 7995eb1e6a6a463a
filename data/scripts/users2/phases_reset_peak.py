"""Two phases in one program, as people tune a model then fine-tune its head: a Transformer encoder pretrained
with a masked-token loss at a large batch (fp32, AdamW), then torch.cuda.empty_cache() and
torch.cuda.reset_peak_memory_stats(), and a second phase with the embeddings and the encoder's lower half frozen
(requires_grad_(False)), a new classification head and a longer sequence under bf16 autocast, only the encoder's
top half trained. The printed peak is the second phase's.

Tiny: --layers 2 --width 64 --batch 2 --seq 16 --steps 1"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=12)
ap.add_argument("--width", type=int, default=768)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--seq", type=int, default=256)
ap.add_argument("--steps", type=int, default=2)
args = ap.parse_args()
vocab = 30522

embed = nn.Embedding(vocab, args.width).cuda()
layer = nn.TransformerEncoderLayer(args.width, args.width // 64, 4 * args.width, batch_first=True, norm_first=True)
encoder = nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False).cuda()
lm_head = nn.Linear(args.width, vocab).cuda()
params = [*embed.parameters(), *encoder.parameters(), *lm_head.parameters()]
opt = torch.optim.AdamW(params, lr=1e-4)
for step in range(args.steps):
    ids = torch.randint(0, vocab, (args.batch, args.seq), device="cuda")
    masked = torch.rand(args.batch, args.seq, device="cuda") < 0.15
    logits = lm_head(encoder(embed(ids.masked_fill(masked, 103))))
    loss = F.cross_entropy(logits.view(-1, vocab), ids.masked_fill(~masked, -100).view(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print("phase 1 peak", torch.cuda.max_memory_allocated())

del opt, lm_head, logits, loss
torch.cuda.empty_cache()
torch.cuda.reset_peak_memory_stats()
embed.requires_grad_(False)
for blk in encoder.layers[: args.layers // 2]:
    blk.requires_grad_(False)
head = nn.Sequential(nn.Linear(args.width, args.width), nn.Tanh(), nn.Linear(args.width, 20)).cuda()
opt = torch.optim.AdamW([p for p in [*encoder.parameters(), *head.parameters()] if p.requires_grad], lr=1e-4)
for step in range(args.steps):
    ids = torch.randint(0, vocab, (2 * args.batch, 2 * args.seq), device="cuda")
    y = torch.randint(0, 20, (2 * args.batch,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        feats = encoder(embed(ids))
        loss = F.cross_entropy(head(feats[:, 0]), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print("phase 2 peak", torch.cuda.max_memory_allocated())
