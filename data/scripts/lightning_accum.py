"""A Lightning Trainer (accelerator="gpu", bf16-mixed) with gradient accumulation and clipping, on GPT-2 small."""
import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2LMHeadModel


class Tokens(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.randint(0, 50257, (512,))


class LM(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12))

    def training_step(self, ids, idx):
        return self.model(input_ids=ids, labels=ids).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4)


trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=3, accumulate_grad_batches=2,
                    gradient_clip_val=1.0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(LM(), DataLoader(Tokens(), batch_size=8, num_workers=2))
print("peak", torch.cuda.max_memory_allocated())
