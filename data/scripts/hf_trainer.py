"""A Hugging Face Trainer (bf16) on a Qwen2-style model built from its configuration."""
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import Qwen2Config, Qwen2ForCausalLM, Trainer, TrainingArguments


class Tokens(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = torch.randint(0, 32000, (512,))
        return {"input_ids": ids, "labels": ids}


cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=8, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=32000)
model = Qwen2ForCausalLM(cfg)
args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, max_steps=3, bf16=True,
                         report_to=[], save_strategy="no", logging_strategy="no", learning_rate=1e-4,
                         dataloader_num_workers=0, disable_tqdm=True)
Trainer(model=model, args=args, train_dataset=Tokens()).train()
print("peak", torch.cuda.max_memory_allocated())
