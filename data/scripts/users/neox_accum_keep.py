"""GPT-NeoX-style model (HF, from its configuration) in fp32, gradient accumulation over 4 micro-batches with
zero_grad(set_to_none=False): the gradients stay allocated between steps and are zeroed in place."""
import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

cfg = GPTNeoXConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=10, num_attention_heads=16,
                    vocab_size=50304, max_position_embeddings=2048, use_cache=False)
model = GPTNeoXForCausalLM(cfg).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95))
ACCUM = 4
for step in range(2):
    for micro in range(ACCUM):
        ids = torch.randint(0, cfg.vocab_size, (4, 1024), device="cuda")
        loss = model(input_ids=ids, labels=ids).loss / ACCUM
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
print("peak", torch.cuda.max_memory_allocated())
