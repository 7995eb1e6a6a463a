"""A Hugging Face Trainer with gradient_checkpointing=True, bf16=True, gradient accumulation and fused AdamW on a
Qwen3-style model built from its configuration."""
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import Qwen3Config, Qwen3ForCausalLM, Trainer, TrainingArguments


class Tokens(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = torch.randint(0, 32000, (1024,))
        return {"input_ids": ids, "labels": ids}


cfg = Qwen3Config(hidden_size=1024, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=64, vocab_size=32000, max_position_embeddings=2048)
model = Qwen3ForCausalLM(cfg)
args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, gradient_accumulation_steps=2,
                         max_steps=2, bf16=True, gradient_checkpointing=True, optim="adamw_torch_fused",
                         report_to=[], save_strategy="no", logging_strategy="no", learning_rate=1e-4,
                         dataloader_num_workers=0, disable_tqdm=True)
Trainer(model=model, args=args, train_dataset=Tokens()).train()
print("peak", torch.cuda.max_memory_allocated())
