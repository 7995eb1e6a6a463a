"""A step that fails in the program's own code is told apart from one fake tensors cannot run
(labkit.memory.trace.refusals): suggesting ``--device cpu`` for the first would only fail again."""

import pytest
import torch
import torch.nn as nn

from labkit.memory.trace.step import FakeModeUnsupported, measure_step
from labkit.workloads import StepPolicy


class _Layers(nn.Module):
    """Runs ``self.config_layers`` layers but holds two (a configuration that disagrees with the weights, as a
    decoder whose cache was sized for fewer layers than it has)."""

    def __init__(self, read_first: bool = False):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(2))
        self.config_layers = 3
        self.read_first = read_first

    def forward(self, x):
        if self.read_first and bool((x > 0).any()):     # a value fake mode must guess (answered False)
            x = x * 2
        for i in range(self.config_layers):
            x = self.layers[i](x)
        return x.square().mean()


def _step(build, device):
    return measure_step(build, torch.randn(8, 64), StepPolicy(), device=device,
                        loss_fn=lambda out, b: out, call=lambda m, b: m(b))


def test_the_programs_own_error_is_not_called_a_fake_mode_limit():
    with pytest.raises(IndexError):                      # the same program on a real device
        _step(_Layers, "cpu")
    with pytest.raises(FakeModeUnsupported) as info:
        _step(_Layers, "fake-cuda")
    err = info.value
    assert err.own and str(err).startswith("the step itself fails in module _Layers during forward (IndexError:")
    assert "fails the same on any device" in str(err) and "--device" not in str(err)


def test_after_a_guessed_value_the_error_may_be_fake_modes_own():
    """Once fake mode has answered a value it cannot know, the program may have taken another branch than on the
    GPU: the refusal is fake mode's, with its usual suggestion."""
    with pytest.raises(FakeModeUnsupported) as info:
        _step(lambda: _Layers(read_first=True), "fake-cuda")
    err = info.value
    assert not err.own and str(err).startswith("fake mode cannot run this step in module _Layers during forward")
    assert "--device cpu" in str(err)
