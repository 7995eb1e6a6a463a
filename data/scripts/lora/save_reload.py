"""base.py's LoRA loop that checkpoints after its first step with torch.save(model and optimizer state dicts)
and resumes from it: torch.load restores every tensor on the GPU it was saved from, load_state_dict copies them
in, and the loaded dict is dropped before the next step."""
import argparse
import os
import tempfile

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

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
path = os.path.join(tempfile.mkdtemp(), "checkpoint.pt")
for step in range(args.steps):
    ids = torch.randint(0, 32000, (args.batch, args.seq), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if step == 0:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path)
        ckpt = torch.load(path)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        del ckpt
print("done")
