"""peft LoRA (r=16 on q/k/v/o) on a TinyLlama-sized bf16 base (.to(torch.bfloat16) before get_peft_model) trained
by the Hugging Face Trainer with bf16=True (or not: --no-bf16-flag) and no gradient checkpointing; the optimizer
is the Trainer's default (fused AdamW over the trainable parameters where torch has it)."""
import argparse
import tempfile

import torch
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=22)
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--seq", type=int, default=1024)
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--no-bf16-flag", action="store_true", help="TrainingArguments(bf16=False): the base's own bf16")
args = ap.parse_args()


class Tokens(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = torch.randint(0, 32000, (args.seq,))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=args.layers, num_attention_heads=32,
                  num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
base = LlamaForCausalLM(cfg).to(torch.bfloat16)
lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                  task_type="CAUSAL_LM")
model = get_peft_model(base, lora)
targs = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=args.batch, max_steps=args.steps,
                          bf16=not args.no_bf16_flag, learning_rate=2e-4, report_to=[], save_strategy="no",
                          logging_strategy="no", dataloader_num_workers=0, disable_tqdm=True)
Trainer(model=model, args=targs, train_dataset=Tokens()).train()
print("done")
