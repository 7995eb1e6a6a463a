"""A Llama-style model in pure bf16 (model.to(bfloat16)), AdamW, and an EMA copy of the weights."""
import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM

cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16)
ema = copy.deepcopy(model).eval()
for p in ema.parameters():
    p.requires_grad_(False)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(3):
    ids = torch.randint(0, cfg.vocab_size, (4, 1024), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        for pe, pm in zip(ema.parameters(), model.parameters()):
            pe.lerp_(pm, 0.001)
print("peak", torch.cuda.max_memory_allocated())
