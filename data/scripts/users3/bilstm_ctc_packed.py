"""Speech-style bidirectional LSTM with projections over packed variable-length input, CTC loss, fp32."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

rnn = nn.LSTM(80, 512, num_layers=3, bidirectional=True, proj_size=256, batch_first=True, dropout=0.1).cuda()
head = nn.Linear(512, 32).cuda()
opt = torch.optim.Adam(list(rnn.parameters()) + list(head.parameters()), lr=1e-3)
for step in range(3):
    x = torch.randn(24, 400, 80, device="cuda")
    lens = torch.randint(200, 401, (24,))
    packed = pack_padded_sequence(x, lens, batch_first=True, enforce_sorted=False)
    h, out_lens = pad_packed_sequence(rnn(packed)[0], batch_first=True)
    logp = F.log_softmax(head(h), -1).transpose(0, 1)
    targets = torch.randint(1, 32, (24, 60), device="cuda")
    tlens = torch.randint(30, 61, (24,))
    loss = F.ctc_loss(logp, targets, out_lens, tlens, zero_infinity=True)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(rnn.parameters(), 5.0)
    opt.step()
print("peak", torch.cuda.max_memory_allocated())
