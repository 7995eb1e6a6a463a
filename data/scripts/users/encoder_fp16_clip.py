"""nn.TransformerEncoder (batch_first, norm_first) text classifier with a key padding mask, fp16 autocast,
GradScaler, gradient clipping after scaler.unscale_, AdamW."""
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, D, LAYERS, BATCH, SEQ = 30000, 768, 12, 32, 512


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D, padding_idx=0)
        self.pos = nn.Parameter(torch.zeros(1, SEQ, D))
        layer = nn.TransformerEncoderLayer(D, 12, 4 * D, dropout=0.1, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.enc = nn.TransformerEncoder(layer, LAYERS, norm=nn.LayerNorm(D), enable_nested_tensor=False)
        self.cls = nn.Linear(D, 5)

    def forward(self, ids, pad):
        h = self.enc(self.emb(ids) + self.pos, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        return self.cls((h * keep).sum(1) / keep.sum(1).clamp(min=1))


model = Classifier().cuda()
opt = torch.optim.AdamW(model.parameters(), lr=2e-4)
scaler = torch.amp.GradScaler("cuda")
for step in range(3):
    lengths = torch.randint(SEQ // 2, SEQ + 1, (BATCH,))
    pad = torch.arange(SEQ)[None, :] >= lengths[:, None]
    ids = torch.randint(1, VOCAB, (BATCH, SEQ)).masked_fill(pad, 0)
    ids, pad, y = ids.cuda(), pad.cuda(), torch.randint(0, 5, (BATCH,)).cuda()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = F.cross_entropy(model(ids, pad), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
print("peak", torch.cuda.max_memory_allocated())
