"""Notebook 00's sections, on the recorded H200 and on a fake live machine."""

import pytest

from labkit.core.machine import GPUInfo, MachineInfo
from labkit.core.units import GB, GiB, fmt_bytes
from labkit.env.server import ServerView
from labkit.lessons import this_server as lesson


def _machine(gpus):
    return MachineInfo(hostname="box", os="Linux", python="3.11", labkit_version="0", git_commit=None,
                       torch_version="2.11.0+cu130", cuda_version="13.0", nccl_version="2.28.9", cuda_available=True,
                       driver_version="580.1", nvml="ok", gpus=gpus, cpu_model="Xeon", cpu_logical_cores=32,
                       cpu_physical_cores=16, numa_nodes=2, ram_bytes=512 * GiB)


@pytest.fixture
def recorded():
    return lesson.this_server("recorded")


def test_gpu_memory_wording_is_computed_from_the_number_the_table_shows(recorded, recorded_results):
    sec = lesson.gpu_memory(recorded)
    total = recorded.machine.gpus[0].memory_total_bytes
    gib = sec.value("gpu0_memory_total")
    assert gib == pytest.approx(total / GiB, abs=1e-3)
    shown = {c.text.split(" (")[0]: c.value_text() for c in sec.claims}
    assert f"{total / GiB:.2f} GiB" in shown.values()
    assert f"{total / GB:.2f} GB" in shown.values()
    # the machine table's GPU0 row shows the same GiB figure as the claim beside it
    table = dict(lesson.machine(recorded).rows)
    assert f"{gib:.2f} GiB" in table["GPU0"]
    assert sec.figures and sec.figures[0].title is not None
    sec.record()  # a recorded server's figures cannot change between runs: shown, not key results
    assert "gpu0_memory_total" not in recorded_results() and "gpu_count" not in recorded_results()
    here = lesson.machine(recorded)
    here.record()  # this machine's own GPU count is, with a direction (a GPU gone is a regression)
    assert recorded_results()["gpus_here"].source == "measured here"
    assert recorded_results()["gpus_here"].direction == "higher"


def test_recorded_view_says_it_is_not_this_machine(recorded):
    sec = lesson.machine(recorded)
    shown = [c for c in sec.claims if c.text == "The server shown below"][0]
    assert shown.value == "the recorded GPU server"
    assert recorded.origin in sec.caption


def test_live_machine_with_a_gpu_in_use():
    g = GPUInfo(0, "NVIDIA H100 80GB HBM3", 80 * GiB, 79 * GiB, compute_capability="9.0")
    view = ServerView(_machine([g, GPUInfo(1, "NVIDIA H100 80GB HBM3", 80 * GiB, 78 * GiB)]), True, "measured here")
    m = lesson.machine(view)
    assert [c.value for c in m.claims][:2] == [2, "this machine"]
    assert not any("No NVIDIA GPU" in n for n in m.notes)
    sec = lesson.gpu_memory(view)
    assert sec.value("gpu0_memory_total") == 80.0 and sec.value("gpu_count") == 2
    assert {c.name: c.direction for c in sec.claims if c.name} == {"gpu_count": "higher", "gpu0_memory_total": "higher"}
    held = [c for c in sec.claims if c.text.startswith("Most memory already in use")][0]
    assert held.value == fmt_bytes(2 * GiB)
    v = lesson.versions(view)
    assert [c.value for c in v.claims][:3] == ["580.1", "2.11.0+cu130, CUDA 13.0", "2.28.9"]
    assert v.claims[3].value == "9.0"


def test_a_server_without_gpus_is_a_stated_gap():
    view = ServerView(_machine([]), True, "measured here")
    sec = lesson.gpu_memory(view)
    assert sec.value("gpu_count") == 0 and sec.notes and not sec.figures
    assert any("No NVIDIA GPU here" in n for n in lesson.machine(view).notes)


def test_units_explorer_toggles_the_units(recorded):
    sec = lesson.units(recorded)
    assert sec.rows[0][2].endswith(" GB") and sec.widgets
    box = sec.widgets[0]
    assert "labkit-explorer" in box._dom_classes
    toggle = box.children[0]
    toggle.value = False  # redraws without a kernel too
    assert toggle.value is False
