"""accelerate with mixed_precision="fp16" (its GradScaler), gradient_accumulation_steps=4, clipping through the
accelerator when gradients sync, and a linear warm-up schedule, on a BERT masked LM built from its configuration."""
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset
from transformers import BertConfig, BertForMaskedLM, get_linear_schedule_with_warmup


class Masked(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = torch.randint(1000, 30522, (512,))
        labels = torch.full_like(ids, -100)
        pick = torch.rand(512) < 0.15
        labels[pick] = ids[pick]
        ids = ids.masked_fill(pick, 103)
        return {"input_ids": ids, "labels": labels}


acc = Accelerator(mixed_precision="fp16", gradient_accumulation_steps=4)
model = BertForMaskedLM(BertConfig(num_hidden_layers=12, hidden_size=768, num_attention_heads=12))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
sched = get_linear_schedule_with_warmup(opt, 10, 100)
loader = DataLoader(Masked(), batch_size=8, shuffle=True)
model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
for i, batch in enumerate(loader):
    with acc.accumulate(model):
        loss = model(**batch).loss
        acc.backward(loss)
        if acc.sync_gradients:
            acc.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
    if i == 7:
        break
print("peak", torch.cuda.max_memory_allocated())
