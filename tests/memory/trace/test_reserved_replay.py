"""Fake mode's reserved figure: the steady step replayed through step 4 (what a plain loop's steps 2-4 read),
and the cuBLAS workspaces of a warm process on the allocator's books before the model."""

from types import SimpleNamespace

import torch
from torch import nn

from labkit.memory.trace.fake.fake_cuda import CudaTarget
from labkit.memory.trace.reserved import MEASURED_THROUGH_STEP, replay_tracker, steady_window
from labkit.memory.trace.step import FakeCuda, measure_step

MiB = 1 << 20


def _trace(init, step1, steady, repeats=1):
    """A tracker-like object: init events, step 1, then ``repeats`` copies of the steady step (fresh ids)."""
    events, starts, phases = [(sid, n, 1) for sid, n in init], [], ["untracked", "init"]
    sizes = {}
    for k, window in enumerate([step1] + [steady] * repeats):
        starts.append(len(events))
        phases.append(f"step{k + 1}")
        off = 1000 * (k + 1) if k else 0
        for sid, n in window:
            key = sid + off if sid >= 10 else sid   # ids below 10 are persistent (not renamed)
            if n > 0:
                sizes[key] = n
            events.append((key, n if n > 0 else -sizes[key], len(phases) - 1))
    return SimpleNamespace(events=events, phases=phases), starts


# 12 MiB of parameters; each step: 40 MiB in and out, then 24, 16 and 30 MiB together; step 1 also leaves
# 20 MiB of optimizer state behind (id 1). Step 2 takes one more segment, and so does step 3.
INIT = [(0, 12 * MiB)]
STEADY = [(10, 40 * MiB), (10, -1), (11, 24 * MiB), (12, 16 * MiB), (13, 30 * MiB), (11, -1), (12, -1), (13, -1)]
STEP1 = STEADY + [(1, 20 * MiB)]


def test_the_steady_step_is_replayed_through_step_4_as_if_traced():
    two, starts = _trace(INIT, STEP1, STEADY, repeats=1)
    four, starts4 = _trace(INIT, STEP1, STEADY, repeats=3)
    traced = replay_tracker(four, step_starts=starts4)
    replayed = replay_tracker(two, step_starts=starts, through_step=MEASURED_THROUGH_STEP)
    assert traced.reserved_by_step == [82 * MiB, 112 * MiB, 142 * MiB, 142 * MiB]
    assert replayed.reserved_by_step == traced.reserved_by_step and replayed.replayed_steps == 2
    assert replayed.reserved_end == traced.reserved_end == 142 * MiB
    # without the replay: step 2's figure, one segment short of what steps 2-4 read
    assert replay_tracker(two, step_starts=starts).reserved_end == 112 * MiB


def test_a_step_that_leaves_storages_behind_is_not_replayed():
    one, starts = _trace(INIT, STEP1, STEADY, repeats=0)   # only step 1, which allocates optimizer state
    assert not steady_window(one.events, starts[-1])
    assert replay_tracker(one, step_starts=starts, through_step=4).replayed_steps == 0
    two, starts = _trace(INIT, STEP1, STEADY)
    assert steady_window(two.events + [(99, 0, 3)], starts[-1])   # a zero-byte storage changes nothing


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(256, 1024), nn.Linear(1024, 256)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).square().mean()


def _measure(target=None, steps=2):
    return measure_step(_Tiny, torch.randn(512, 256), loss_fn=lambda out, batch: out, device="fake-cuda", steps=steps,
                        fake=FakeCuda(target=target))


def test_fake_reserved_with_the_replay_equals_four_traced_steps():
    assert _measure().reserved_bytes == _measure(steps=4).reserved_bytes


def test_a_warm_process_has_both_cublas_workspaces_before_the_model():
    ws = 2 * CudaTarget().cublas_workspace_bytes
    warm = _measure(CudaTarget(warm_process=True))
    init = next(p for p in warm.all_phases if p.phase == "init")
    assert init.start_bytes == 0 and init.peak_bytes >= ws and warm.emulation["cublas_workspaces"] == 2
    cold = _measure()      # the default: a fresh process (RunSpec.process)
    init = next(p for p in cold.all_phases if p.phase == "init")
    assert init.peak_bytes < ws // 2 and cold.emulation["cublas_workspaces"] == 2
    assert warm.peak_bytes == cold.peak_bytes   # the steady step holds both either way


def test_reserved_placements_are_for_fake_mode_and_not_negative():
    import pytest

    from labkit.core.errors import LabkitError

    args = (lambda: nn.Linear(4, 4), torch.randn(2, 4))
    with pytest.raises(LabkitError, match="reserved_placements applies to device 'fake-cuda'"):
        measure_step(*args, loss_fn=lambda o, b: o.sum(), device="cpu", fake=FakeCuda(reserved_placements=2))
    with pytest.raises(LabkitError, match="reserved_placements must be 0 or more"):
        measure_step(*args, loss_fn=lambda o, b: o.sum(), fake=FakeCuda(reserved_placements=-1))
