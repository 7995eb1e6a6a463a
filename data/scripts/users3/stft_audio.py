"""A spectrogram classifier: torch.stft with a Hann window on the GPU, log-magnitude, a 2-D CNN, bf16 autocast."""
import torch
import torch.nn as nn
import torch.nn.functional as F

net = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1),
                    nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 35)).cuda()
win = torch.hann_window(400, device="cuda")
opt = torch.optim.Adam(net.parameters())
for step in range(3):
    wav = torch.randn(64, 16000, device="cuda")
    spec = torch.stft(wav, n_fft=400, hop_length=160, window=win, return_complex=True).abs().add(1e-6).log()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(net(spec[:, None]), torch.randint(0, 35, (64,), device="cuda"))
    opt.zero_grad()
    loss.backward()
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
