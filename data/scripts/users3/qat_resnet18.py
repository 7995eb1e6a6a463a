"""Quantisation-aware training: torchvision ResNet-18 prepared with the x86 QAT qconfig (fake-quantise observers), SGD."""
import torch
import torch.nn as nn
import torchvision
from torch.ao.quantization import get_default_qat_qconfig, prepare_qat

m = torchvision.models.resnet18(num_classes=10)
m.train()
m.qconfig = get_default_qat_qconfig("x86")
m = prepare_qat(m).cuda()
opt = torch.optim.SGD(m.parameters(), lr=0.01)
for step in range(2):
    x = torch.randn(64, 3, 112, 112, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")
    loss = nn.functional.cross_entropy(m(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
