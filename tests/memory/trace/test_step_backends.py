"""measure_step's shape: a loop over one back-end per device, its typed options, and a run whose event stream
ends with the run (what dies afterwards is no event of it)."""

import inspect

import pytest
import torch

from labkit.core.errors import LabkitError
from labkit.memory.trace.backends import CpuBackend, FakeCudaBackend, make_backend
from labkit.memory.trace.storage import StorageTracker
from labkit.memory.trace.step import FakeCuda, Probes, measure_step
from labkit.workloads import StepPolicy


def test_measure_step_stays_a_short_loop():
    """The entry point a reader walks through first: at most 100 lines (docstring included) and 10 parameters; the
    device paths live in the back-ends, the loop in ``_run_steps``."""
    lines, _ = inspect.getsourcelines(measure_step)
    assert len(lines) <= 100 and len(inspect.signature(measure_step).parameters) <= 10
    body = "".join(lines).split('"""', 2)[2]                    # after the docstring
    assert "cuda" not in body and "cpu" not in body            # no per-device branch: make_backend chooses


def test_frees_after_the_run_ends_are_not_events_of_it():
    tracker = StorageTracker(device_type="cpu", rounding=1)
    with tracker:
        kept, dropped = torch.ones(64), torch.ones(32)
        tracker.track([kept, dropped])
        del dropped
        tracker.end_run()
        n = len(tracker.events)
        del kept                                   # the model going out of scope after the last step
    assert n == 3 and len(tracker.events) == n     # two allocations, the free inside the run; nothing after


def test_each_device_has_its_back_end_and_fake_options_stay_fake():
    policy = StepPolicy()
    assert isinstance(make_backend("cpu", policy), CpuBackend)
    assert isinstance(make_backend("fake-cuda", policy, FakeCuda(reserved_placements=2)), FakeCudaBackend)
    with pytest.raises(LabkitError, match="reserved_placements applies to device 'fake-cuda'"):
        make_backend("cpu", policy, FakeCuda(reserved_placements=2))
    assert isinstance(make_backend("cpu", policy, FakeCuda()), CpuBackend)     # nothing asked of fake mode
    with pytest.raises(LabkitError, match="device 'tpu' is not one of"):
        make_backend("tpu", policy)


@pytest.mark.parametrize("bad,match", [
    (dict(policy="amp-bf16"), "policy must be a StepPolicy, got str"),
    (dict(fake={"target": None}), "fake must be a FakeCuda"),
    (dict(steps=0), "steps must be >= 1"),
])
def test_bad_arguments_are_named(bad, match):
    with pytest.raises(LabkitError, match=match):
        measure_step(lambda: torch.nn.Linear(4, 4), torch.randn(2, 4), loss_fn=lambda o, b: o.sum(),
                     call=lambda m, b: m(b), **bad)


def test_fake_options_refuse_what_they_cannot_mean():
    with pytest.raises(LabkitError, match="reserved_placements must be 0 or more"):
        FakeCuda(reserved_placements=-1)
    with pytest.raises(LabkitError, match="alloc_confs must be a sequence"):
        FakeCuda(alloc_confs="expandable_segments:True")
    with pytest.raises(LabkitError, match="loop 'keep' is not one of"):
        StepPolicy(loop="keep")
    assert Probes().rounding is None and FakeCuda(alloc_confs=["a:1"]).alloc_confs == ("a:1",)
