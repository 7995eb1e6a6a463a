"""peft LoRA (r=16 on q/k/v/o) on a bf16 Llama-style base, HF gradient checkpointing, AdamW on the adapters."""
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8, num_attention_heads=32,
                  num_key_value_heads=4, vocab_size=32000, use_cache=False)
base = LlamaForCausalLM(cfg).to(torch.bfloat16)
model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                        lora_dropout=0.05)).cuda()
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
model.enable_input_require_grads()
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
for step in range(3):
    ids = torch.randint(0, 32000, (4, 2048), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print("peak", torch.cuda.max_memory_allocated())
