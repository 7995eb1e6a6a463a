"""A seq2seq nn.Transformer (encoder-decoder, batch_first) whose batches are drawn on the GPU with
torch.randint, a causal target mask from generate_square_subsequent_mask and key padding masks; amp-bf16,
Adam with a warm-up LambdaLR."""
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, D = 24000, 512


class Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.src_emb, self.tgt_emb = nn.Embedding(VOCAB, D), nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(512, D)
        self.core = nn.Transformer(D, 8, 6, 6, 2048, dropout=0.1, batch_first=True)
        self.out = nn.Linear(D, VOCAB)

    def forward(self, src, tgt, src_pad, tgt_pad):
        pos_s = self.pos(torch.arange(src.shape[1], device=src.device))
        pos_t = self.pos(torch.arange(tgt.shape[1], device=tgt.device))
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device)
        h = self.core(self.src_emb(src) + pos_s, self.tgt_emb(tgt) + pos_t, tgt_mask=mask,
                      src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad,
                      tgt_is_causal=True)
        return self.out(h)


model = Seq2Seq().cuda()
opt = torch.optim.Adam(model.parameters(), lr=5e-4, betas=(0.9, 0.98), eps=1e-9)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4000))
for step in range(3):
    src = torch.randint(1, VOCAB, (48, 256), device="cuda")
    tgt = torch.randint(1, VOCAB, (48, 257), device="cuda")
    src_pad = torch.zeros(48, 256, dtype=torch.bool, device="cuda")
    src_pad[:, 200:] = True
    tgt_pad = torch.zeros(48, 256, dtype=torch.bool, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(src, tgt[:, :-1], src_pad, tgt_pad)
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), tgt[:, 1:].reshape(-1), label_smoothing=0.1)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
print("peak", torch.cuda.max_memory_allocated())
