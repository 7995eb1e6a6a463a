"""An accelerate loop: Accelerator(mixed_precision="bf16", gradient_accumulation_steps=2) on a Mistral-style model."""
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
from transformers import MistralConfig, MistralForCausalLM

acc = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=2)
cfg = MistralConfig(hidden_size=1024, intermediate_size=3584, num_hidden_layers=6, num_attention_heads=16,
                    num_key_value_heads=8, vocab_size=32000, use_cache=False)
model = MistralForCausalLM(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
data = DataLoader(TensorDataset(torch.randint(0, 32000, (32, 1024))), batch_size=4)
model, opt, data = acc.prepare(model, opt, data)
for i, (ids,) in enumerate(data):
    with acc.accumulate(model):
        loss = model(input_ids=ids, labels=ids).loss
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    if i == 5:
        break
print("peak", torch.cuda.max_memory_allocated())
