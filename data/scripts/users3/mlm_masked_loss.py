"""A masked LM on nn.TransformerEncoder: 15% of tokens masked by a random draw, the loss over the selected rows
(h[labels != -100]), a bincount and torch.unique of the labels seen, AdamW, fp32."""
import torch
import torch.nn as nn
import torch.nn.functional as F

emb = nn.Embedding(30000, 768).cuda()
enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True), 4).cuda()
head = nn.Linear(768, 30000).cuda()
opt = torch.optim.AdamW([*emb.parameters(), *enc.parameters(), *head.parameters()])
for step in range(3):
    ids = torch.randint(0, 30000, (32, 256), device="cuda")
    labels = ids.clone()
    mask = torch.rand(ids.shape, device="cuda") < 0.15
    labels[~mask] = -100
    h = enc(emb(ids))
    sel = labels != -100
    logits = head(h[sel])
    loss = F.cross_entropy(logits, labels[sel])
    cls_w = torch.bincount(labels[sel], minlength=30000).float()
    seen = torch.unique(labels[sel], return_counts=True)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
