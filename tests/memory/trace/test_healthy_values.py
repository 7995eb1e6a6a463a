"""NaN and infinity checks on fake tensors answer as for finite values (labkit.memory.trace.fake.healthy_values):
a script that skips its step when the loss is not finite still runs its backward and optimizer step on the
fake GPU."""

import textwrap

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from labkit.memory.trace.fake.healthy_values import HealthyValues


def _follow(fn):
    """fn(x) on a fake float tensor, every op observed; the value HealthyValues gives the result."""
    from torch.utils._python_dispatch import TorchDispatchMode

    hv = HealthyValues()

    class Observe(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            hv.observe(func, args, kwargs or {}, out)
            return out

    with FakeTensorMode():
        x = torch.randn(4, 3)
        with Observe():
            out = fn(x)
    return hv.value(out)


def test_checks_answer_as_for_finite_values():
    assert _follow(lambda x: torch.isfinite(x).all()) is True         # (x == x) * (x.abs() != inf), then all
    assert _follow(lambda x: ~torch.isfinite(x.sum())) is False
    assert _follow(lambda x: torch.isnan(x).any()) is False
    assert _follow(lambda x: torch.isinf(x).any() | torch.isnan(x).any()) is False
    assert _follow(lambda x: torch.logical_not(torch.isinf(x)).all()) is True
    assert _follow(lambda x: x != x) is False
    assert _follow(lambda x: x > 0) is None                          # a value's sign is not known: not followed
    assert _follow(lambda x: (x > 0) & torch.isfinite(x)) is None


GUARDED = textwrap.dedent('''
    import sys
    import torch
    import torch.nn as nn
    model = nn.Linear(512, 512).cuda()
    opt = torch.optim.AdamW(model.parameters())
    steps = 0
    for _ in range(3):
        loss = model(torch.randn(64, 512, device="cuda")).pow(2).mean()
        if not torch.isfinite(loss) or torch.isnan(loss).any():
            continue
        loss.backward()
        opt.step()
        opt.zero_grad()
        steps += 1
    print("steps", steps)
''')


def test_a_script_guarded_against_overflow_runs_its_steps(tmp_path):
    from labkit.memory.script.run import run_script

    p = tmp_path / "guarded.py"
    p.write_text(GUARDED)
    rep = run_script(str(p), banner=False)
    assert len(rep.steps) == 3                                        # no step skipped
    assert any("NaN/infinity check" in n and "read as True" in n for n in rep.notes)
    assert rep.peak_bytes >= 3 * 512 * 512 * 4                         # weights, gradients and Adam's two states
