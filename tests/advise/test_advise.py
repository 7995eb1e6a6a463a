"""labkit advise: the plan, its one-code-path numbers, refusals, and the CLI's JSON."""

import json

import pytest

from labkit.advise import Job, MachineSource, ModelSource, advise
from labkit.cli import main
from labkit.core.errors import LabkitError
from labkit.memory.estimate import ParallelSpec, TrainSpec, estimate
from labkit.memory.estimate.presets import get_preset
from labkit.topology import load_sample, place

SAMPLE = "h100_nv18_8gpu_dual_numa"


def _plan(model="llama2-7b", gb=64, seq=4096, **machine):
    machine = machine or {"sample": SAMPLE, "gpu_memory_bytes": 80 * 2**30}
    return advise(ModelSource(preset=model), Job(seq=seq, global_batch=gb, precision="amp-bf16"), MachineSource(**machine),
                  trace=False)


def test_preset_on_a_sample_gives_a_full_plan_from_the_shared_code_paths():
    adv = _plan()
    assert adv.fits and adv.gpus == 8
    lay = adv.layout
    assert lay["tp"] * lay["pp"] * lay["dp"] == 8
    # the peak is the estimator's for the chosen layout (the same call as `labkit estimate`)
    est = estimate(get_preset("llama2-7b").__class__(**{**get_preset("llama2-7b").__dict__, "seq": 4096}),
                   ParallelSpec(tp=lay["tp"], pp=lay["pp"], dp=lay["dp"], zero=lay["zero"], sp=lay["sp"]),
                   TrainSpec(micro_batch=lay["micro_batch"], global_batch=64, seq=4096, precision="amp-bf16",
                             recompute=lay["recompute"], framework="pytorch"))
    assert adv.peak_bytes == est.peak_allocated and adv.peak_bytes <= adv.usable_bytes
    assert adv.reserved_peak_bytes >= adv.peak_bytes
    # the placement is `labkit place`'s for that layout on the same topology
    pl = place(load_sample(SAMPLE), lay["tp"], lay["pp"], lay["dp"])
    assert adv.placement["cuda_visible_devices"] == pl.cuda_visible_devices
    assert f"CUDA_VISIBLE_DEVICES={pl.cuda_visible_devices}" in adv.command
    assert "torchrun --standalone --nproc-per-node 8" in adv.command
    assert adv.step_time_s > 0 and adv.why_not
    assert any("matmul rate" in e.what or "compute rate" in e.what for e in adv.evidence)


def test_a_model_that_fits_nowhere_gets_the_smallest_cluster_and_what_dominates():
    adv = _plan("llama2-70b", gb=8, seq=4096, gpus=1, gpu_memory_bytes=80 * 2**30)
    assert not adv.fits
    assert adv.smallest_fitting_gpus and adv.smallest_fitting_gpus > 8
    assert adv.dominant and "per GPU" in adv.dominant
    # and the smallest cluster named really fits
    again = _plan("llama2-70b", gb=max(8, adv.smallest_fitting_gpus), seq=4096, gpus=adv.smallest_fitting_gpus,
                  gpu_memory_bytes=80 * 2**30)
    assert again.fits


def test_405b_fits_on_some_cluster_of_80_gib_gpus():
    """A regression check of the estimator under full recomputation with autocast (whole recomputed
    layers hold no 16-bit weight copies through backward): 405B at 8k tokens fits somewhere."""
    adv = _plan("llama3.1-405b", gb=8, seq=8192, gpus=1, gpu_memory_bytes=80 * 2**30)
    assert not adv.fits and adv.smallest_fitting_gpus is not None


def test_more_gpus_never_slow_the_best_layout_down():
    t = [_plan("llama2-7b", gb=64, gpus=g, gpu_memory_bytes=80 * 2**30).step_time_s for g in (2, 4, 8)]
    assert t[0] > t[1] > t[2]


