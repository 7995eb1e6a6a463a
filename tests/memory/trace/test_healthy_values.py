"""NaN and infinity checks on fake tensors answer as for finite values (labkit.memory.trace.fake.healthy_values):
a script that skips its step when the loss is not finite still runs its backward and optimizer step on the
fake GPU."""

import textwrap

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from labkit.memory.trace.fake.healthy_values import HealthyValues


def _observed(fn, answer):
    """fn(x) on a fake float tensor, every op observed; ``answer(hv, result)`` of the HealthyValues that saw them."""
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
        return answer(hv, out)


def _follow(fn):
    """The value HealthyValues gives fn(x)."""
    return _observed(fn, HealthyValues.value)


def _from_draw(fn):
    """Whether HealthyValues calls fn(x) random."""
    return _observed(fn, HealthyValues.random)


def test_a_test_of_a_random_draw_is_known_as_random():
    assert _from_draw(lambda x: torch.rand([]) < 0.1)                  # Hugging Face's LayerDrop
    assert _from_draw(lambda x: (torch.rand(1) * 2 > 1.5).any())
    assert _from_draw(lambda x: torch.randint(0, 10, (1,)) == 3)
    assert not _from_draw(lambda x: (torch.empty(3, 3).normal_() @ x.T).sum() > 1)   # an initialised weight's use
    assert not _from_draw(lambda x: (x + torch.randn_like(x)).sum() > 1)              # noise: not followed
    assert not _from_draw(lambda x: x > 0)
    assert not _from_draw(lambda x: torch.isfinite(x).all())


class _LayerDrop(torch.nn.Module):
    """Four layers, each skipped when a draw falls under 0.5 (as ``Wav2Vec2Encoder`` skips with ``layerdrop``)."""

    def __init__(self, draw: bool):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(4))
        self.draw = draw

    def forward(self, x):
        for layer in self.layers:
            if not (self.draw and torch.rand([]) < 0.5):
                x = torch.relu(layer(x))
        return x.square().mean()


def test_layerdrop_is_traced_with_every_layer_and_said_to_be_random():
    """Fake mode traces the step in which no layer is skipped (the most memory), and says that on the GPU the
    peak there varies from step to step."""
    from labkit.memory.trace.step import measure_step
    from labkit.workloads import StepPolicy

    batch = torch.randn(512, 256)
    runs = {draw: measure_step(lambda: _LayerDrop(draw), batch, StepPolicy(), device="fake-cuda",
                               loss_fn=lambda out, b: out, call=lambda m, b: m(b)) for draw in (True, False)}
    assert runs[True].peak_bytes == runs[False].peak_bytes
    (said,) = runs[True].emulation["assumptions"]
    assert "random draw" in said and "_LayerDrop" in said and "step to step" in said
    assert not runs[False].emulation["assumptions"]


def test_checks_answer_as_for_finite_values():
    assert _follow(lambda x: torch.isfinite(x).all()) is True         # (x == x) * (x.abs() != inf), then all
    assert _follow(lambda x: ~torch.isfinite(x.sum())) is False
    assert _follow(lambda x: torch.isnan(x).any()) is False
    assert _follow(lambda x: torch.isinf(x).any() | torch.isnan(x).any()) is False
    assert _follow(lambda x: torch.logical_not(torch.isinf(x)).all()) is True
    assert _follow(lambda x: x != x) is False
    assert _follow(lambda x: x > 0) is None                          # a value's sign is not known: not followed
    assert _follow(lambda x: (x > 0) & torch.isfinite(x)) is None
    # counts of a followed boolean, compared with a number (I-BERT's quantiser asserts x.isnan().sum() == 0)
    assert _follow(lambda x: x.isnan().sum() == 0) is True
    assert _follow(lambda x: torch.isinf(x).sum() > 0) is False
    assert _follow(lambda x: torch.isfinite(x).sum(dim=1) == 3).__bool__() is True    # 3 columns, all finite
    assert _follow(lambda x: torch.count_nonzero(~torch.isfinite(x)) != 0) is False
    assert _follow(lambda x: (x > 0).sum() == 0) is None                               # a sign count: not known


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


