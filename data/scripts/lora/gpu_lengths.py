"""base.py's LoRA loop fed a boolean padding mask made on the GPU from lengths drawn there, mask = arange(seq) <
lengths[:, None] (a quarter to all of the row), the padding's ids set to 0 and its labels to -100."""
import argparse

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
for step in range(args.steps):
    lengths = torch.randint(args.seq // 4, args.seq + 1, (args.batch,), device="cuda")
    mask = torch.arange(args.seq, device="cuda")[None, :] < lengths[:, None]
    ids = torch.randint(1, 32000, (args.batch, args.seq), device="cuda") * mask
    labels = ids.masked_fill(~mask, -100)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print("done")