@pytest.mark.parametrize("argv,match", [
    (["--model", "gpt2", "--hf-config", "gpt2", "--seq", "1024", "--global-batch", "8", "--gpus", "1",
      "--gpu-memory", "80GiB"], "exactly one of"),
    (["--model", "gpt2", "--seq", "1024", "--global-batch", "8", "--gpus", "4", "--sample", SAMPLE,
      "--gpu-memory", "80GiB"], "contradicts"),
    (["--model", "gpt2", "--seq", "1024", "--global-batch", "10", "--micro-batch", "4", "--gpus", "1",
      "--gpu-memory", "80GiB"], "not a multiple"),
    (["--model", "gpt2", "--seq", "1024", "--global-batch", "8", "--gpus", "1"], "--gpu-memory"),
    (["--model", "gpt2", "--seq", "1024", "--global-batch", "8", "--sample", SAMPLE, "--file", "x"], "give one"),
    (["--model", "gpt2", "--seq", "0", "--global-batch", "8", "--gpus", "1", "--gpu-memory", "80GiB"], "--seq"),
    (["--model", "gpt2", "--seq", "1024", "--global-batch", "8", "--gpus", "1", "--gpu-memory", "80GiB",
      "--precision", "fp99"], "--precision"),
    (["--model", "gpt2", "--seq", "1024", "--global-batch", "8", "--gpus", "100000", "--gpu-memory", "80GiB"],
     "more than"),
])
def test_contradictory_or_bad_flags_are_refused_in_one_line(argv, match, capsys):
    assert main(["advise"] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1


def test_hf_config_json_has_the_documented_keys_and_traced_evidence(tmp_path, capsys):
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 688, "vocab_size": 4096, "max_position_embeddings": 512}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert main(["advise", "--hf-config", str(path), "--seq", "256", "--micro-batch", "2", "--precision", "amp-bf16",
                 "--gpus", "1", "--gpu-memory", "141GB", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for key in ("layout", "peak_bytes", "reserved_peak_bytes", "step_time_s", "placement", "alloc_conf",
                "bucket_cap_mb", "command", "evidence"):
        assert key in doc
    assert doc["layout"]["tp"] == doc["layout"]["dp"] == 1
    sources = " ".join(e["source"] for e in doc["evidence"])
    assert "fake-cuda" in sources and "allocator simulator" in sources  # the model was traced and replayed
    assert doc["reserved_peak_bytes"] >= doc["peak_bytes"] > 0


def test_sample_with_global_batch_places_tp_groups_as_labkit_place(capsys):
    assert main(["advise", "--model", "llama2-13b", "--seq", "4096", "--sample", "a100_pcie_8gpu_nv12_bridge_pairs_dual_socket",
                 "--gpus", "8", "--global-batch", "64", "--gpu-memory", "80GiB", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    lay = doc["layout"]
    pl = place(load_sample("a100_pcie_8gpu_nv12_bridge_pairs_dual_socket"), lay["tp"], lay["pp"], lay["dp"])
    assert doc["placement"]["cuda_visible_devices"] == pl.cuda_visible_devices
    assert doc["placement"]["tp_groups"] == pl.tp_groups


def test_hf_config_mapping_matches_the_presets():
    from labkit.memory.estimate import total_params
    from labkit.memory.estimate.hf_config import spec_from_hf_config

    gpt2 = spec_from_hf_config({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257,
                                "n_positions": 1024})
    assert total_params(gpt2) == total_params(get_preset("gpt2"))
    llama = spec_from_hf_config({"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
                                 "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 11008,
                                 "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5})
    assert total_params(llama) == total_params(get_preset("llama2-7b"))
    with pytest.raises(LabkitError, match="mixture-of-experts"):   # a type the estimator does not read
        spec_from_hf_config({"model_type": "deepseek_v3", "n_routed_experts": 8, "num_hidden_layers": 2})
    with pytest.raises(LabkitError, match="num_hidden_layers"):
        spec_from_hf_config({"model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": "two"})


@pytest.mark.parametrize("name", ["opt-b4-bf16", "gpt-neox-b4-bf16", "opt-b4-fp32", "qwen2-b4-fp32", "mixtral-b4-bf16"])
def test_step_time_op_by_op_against_the_h200_plain_loops(name):
    """Advise's single-GPU step time (fake-mode run priced op by op by labkit.advise.op_price with
    kernel times microbenchmarked on the H200 by benchmarks/gpu/record_kernels.py and host costs scaled
    to whole reference steps issued on the H200's host, labkit.advise.host_calibration) against the
    recorded plain loop. Two reference and three held-out cases cheap enough for CI (Mixtral bf16: the
    host-bound mixture-of-experts step). On the whole
    recorded corpus (benchmarks/bench_advise.py --validate, 2026-12-01, against each case's first
    recording): reference 80 cases, median |error| 3.5%, 76 within 20%; held-out 33 cases, median
    |error| 3.3%, all within 20% (worst gpt2-large-b4-keep-amp-bf16 -19.3%, mixtral-b4-bf16 -16.8%)."""
    from labkit.advise.validate import check

    (c,) = check([name])
    assert c.split in ("reference", "held-out")
    assert abs(c.rel_error) < 0.20, f"{name}: predicted {c.predicted_s * 1e3:.1f} ms vs {c.measured_s * 1e3:.1f} ms"


def test_step_time_of_a_channels_last_convnet_against_its_h200_plain_loop():
    """ConvNeXt runs channels-last after its stem; its convolutions are priced from channels-last
    recordings (kernel_rates_extra3.json). A reference case recorded with the second plain-loop run."""
    from labkit.advise.validate import SECOND_RUN, check

    (c,) = check(["tv-convnext_tiny-b64-fp32"], path=SECOND_RUN)
    assert c.split == "reference"
    assert abs(c.rel_error) < 0.20, f"predicted {c.predicted_s * 1e3:.1f} ms vs {c.measured_s * 1e3:.1f} ms"


def test_a_users_factory_is_traced_for_data_parallel_advice(tmp_path, monkeypatch, capsys):
    (tmp_path / "userfac.py").write_text(
        "def build():\n"
        "    from transformers import GPT2Config, GPT2LMHeadModel\n"
        "    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=32000, n_positions=64))\n")
    monkeypatch.chdir(tmp_path)
    assert main(["advise", "--factory", "userfac:build", "--seq", "32", "--micro-batch", "2", "--gpus", "2",
                 "--gpu-memory", "80GiB"]) == 0
    out = capsys.readouterr().out
    assert "layout: tp=1 pp=1 dp=2" in out and "fake-cuda" in out and "priced op by op" in out
