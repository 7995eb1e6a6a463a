"""base.py's LoRA loop with gradient accumulation (4 micro-batches a step, the loss divided by 4),
gradient clipping and a warm-up schedule."""
import argparse

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, get_linear_schedule_with_warmup

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=22)
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--seq", type=int, default=1024)
ap.add_argument("--steps", type=int, default=3)
args = ap.parse_args()

cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=args.layers, num_attention_heads=32,
                  num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
base = LlamaForCausalLM(cfg).to(torch.bfloat16)
lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                  task_type="CAUSAL_LM")
model = get_peft_model(base, lora).cuda()
model.print_trainable_parameters()
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4, fused=True)
sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=1, num_training_steps=args.steps)
trainable = [p for p in model.parameters() if p.requires_grad]
for step in range(args.steps):
    for micro in range(4):
        ids = torch.randint(0, 32000, (args.batch, args.seq), device="cuda")
        loss = model(input_ids=ids, labels=ids).loss / 4
        loss.backward()
    torch.nn.utils.clip_grad_norm_(trainable, 1.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
print("done")
