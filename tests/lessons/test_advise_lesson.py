"""Notebook 06's step-time section (labkit.lessons.advise.step_time_check) on given checks."""

from labkit.advise.validate import StepTimeCheck
from labkit.lessons.advise import step_time_check


def _claims(sec):
    return {c.text: c.value for c in sec.claims}


def test_the_step_time_section_states_errors_the_gpu_side_the_spread_and_the_host_scale():
    checks = [StepTimeCheck("a", "reference", 0.100, 0.090, 100, gpu_busy_s=0.080, host_s=0.050),
              StepTimeCheck("b", "held-out", 0.050, 0.060, 100, gpu_busy_s=0.040, host_s=0.030)]
    sec = step_time_check(checks, gpu={"a": 0.100}, host_scale=2.0, runs={"a": [0.1, 0.15], "b": [0.05]})
    c = _claims(sec)
    assert c["Median |error| on 1 reference case(s)"] == 10.0
    assert c["Median |error| on 1 held-out case(s)"] == 20.0
    assert c["Held-out cases predicted within 20%"] == 1          # 20.0% counts as within
    assert c["GPU time alone (kernels back to back): median |error| on 1 case(s)"] == 20.0
    assert c["Widest spread of one loop's step time over its recordings (a)"] == 50.0
    assert any(t.startswith("Host cost scale") and v == 2.0 for t, v in c.items())


def test_without_gpu_times_runs_or_scale_the_section_claims_only_the_step_errors():
    sec = step_time_check([StepTimeCheck("a", "reference", 0.1, 0.1, 10, gpu_busy_s=0.1, host_s=0.01)])
    assert set(_claims(sec)) == {"Median |error| on 1 reference case(s)", "Worst |error| on the reference cases",
                                 "Reference cases predicted within 20%"}
    assert "No recorded step times" in str(step_time_check([]).notes)
