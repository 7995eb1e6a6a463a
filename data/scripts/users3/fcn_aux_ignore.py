"""torchvision FCN-ResNet50 with its auxiliary head, cross-entropy with ignore_index 255, poly LR, fp32."""
import torch
import torch.nn.functional as F
from torchvision.models.segmentation import fcn_resnet50

model = fcn_resnet50(weights=None, weights_backbone=None, num_classes=21, aux_loss=True).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
sched = torch.optim.lr_scheduler.PolynomialLR(opt, total_iters=100, power=0.9)
for step in range(3):
    x = torch.randn(8, 3, 320, 320, device="cuda")
    y = torch.randint(0, 21, (8, 320, 320), device="cuda")
    y[:, :10] = 255
    out = model(x)
    loss = F.cross_entropy(out["out"], y, ignore_index=255) + 0.5 * F.cross_entropy(out["aux"], y, ignore_index=255)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
print("peak", torch.cuda.max_memory_allocated())
