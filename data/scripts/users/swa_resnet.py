"""torchvision ResNet-34 at 160 px in fp32, SGD with momentum, then stochastic weight averaging:
torch.optim.swa_utils.AveragedModel and SWALR from step 3, and update_bn over a few batches at the end."""
import torch
import torch.nn.functional as F
import torchvision
from torch.optim.swa_utils import SWALR, AveragedModel, update_bn

model = torchvision.models.resnet34(num_classes=200).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
swa_model = AveragedModel(model)
swa_sched = SWALR(opt, swa_lr=0.05)
for step in range(5):
    x = torch.randn(128, 3, 160, 160, device="cuda")
    y = torch.randint(0, 200, (128,), device="cuda")
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if step >= 2:
        swa_model.update_parameters(model)
        swa_sched.step()
loader = [torch.randn(128, 3, 160, 160, device="cuda") for _ in range(2)]
update_bn(loader, swa_model)
print("peak", torch.cuda.max_memory_allocated())
