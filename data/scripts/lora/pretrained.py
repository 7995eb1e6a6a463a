"""peft LoRA (r=16 on q/k/v/o) on a TinyLlama-sized model loaded as users load one: from_pretrained of a checkpoint
(a randomly initialised one is saved first to a temporary folder: no download), cast with .to(torch.bfloat16)
before get_peft_model, left in the eval mode from_pretrained leaves it in, moved with .to("cuda"), fused AdamW
over model.parameters(), a tokenizer-like batch passed as model(**batch). --device-map loads it straight onto
the GPU (device_map="cuda") instead."""
import argparse
import tempfile

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=22)
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--seq", type=int, default=1024)
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--device-map", action="store_true")
args = ap.parse_args()

ckpt = tempfile.mkdtemp()
cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=args.layers, num_attention_heads=32,
                  num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(ckpt)

if args.device_map:
    base = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16, device_map="cuda")
else:
    base = AutoModelForCausalLM.from_pretrained(ckpt).to(torch.bfloat16)
lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                  task_type="CAUSAL_LM")
model = get_peft_model(base, lora)
model.print_trainable_parameters()
model.to("cuda")
opt = torch.optim.AdamW(model.parameters(), lr=2e-4, fused=True)
for step in range(args.steps):
    ids = torch.randint(0, 32000, (args.batch, args.seq))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    batch = {k: v.to("cuda") for k, v in batch.items()}
    loss = model(**batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
print("done")
