"""A hand-written CNN in fp32 fed by a DataLoader with workers and pinned memory, non_blocking copies, SGD and
zero_grad(set_to_none=False) (gradients kept between steps)."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


model = nn.Sequential(block(3, 64), block(64, 64), nn.MaxPool2d(2), block(64, 128), block(128, 128), nn.MaxPool2d(2),
                      block(128, 256), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(256, 100))
model = model.cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
data = DataLoader(TensorDataset(torch.randn(256, 3, 128, 128), torch.randint(0, 100, (256,))), batch_size=64,
                  num_workers=2, pin_memory=True, shuffle=True)
for x, y in data:
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=False)
    loss.backward()
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
