"""torchrun script: FSDP2 on a 7B Llama-style model (Llama-2-7B's dimensions) built on the meta device, a bf16
MixedPrecisionPolicy, HF gradient checkpointing, 4096 tokens, AdamW."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (dist.get_world_size(),))
cfg = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, use_cache=False)
with torch.device("meta"):
    model = LlamaForCausalLM(cfg)
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for layer in model.model.layers:
    fully_shard(layer, mesh=mesh, mp_policy=mp)
fully_shard(model, mesh=mesh, mp_policy=mp)
model.to_empty(device="cuda")
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
for step in range(2):
    ids = torch.randint(0, cfg.vocab_size, (1, 4096), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
if dist.get_rank() == 0:
    print("peak", torch.cuda.max_memory_allocated())
dist.destroy_process_group()
