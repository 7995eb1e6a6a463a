"""``labkit``'s top-level API: the names a user imports, each its chapter's own object, loaded lazily."""

import importlib
import subprocess
import sys

import pytest

import labkit

HOMES = {  # the name's defining module: the top-level name must be that very object
    "StepSpec": "labkit.core.spec",
    "RunSpec": "labkit.core.spec",
    "measure_step": "labkit.memory.trace.step",
    "MeasureReport": "labkit.memory.trace.step",
    "StepPolicy": "labkit.workloads.harness",
    "FakeCuda": "labkit.memory.trace.backends",
    "Probes": "labkit.memory.trace.step",
    "trace_script": "labkit.memory.script.run",
    "fake_gpu": "labkit.memory.script.runtime",
    "CudaTarget": "labkit.memory.trace.fake.fake_cuda",
    "estimate": "labkit.memory.estimate.totals",
    "ModelSpec": "labkit.memory.estimate.spec",
    "ParallelSpec": "labkit.memory.estimate.spec",
    "TrainSpec": "labkit.memory.estimate.spec",
    "get_preset": "labkit.memory.estimate.presets",
    "plan": "labkit.memory.estimate.planner",
    "explain": "labkit.memory.estimate.planner",
    "watch": "labkit.allocator.watcher",
    "diagnose": "labkit.allocator.doctor",
    "probe": "labkit.core.machine",
    "load_topology": "labkit.topology.load",
    "LabkitError": "labkit.core.errors",
}


def test_import_labkit_loads_neither_torch_nor_a_chapter():
    code = ("import sys, labkit; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('labkit.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("name", sorted(HOMES))
def test_each_name_is_its_chapters_object(name):
    assert getattr(labkit, name) is getattr(importlib.import_module(HOMES[name]), name)


def test_all_lists_exactly_the_api():
    assert set(labkit.__all__) == set(HOMES) | {"__version__"}
    assert set(labkit.__all__) <= set(dir(labkit))


def test_chapters_are_attributes_and_record_is_reachable():
    from labkit.report.record import record

    assert labkit.report.record is record
    assert labkit.memory.estimate.estimate is labkit.estimate
    assert labkit.advise.advise is importlib.import_module("labkit.advise.advice").advise


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'measure'"):
        labkit.measure  # noqa: B018
    assert not hasattr(labkit, "no_such_name")
