"""torchrun script: FSDP2 (fully_shard per layer and at the root) on a Llama-style model built on the meta
device and materialised with to_empty, AdamW. --mp: a bf16 MixedPrecisionPolicy (float32 reductions);
--ckpt: HF gradient checkpointing."""
import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--mp", action="store_true")
ap.add_argument("--ckpt", action="store_true")
ap.add_argument("--micro-batch", type=int, default=4)
ap.add_argument("--seq", type=int, default=2048)
args = ap.parse_args()

dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
mesh = init_device_mesh("cuda", (dist.get_world_size(),))
cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=12, num_attention_heads=16,
                  num_key_value_heads=4, vocab_size=32000, use_cache=False)
with torch.device("meta"):
    model = LlamaForCausalLM(cfg)
if args.ckpt:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if args.mp else MixedPrecisionPolicy()
for layer in model.model.layers:
    fully_shard(layer, mesh=mesh, mp_policy=mp)
fully_shard(model, mesh=mesh, mp_policy=mp)
model.to_empty(device="cuda")
with torch.no_grad():
    for p in model.parameters():
        p.normal_(0.0, 0.02)
model.model.rotary_emb.inv_freq = 1.0 / (10000 ** (torch.arange(0, 128, 2, device="cuda").float() / 128))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(3):
    ids = torch.randint(0, cfg.vocab_size, (args.micro_batch, args.seq), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
if dist.get_rank() == 0:
    print("peak", torch.cuda.max_memory_allocated())
dist.destroy_process_group()
