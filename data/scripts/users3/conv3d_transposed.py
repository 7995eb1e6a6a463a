"""A 3-D encoder-decoder: grouped and dilated Conv3d, ConvTranspose3d with output_padding, trilinear upsampling,
channels_last_3d, bf16 autocast, Dice plus cross-entropy loss."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.e1 = nn.Sequential(nn.Conv3d(1, 32, 3, padding=1), nn.InstanceNorm3d(32, affine=True), nn.LeakyReLU())
        self.e2 = nn.Sequential(nn.Conv3d(32, 64, 3, stride=2, padding=1), nn.GroupNorm(8, 64), nn.GELU(),
                                nn.Conv3d(64, 64, 3, padding=2, dilation=2, groups=4), nn.GELU())
        self.up = nn.ConvTranspose3d(64, 32, 3, stride=2, padding=1, output_padding=1)
        self.head = nn.Conv3d(64, 4, 1)

    def forward(self, x):
        a = self.e1(x)
        b = self.e2(a)
        u = self.up(b)
        y = self.head(torch.cat([a, u], 1))
        return y + F.interpolate(self.head(torch.cat([a, a], 1))[:, :, ::2, ::2, ::2], scale_factor=2,
                                 mode="trilinear", align_corners=False)


net = Net().cuda().to(memory_format=torch.channels_last_3d)
opt = torch.optim.AdamW(net.parameters())
for step in range(3):
    x = torch.randn(4, 1, 64, 64, 64, device="cuda").to(memory_format=torch.channels_last_3d)
    y = torch.randint(0, 4, (4, 64, 64, 64), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = net(x)
    p = logits.float().softmax(1)
    onehot = F.one_hot(y, 4).permute(0, 4, 1, 2, 3).float()
    dice = 1 - (2 * (p * onehot).sum((2, 3, 4)) + 1) / (p.sum((2, 3, 4)) + onehot.sum((2, 3, 4)) + 1)
    loss = F.cross_entropy(logits.float(), y) + dice.mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
