"""T5 (HF, from its configuration) with transformers' Adafactor, amp-bf16."""
import torch
from transformers import T5Config, T5ForConditionalGeneration
from transformers.optimization import Adafactor

cfg = T5Config(d_model=768, d_ff=2048, num_layers=8, num_heads=12, vocab_size=32128, decoder_start_token_id=0,
               pad_token_id=0)
model = T5ForConditionalGeneration(cfg).cuda()
opt = Adafactor(model.parameters(), lr=1e-3, relative_step=False, scale_parameter=False)
for step in range(3):
    src = torch.randint(0, 32128, (16, 512), device="cuda")
    tgt = torch.randint(0, 32128, (16, 128), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=src, labels=tgt).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print("peak", torch.cuda.max_memory_allocated())
