"""peft DoRA (use_dora, rsLoRA, all linear layers) on a bf16 Llama of 4 layers, AdamW over the adapters."""
import torch
import transformers
import peft

cfg = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4, vocab_size=32000)
model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).cuda()
model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", use_dora=True, use_rslora=True))
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
for step in range(2):
    ids = torch.randint(0, 32000, (4, 512), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    opt.zero_grad()
    loss.backward()
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
