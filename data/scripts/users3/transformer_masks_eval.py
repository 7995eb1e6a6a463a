"""nn.Transformer seq2seq with padding and causal masks under bf16 autocast, then an eval pass (encoder fast path)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

V, D = 8000, 512
emb = nn.Embedding(V, D).cuda()
model = nn.Transformer(D, 8, 3, 3, 2048, 0.1, batch_first=True).cuda()
head = nn.Linear(D, V).cuda()
params = list(emb.parameters()) + list(model.parameters()) + list(head.parameters())
opt = torch.optim.AdamW(params, lr=1e-4)
for step in range(3):
    src = torch.randint(1, V, (32, 128), device="cuda")
    tgt = torch.randint(1, V, (32, 97), device="cuda")
    lens = torch.randint(64, 129, (32,), device="cuda")
    src_pad = torch.arange(128, device="cuda")[None, :] >= lens[:, None]
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(96, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        h = model(emb(src), emb(tgt[:, :-1]), tgt_mask=tgt_mask, src_key_padding_mask=src_pad,
                  memory_key_padding_mask=src_pad, tgt_is_causal=True)
        loss = F.cross_entropy(head(h).float().reshape(-1, V), tgt[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
model.eval()
with torch.no_grad():
    src = torch.randint(1, V, (64, 128), device="cuda")
    pad = torch.zeros(64, 128, dtype=torch.bool, device="cuda")
    pad[:, 100:] = True
    mem = model.encoder(emb(src), src_key_padding_mask=pad)
    print("memory", tuple(mem.shape))
print("peak", torch.cuda.max_memory_allocated())
