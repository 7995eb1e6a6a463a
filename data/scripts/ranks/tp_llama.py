"""torchrun script: DTensor tensor parallelism (Megatron's column/row split of attention and MLP) of the
Llama-style model of fsdp2_llama.py, embeddings and LM head replicated, bf16 autocast, for-loop AdamW
(foreach cannot mix DTensor and plain parameters). World sizes that divide its 4 key/value heads: 2 or 4."""
import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from transformers import LlamaConfig, LlamaForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--micro-batch", type=int, default=4)
ap.add_argument("--seq", type=int, default=2048)
args = ap.parse_args()

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (dist.get_world_size(),))
cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=12, num_attention_heads=16,
                  num_key_value_heads=4, vocab_size=32000, use_cache=False)
model = LlamaForCausalLM(cfg).cuda()
plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()}
for layer in model.model.layers:
    parallelize_module(layer, mesh, plan)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)  # foreach cannot mix DTensor and Tensor
for step in range(3):
    ids = torch.randint(0, cfg.vocab_size, (args.micro_batch, args.seq), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
if dist.get_rank() == 0:
    print("peak", torch.cuda.max_memory_allocated())
dist.destroy_process_group()
