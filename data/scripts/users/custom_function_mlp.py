"""A residual MLP stack with two custom autograd.Functions: a fused linear + GELU that saves only its input
and recomputes the activation in backward, and an RMSNorm in float32 (torch.amp.custom_fwd with
cast_inputs); bf16 autocast, AdamW with foreach off."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class LinearGELU(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight, bias)
        return F.gelu(F.linear(x, weight, bias))

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad):
        x, weight, bias = ctx.saved_tensors
        pre = F.linear(x, weight, bias)
        cdf = 0.5 * (1.0 + torch.erf(pre * 0.7071067811865476))
        pdf = torch.exp(-0.5 * pre * pre) * 0.3989422804014327
        g = grad * (cdf + pre * pdf)
        return g @ weight, g.flatten(0, -2).t() @ x.flatten(0, -2), g.flatten(0, -2).sum(0)


class RMSNormFn(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return x * rstd * weight

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        xhat = x * rstd
        gw = (grad * xhat).flatten(0, -2).sum(0)
        gx = grad * weight
        gx = rstd * (gx - xhat * (gx * xhat).mean(-1, keepdim=True))
        return gx, gw, None


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.Parameter(torch.ones(d))
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        h = RMSNormFn.apply(x, self.norm, 1e-6)
        return x + self.down(LinearGELU.apply(h, self.up.weight.to(h.dtype), self.up.bias.to(h.dtype)))


model = nn.Sequential(*[Block(1024) for _ in range(12)], nn.Linear(1024, 10)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
for step in range(3):
    x = torch.randn(16, 512, 1024, device="cuda")
    y = torch.randint(0, 10, (16, 512), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print("peak", torch.cuda.max_memory_allocated())
