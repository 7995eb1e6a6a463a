"""The host scale (labkit.advise.host_calibration) and the host/GPU split recorded on the H200
(benchmarks/gpu/record_host.py)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from labkit.advise import host_calibration as hc
from labkit.core.errors import LabkitError
from labkit.core.provenance import load_measurement
from labkit.workloads.corpus import get_case


def test_the_stored_host_scale_is_what_the_recorded_whole_step_issues_give():
    """host_scale.json against a fresh derivation: each reference case the H200's host issued whole
    (fitting the launch queue) priced again in fake mode with the unscaled microbenchmarks."""
    from labkit.advise.kernel_table import recorded_table
    from labkit.advise.validate import predict_step_time
    from labkit.workloads import corpus

    measured = hc.whole_step_issues()
    assert len(measured) >= 5
    assert all(corpus.get_case(n).split == "reference" for n in measured)   # nothing held out is used
    raw = recorded_table(host_calibrated=False)
    priced = {n: predict_step_time(corpus.get_case(n), table=raw)["host_s"] for n in measured}
    fresh = hc.derive(priced, measured)
    stored = load_measurement(hc.SCALE_FILE, "host_scale")["data"]
    assert fresh["scale"] == pytest.approx(stored["scale"], rel=0.02)
    assert hc.host_scale() == pytest.approx(stored["scale"])
    assert 1.0 < stored["scale"] < 4.0            # a real step issues slower than its ops' tight loops
    assert stored["source"]["provenance"]["gpu_name"] == "NVIDIA H200"


def test_the_calibrated_table_scales_every_host_cost_and_nothing_else():
    from labkit.advise.kernel_table import recorded_table

    raw, cal = recorded_table(host_calibrated=False), recorded_table()
    k = hc.host_scale()
    assert cal.host["op_alloc_s"] == pytest.approx(raw.host["op_alloc_s"] * k)
    assert cal.host["module_call_nop_s"] == pytest.approx(raw.host["module_call_nop_s"] * k)
    assert cal.host["autograd_chain"] == raw.host["autograd_chain"]          # a count, not a time
    assert cal.gemm_seconds(4096, 4096, 4096, "bf16") == raw.gemm_seconds(4096, 4096, 4096, "bf16")
    assert "host costs x" in cal.source and "host costs x" not in raw.source


def test_derive_takes_the_median_ratio_and_refuses_no_overlap():
    d = hc.derive({"a": 1.0, "b": 2.0, "c": 1.0}, {"a": 2.0, "b": 2.0, "c": 3.0, "z": 9.0})
    assert d["scale"] == 2.0 and [r["name"] for r in d["cases"]] == ["a", "b", "c"]
    with pytest.raises(LabkitError, match="no case has both"):
        hc.derive({"a": 1.0}, {"b": 1.0})


def test_a_scale_out_of_range_is_refused(tmp_path, monkeypatch):
    f = tmp_path / "host_scale.json"
    f.write_text(json.dumps({"provenance": {}, "kind": "host_scale", "data": {"scale": 40.0}}))
    monkeypatch.setattr(hc, "SCALE_FILE", f)
    hc.host_scale.cache_clear()
    try:
        with pytest.raises(LabkitError, match="outside"):
            hc.host_scale()
    finally:
        hc.host_scale.cache_clear()


def test_recorded_gpu_times_are_the_unblocked_chunked_runs():
    gpu = hc.recorded_gpu_times()
    rows = [{c["name"]: c for c in load_measurement(f, "host_split")["data"]["cases"]} for f in hc.GPU_SPLIT_FILES]
    assert len(gpu) >= 50
    for name, s in gpu.items():
        row = next(r[name] for r in rows if name in r and r[name].get("fine", r[name])["chunks_blocked"] == 0)
        assert s == row["gpu_s"]
        # the kernels alone never take longer than the plain step that also waits for the host
        assert s <= row["median_step_s"] * 1.1
    both = [n for n in gpu if all(n in r and r[n].get("fine", r[n])["chunks_blocked"] == 0 for r in rows)]
    assert len(both) >= 40 and all(abs(rows[1][n]["gpu_s"] / rows[0][n]["gpu_s"] - 1) < 0.03 for n in both)


def test_the_gpu_time_priced_op_by_op_matches_the_recorded_kernels():
    """The GPU side of the step-time model alone, against the kernels' time on the H200 (chunks issued
    behind sleeps, so the GPU never waited): a reference and a held-out case cheap enough for CI.
    On all recorded cases (bench_advise.py --validate) the GPU time is within 20% on nearly all; the
    step time's larger errors are the host's."""
    from labkit.advise.validate import predict_step_time
    from labkit.workloads import corpus

    gpu = hc.recorded_gpu_times()
    for name in ("gpt-neox-b4-bf16", "llama-gqa-b4-bf16"):
        d = predict_step_time(corpus.get_case(name))
        assert abs(d["gpu_busy_s"] / gpu[name] - 1) < 0.10, (name, d["gpu_busy_s"], gpu[name])


class _FakeEvent:
    def __init__(self, **_):
        self.t = 0.0

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def test_record_host_chunks_a_step_at_block_boundaries_forward_and_backward(monkeypatch, bench_script):
    """record_host.py's Chunker on a CI-size GPT-2 on the CPU (the CUDA calls stubbed): a boundary
    before each block's forward and when each block's output gradient arrives; every k-th one
    closes a chunk."""
    record_host = bench_script("record_host")

    from labkit.workloads.corpus import get_case, plain_step, prepare_plain

    monkeypatch.setattr(torch.cuda, "_sleep", lambda n: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    case = get_case("gpt2-b8-bf16@tiny")                 # 2 layers
    model, opt, batch = prepare_plain(case, "cpu")
    ch = record_host.Chunker(model, cycles_per_s=1e9, sleep_s=60.0)   # the sleep is stubbed: no chunk is "blocked"
    ch.counting = True
    plain_step(case, model, opt, batch, device_type="cpu")
    assert ch.calls == 4                                 # 2 blocks x (forward, backward)
    ch.counting = False
    for every, chunks in ((1, 5), (2, 3), (4, 2)):
        ch.begin(every)
        plain_step(case, model, opt, batch, device_type="cpu")
        r = ch.finish()
        assert r["chunks"] == chunks and r["host_s"] > 0 and r["chunks_blocked"] == 0
    ch.remove()
    assert not model.transformer.h[0]._forward_pre_hooks


def test_record_host_smoke_runs_on_cpu(tmp_path, bench_script):
    assert bench_script("record_host").main(["--out", str(tmp_path), "--smoke", "--only", "gpt2-b8-amp-bf16"]) == 0
    doc = load_measurement(tmp_path / "host_split.json", "host_split")
    (row,) = doc["data"]["cases"]
    assert row["name"] == "gpt2-b8-amp-bf16@tiny" and row["median_step_s"] > 0 and "error" not in row
    assert "host_s" not in row                           # no GPU: nothing to take apart


def test_record_host_shrinks_the_batch_and_sequence_and_keeps_the_layers(tmp_path, bench_script, capsys):
    record_host = bench_script("record_host")
    assert record_host.main(["--out", str(tmp_path), "--smoke", "--only", "gpt2-b8-amp-bf16,tv-resnet50",
                             "--shrink", "1,16"]) == 0
    (row,) = load_measurement(tmp_path / "host_split.json", "host_split")["data"]["cases"]   # vision cases left out
    assert row["shrink"] == [1, 16] and (row["case"]["micro_batch"], row["case"]["seq"]) == (1, 16)
    assert row["case"]["overrides"] == get_case("gpt2-b8-amp-bf16@tiny").overrides and row["median_step_s"] > 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as bad:
        record_host.main(["--out", str(tmp_path), "--smoke", "--shrink", "0,16"])
    assert bad.value.code == 2 and "--shrink '0,16': expected two positive integers" in capsys.readouterr().err


def test_shrunk_steps_are_priced_at_the_shape_they_ran():
    # record_host.py --shrink 1,64 on the H200: every row kept its case's layers and widths; priced at 1 x 64
    from labkit.advise.validate import SHRUNK_FILES, shrunk_checks

    doc = load_measurement(SHRUNK_FILES[0], "host_split")
    rows = {r["name"]: r for r in doc["data"]["cases"]}
    assert all(r["shrink"] == [1, 64] and r["case"]["micro_batch"] == 1 and r["case"]["seq"] == 64 for r in rows.values())
    (plain, ckpt) = shrunk_checks(names=["gpt2-b8-bf16", "gpt2-b16-ckpt4-amp-bf16"])
    assert (plain.name, plain.checkpointed, ckpt.checkpointed) == ("gpt2-b8-bf16", False, True)
    assert plain.measured_s == rows["gpt2-b8-bf16"]["median_step_s"] and 0 < plain.predicted_gpu_s < plain.predicted_s
    assert ckpt.predicted_host_s > plain.predicted_host_s       # the recomputation's ops are priced in backward


def test_record_host_pairs_the_full_and_the_shrunk_step_on_one_model(tmp_path, bench_script, capsys):
    record_host = bench_script("record_host")
    assert record_host.main(["--out", str(tmp_path), "--smoke", "--only", "gpt2-b8-amp-bf16", "--shrink", "1,16",
                             "--pair"]) == 0
    (row,) = load_measurement(tmp_path / "host_split.json", "host_split")["data"]["cases"]
    assert row["paired"] and row["shrink"] == [1, 16] and row["case"]["micro_batch"] == 2   # the case's own batch
    assert len(row["step_times_s"]) == len(row["shrunk_step_times_s"]) == 7 and row["shrunk_step_s"] > 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as bad:
        record_host.main(["--out", str(tmp_path), "--smoke", "--pair"])
    assert bad.value.code == 2 and "--pair needs --shrink" in capsys.readouterr().err
