"""A 7B Llama-style model (Llama-2-7B's dimensions) in pure bf16, 4096 tokens, AdamW, HF gradient checkpointing."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

cfg = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, use_cache=False)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
for step in range(2):
    ids = torch.randint(0, cfg.vocab_size, (1, 4096), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print("peak", torch.cuda.max_memory_allocated())