CHECKED = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributions import Categorical, Normal, kl_divergence

    enc = nn.Linear(64, 32).cuda()
    opt = torch.optim.Adam(enc.parameters())
    ran = 0
    for step in range(2):
        x = torch.randn(2048, 64, device="cuda")                      # too large to carry values (script mode)
        y = torch.randint(0, 16, (2048,), device="cuda") + x[:, 0].long() * 0     # computed from x: no values
        assert (y >= 0).all() and (y < 16).all(), "labels out of range"
        assert not (y < 0).any()
        if not (x.abs() < 1e4).all():
            print("diverged")
            raise RuntimeError("inputs out of range")
        if (y > 15).any():
            raise ValueError("label above 15")
        mu, logvar = enc(x).chunk(2, 1)
        q = Normal(mu, (0.5 * logvar).exp())                          # validate_args: on by default
        kl = kl_divergence(q, Normal(torch.zeros_like(mu), torch.ones_like(mu))).sum(1).mean()
        pi = Categorical(logits=q.rsample())
        loss = kl - pi.log_prob(y).mean()
        torch._assert(loss.isfinite(), "loss")
        opt.zero_grad()
        loss.backward()
        opt.step()
        ran += 1
    print("ran", ran)
''')


def test_checks_that_raise_pass_as_in_a_working_run(tmp_path):
    """An assert holds and an ``if`` that only raises is not taken: torch.distributions' argument validation, the
    script's own label checks."""
    from labkit.memory.script.run import run_script

    p = tmp_path / "checked.py"
    p.write_text(CHECKED)
    rep = run_script(str(p), banner=False)
    assert len(rep.steps) == 2
    notes = "\n".join(rep.notes)
    assert "the check that raises at torch/distributions/distribution.py" in notes and "read as True" in notes
    assert "the assert at checked.py:13" in notes                        # (y >= 0).all() and (y < 16).all(): True
    assert "the assert at checked.py:14" in notes and "the check that raises at checked.py:15" in notes
    assert "the check that raises at checked.py:18 (code outside any module) read as False" in notes


def test_a_check_whose_failing_operand_is_open_is_not_decided(tmp_path):
    """``if a and b: raise``: which of the two fails is open, so the statement decides nothing (None); the same
    read in an ``or`` that must not hold, or an ``and`` that must, is decided."""
    import ast

    from labkit.memory.trace.fake.healthy_values import _reads_need

    def need(src, want):
        return _reads_need(ast.parse(src).body[0].value, want)

    assert need("a.all() and b.all()", False) is None
    assert need("a.any() or b.any()", False) == {False}
    assert need("a.all() and not b.any()", True) == {True, False}      # two reads needing different answers
    assert need("not (a.all() and b.all())", False) == {True}
    assert need("not not x", True) == {True}


def test_value_comparisons_answer_from_their_statement_else_false():
    """torch.equal/torch.allclose of values fake tensors do not have: an assert of one holds, an unguarded one is
    False; nn.utils.parametrizations.orthogonal (which asks whether its weight is orthogonal already) runs."""
    from torch.nn.utils.parametrizations import orthogonal

    from labkit.memory.script.runtime import fake_gpu

    with fake_gpu() as gpu:
        a = torch.randn(64, 64, device="cuda") @ torch.randn(64, 64, device="cuda")
        assert torch.allclose(a, a.T @ a)                    # the assert's test holds
        same = torch.equal(a, a.clone())
        layer = orthogonal(torch.nn.Linear(64, 64).cuda())
        assert layer.weight.shape == (64, 64)
    assert same is False
    notes = gpu.report().notes
    assert any(n.startswith("torch.allclose in the assert at test_healthy_values.py:") for n in notes)
    assert any(n.startswith("torch.equal (code outside any module) read as False") for n in notes)


DECODE = textwrap.dedent('''
    import torch
    import torch.nn as nn
    model = nn.Sequential(nn.Embedding(100, 64), nn.Linear(64, 100)).cuda()
    for batch in range(2):
        x = torch.randint(0, 100, (8, 1), device="cuda")
        done = torch.zeros(8, dtype=torch.bool, device="cuda")
        passes = 0
        while not done.all():
            tok = model(x[:, -1:]).argmax(-1)
            x = torch.cat([x, tok], 1)
            done |= (tok == 2).squeeze(1)
            passes += 1
        print("passes", passes)
''')


def test_a_while_loop_on_unknown_values_ends(tmp_path):
    """A decoding loop ``while not done.all():`` whose ``done`` comes from a model's output: fake tensors cannot
    say when it ends, and reading False would never end it. The first pass runs on known values (all False), the
    loop goes on once at the first test it cannot answer and ends at the next, each time it is entered."""
    import subprocess
    import sys

    p = tmp_path / "decode.py"
    p.write_text(DECODE)
    r = subprocess.run([sys.executable, "-m", "labkit", "measure", "--script", str(p)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("passes 2") == 2, (r.stdout, r.stderr)                 # two entries, two passes each
    assert "the while loop at decode.py:9" in r.stdout and "went on once, then ended" in r.stdout
