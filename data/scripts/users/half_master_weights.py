"""An OPT-style model (HF, from its configuration) moved to fp16 with .half(), trained with fp32 master weights
kept by hand: the fp16 gradients are copied into the masters, a static loss scale is undone, AdamW steps the
masters, and the result is copied back into the fp16 model."""
import torch
from transformers import OPTConfig, OPTForCausalLM

cfg = OPTConfig(hidden_size=1024, ffn_dim=4096, num_hidden_layers=12, num_attention_heads=16, vocab_size=50272,
                max_position_embeddings=2048, word_embed_proj_dim=1024)
model = OPTForCausalLM(cfg).cuda().half()
params = [p for p in model.parameters() if p.requires_grad]
masters = [p.detach().float().clone().requires_grad_(True) for p in params]
opt = torch.optim.AdamW(masters, lr=1e-4)
LOSS_SCALE = 1024.0
for step in range(3):
    ids = torch.randint(0, cfg.vocab_size, (8, 1024), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    (loss * LOSS_SCALE).backward()
    for m, p in zip(masters, params):
        m.grad = p.grad.float() / LOSS_SCALE
        p.grad = None
    opt.step()
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        for m, p in zip(masters, params):
            p.copy_(m)
print("peak", torch.cuda.max_memory_allocated())
