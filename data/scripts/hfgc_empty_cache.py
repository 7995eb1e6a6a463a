"""A Llama-style model with HF gradient checkpointing (use_cache off), amp-bf16, fused AdamW; then
empty_cache, reset_peak_memory_stats and an evaluation pass under inference_mode."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

cfg = LlamaConfig(hidden_size=1536, intermediate_size=4096, num_hidden_layers=10, num_attention_heads=12,
                  num_key_value_heads=4, vocab_size=32000, use_cache=False)
model = LlamaForCausalLM(cfg).cuda()
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
for step in range(3):
    ids = torch.randint(0, 32000, (8, 2048), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
train_peak = torch.cuda.max_memory_allocated()
torch.cuda.empty_cache()
torch.cuda.reset_peak_memory_stats()
model.eval()
with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
    logits = model(input_ids=torch.randint(0, 32000, (8, 2048), device="cuda")).logits
print("train peak", train_peak, "eval peak", torch.cuda.max_memory_allocated())
