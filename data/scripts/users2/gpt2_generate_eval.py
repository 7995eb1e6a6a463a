"""A Hugging Face GPT-2 (built from its config, no download) fine-tuned under bf16 autocast with AdamW, and after
every second step a sampling pass: model.generate(max_new_tokens=...) under eval() and torch.no_grad() on a batch
of prompts (the KV cache grows by one token per generated token), then back to train().

Tiny: --layers 2 --width 64 --batch 2 --seq 32 --gen-batch 2 --prompt 8 --new-tokens 4 --steps 2"""
import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=12)
ap.add_argument("--width", type=int, default=768)
ap.add_argument("--batch", type=int, default=12)
ap.add_argument("--seq", type=int, default=1024)
ap.add_argument("--gen-batch", type=int, default=96)
ap.add_argument("--prompt", type=int, default=256)
ap.add_argument("--new-tokens", type=int, default=48)
ap.add_argument("--steps", type=int, default=2)
args = ap.parse_args()

config = GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=args.width // 64, n_positions=1024)
model = GPT2LMHeadModel(config).to("cuda")
opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01)
for step in range(args.steps):
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"step {step} loss {loss.item():.4f}")
    if step % 2 == 1:
        model.eval()
        prompts = torch.randint(0, config.vocab_size, (args.gen_batch, args.prompt), device="cuda")
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, top_k=50,
                                 max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                 pad_token_id=config.eos_token_id)
        print("generated", tuple(out.shape))
        model.train()
print("peak", torch.cuda.max_memory_allocated())
