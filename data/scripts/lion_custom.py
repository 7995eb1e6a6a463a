"""A hand-written Lion optimizer (sign of an interpolated momentum) on a Llama-style model in fp32."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM


class Lion(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                update = m.mul(b1).add(p.grad, alpha=1 - b1).sign_()
                p.add_(update, alpha=-group["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


cfg = LlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=6, num_attention_heads=12,
                  num_key_value_heads=12, vocab_size=32000)
model = LlamaForCausalLM(cfg).cuda()
opt = Lion(model.parameters(), lr=1e-4, weight_decay=0.1)
for step in range(3):
    ids = torch.randint(0, 32000, (4, 1024), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print("peak", torch.cuda.max_memory_allocated())
