"""One compute rate for one GPU in every planner: ``labkit estimate --plan`` and ``labkit advise`` charge
the recorded H200 matmul rate (labkit.memory.estimate.rates) and price the same job alike (issue 26)."""

from __future__ import annotations

import json

import pytest

from labkit.cli import main


def _json(capsys, *argv) -> dict:
    rc = main(list(argv))
    out = capsys.readouterr().out
    assert rc == 0, out
    return json.loads(out)


@pytest.fixture(scope="module")
def advised():

    from labkit.advise.advice import advise
    from labkit.advise.request import Job, MachineSource, ModelSource

    a = advise(ModelSource(preset="llama2-7b"), Job(seq=4096, global_batch=64),
               MachineSource(gpus=8, gpu_memory_bytes=141 * 10**9), trace=False)
    return a


def test_estimate_plan_and_advise_price_one_job_alike(capsys, advised):
    """Llama-2-7B, 8 GPUs of 141 GB, global batch 64 x 4096: the issue's job (3775 vs 1894 ms before)."""
    doc = _json(capsys, "estimate", "--plan", "--model", "llama2-7b", "--gpus", "8", "--gpu-memory", "141GB",
                "--global-batch", "64", "--json")
    best = doc["ranked"][0]
    assert advised.step_time_s is not None
    assert abs(best["step_time_s"] / advised.step_time_s - 1) < 0.10
    assert any("matmul rate" in a for a in doc["assumptions"])


def test_tflops_still_replaces_the_measured_rate(capsys):
    doc = _json(capsys, "estimate", "--plan", "--model", "llama2-7b", "--gpus", "8", "--gpu-memory", "141GB",
                "--global-batch", "64", "--tflops", "200", "--json")
    assert any("200 TFLOP/s" in a for a in doc["assumptions"])
