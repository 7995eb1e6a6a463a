"""A Lightning Trainer (bf16-mixed, accumulate_grad_batches=4) fine-tuning a BERT-base-sized sequence
classifier built from its configuration, with a validation loop (Lightning runs it under inference_mode)."""
import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset
from transformers import BertConfig, BertForSequenceClassification


class Pairs(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.randint(1, 30522, (384,)), torch.ones(384, dtype=torch.long), torch.randint(0, 3, ())


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = BertForSequenceClassification(BertConfig(num_labels=3))

    def training_step(self, batch, idx):
        ids, mask, y = batch
        return self.model(input_ids=ids, attention_mask=mask, labels=y).loss

    def validation_step(self, batch, idx):
        ids, mask, y = batch
        self.log("val_loss", self.model(input_ids=ids, attention_mask=mask, labels=y).loss)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=2e-5, weight_decay=0.01)


trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=2, accumulate_grad_batches=4,
                    val_check_interval=4, limit_val_batches=2, num_sanity_val_steps=0, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Classifier(), DataLoader(Pairs(128), batch_size=16), DataLoader(Pairs(64), batch_size=64))
print("peak", torch.cuda.max_memory_allocated())
