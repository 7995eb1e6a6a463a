"""The corpus definitions and the plain-loop recording script (its CPU smoke mode)."""

import hashlib
from pathlib import Path

import pytest

import torch

from labkit.core.errors import LabkitError
from labkit.core.provenance import load_measurement
from labkit.workloads.corpus import CASES, corpus_cases, get_case, tiny


def test_split_is_a_hash_of_the_name_and_holds_out_a_third():
    held = corpus_cases("held-out")
    assert 0.25 < len(held) / len(CASES) < 0.42
    for c in CASES:
        h = int(hashlib.sha256(c.name.encode()).hexdigest()[:8], 16)
        assert (c.split == "held-out") == (h % 3 == 0)
    assert {c.split for c in corpus_cases("reference")} == {"reference"}
    with pytest.raises(LabkitError, match="split"):
        corpus_cases("train")


def test_corpus_covers_the_families_and_policies():
    archs = {c.arch for c in CASES}
    assert {"gpt2", "llama", "mistral", "qwen2", "gemma", "phi3", "gpt_neox", "opt", "bloom", "falcon", "mixtral",
            "qwen2_moe", "bert", "roberta", "deberta-v2", "t5", "bart", "vit", "resnet50", "vit_b_16",
            "convnext_tiny", "efficientnet_b0", "swin_t", "mobilenet_v3_large"} <= archs
    assert {c.precision for c in CASES} == {"fp32", "amp-bf16", "bf16"}
    assert {c.checkpoint_impl for c in CASES if c.recompute != "none"} == {"torch", "hf", "hf-reentrant"}
    assert any(c.lora for c in CASES) and {c.loop for c in CASES} == {"plain", "keep-output"}
    assert 60 <= len(CASES) <= 309         # the support corpus runs most at CI size (compat_cases): keep CI time in mind
    # issue 27: models built by hand from PyTorch's modules, cuDNN RNNs, 3-D and transposed convolutions,
    # segmentation heads, more torchvision classifiers and the LoRA orders
    assert {"encoder-lm", "decoder-lm", "mha-lm", "lstm-lm", "gru-lm", "unet", "video.r3d_18",
            "segmentation.fcn_resnet50", "regnet_y_1_6gf"} <= archs
    assert {c.lora_order for c in CASES if c.lora} == {"cast-before", "cast-before-bf16-adapters", "cast-after",
                                                      "cast-before-input-grads"}
    # the second batch: what a user's own LoRA loop adds, (2+1)-D and mixed 3-D convolutions, MobileNet heads
    assert {c.loss for c in CASES if c.lora} == {"model", "fp32-logits"}
    assert {"video.r2plus1d_18", "video.mc3_18", "segmentation.lraspp_mobilenet_v3_large"} <= archs
    # the third batch: the convolution rules on models they were not made from, predicted before recording
    third = {"regnet_y_3_2gf", "regnet_x_800mf"}
    assert third <= archs
    path = Path(__file__).resolve().parents[2] / "data/measurements/measure/predicted__issue27_batch3.json"
    pred = load_measurement(path, kind="fake_predictions")
    rows = {r["name"]: r for r in pred["data"]["cases"]}
    batch = [c for c in CASES if c.arch in third or c.name in ("tv-r2plus1d_18-b16-fp32", "tv-mc3_18-b8-fp32")]
    assert sorted(rows) == sorted(c.name for c in batch) and len(batch) == 5
    assert all(rows[c.name]["split"] == c.split == "held-out" for c in batch)
    # the fourth: float32 CNNs at large batches in fresh processes (the setting of the two held-out reserved misses),
    # every one a reference case, predicted before recording
    pred = load_measurement(path.with_name("predicted__issue27_batch4.json"), kind="fake_predictions")
    fourth = {r["name"]: r for r in pred["data"]["cases"]}
    assert len(fourth) == 7 and {"resnet101", "regnet_x_400mf", "regnet_x_1_6gf"} <= archs
    for name, r in fourth.items():
        case = get_case(name)
        assert case.precision == "fp32" and case.micro_batch >= 128 and r["split"] == case.split == "reference"
    assert any(c.padded and c.lora for c in CASES)
    # the seventh: learned attention biases (SDPA masks that require grad), predicted before recording
    from labkit.workloads.corpus import BATCH7_FILE, _batch7

    pred = load_measurement(path.with_name(BATCH7_FILE), kind="fake_predictions")
    seventh = {r["name"]: r for r in pred["data"]["cases"]}
    assert sorted(seventh) == sorted(c.name for c in _batch7()) and all(c in CASES for c in _batch7())
    assert all(r["split"] == get_case(n).split and r["peak_allocated"] > 0 for n, r in seventh.items())
    assert {r["split"] for r in seventh.values()} == {"reference", "held-out"}
    # the eighth: speech encoders with LayerDrop off (each step runs every layer), predicted before recording
    from labkit.workloads.corpus import BATCH8_FILE, _batch8

    eighth = {r["name"]: r for r in load_measurement(path.with_name(BATCH8_FILE), kind="fake_predictions")["data"]["cases"]}
    assert sorted(eighth) == sorted(c.name for c in _batch8()) and all(c in CASES for c in _batch8())
    assert all(c.overrides["layerdrop"] == 0.0 and eighth[c.name]["split"] == c.split for c in _batch8())


def test_the_fp32_logits_loss_is_the_users_shifted_cross_entropy():
    """loss="fp32-logits": the model is called without labels and the loss is the shifted cross-entropy on the
    float32 logits, the same value as the model's own loss (transformers shifts and upcasts too)."""
    from dataclasses import replace

    from labkit.workloads.corpus import build_model, fp32_logits_loss, logits_call, make_batch, step_hooks

    case = tiny(get_case("tinyllama-b4-lora-fp32loss-bf16"))
    assert step_hooks(case)["loss_fn"] is fp32_logits_loss
    torch.manual_seed(0)
    model = build_model(replace(case, lora=False, precision="fp32"))
    batch = make_batch(case)
    out = logits_call(model, batch)
    assert out.loss is None
    assert torch.allclose(fp32_logits_loss(out, batch), model(**batch).loss, atol=1e-5)
    with pytest.raises(LabkitError, match="loss"):
        step_hooks(replace(case, loss="mse"))


def test_tiny_shrinks_layers_and_widths():
    c = get_case("llama-gqa-b4-fp32")
    t = tiny(c)
    assert t.overrides["num_hidden_layers"] == 2 and t.overrides["hidden_size"] == 64
    assert t.overrides["num_key_value_heads"] < t.overrides["num_attention_heads"]    # GQA kept
    assert get_case("llama-gqa-b4-fp32@tiny") == t and t.split != "" and t.micro_batch == 2
    assert get_case("llama-mha-b4-fp32@tiny").overrides["num_key_value_heads"] == 4
    with pytest.raises(LabkitError, match="unknown corpus case"):
        get_case("llama-9000")


def test_plain_recording_script_smoke_runs_on_cpu(tmp_path, bench_script):
    """benchmarks/gpu/record_plain.py --smoke: the clue experiment and a case at CI size on the CPU."""
    assert bench_script("record_plain").main(["--out", str(tmp_path), "--smoke", "--only", "llama-gqa-b4-bf16"]) == 0
    doc = load_measurement(tmp_path / "plain_cases.json", kind="measure_plain")
    assert "transformers" in doc["provenance"]
    (row,) = doc["data"]["cases"]
    assert row["name"] == "llama-gqa-b4-bf16@tiny" and "error" not in row, row
    assert row["param_dtypes"] == ["torch.bfloat16"] and row["median_step_s"] > 0
    assert row["sdpa_backends"] == ["flash"]          # the CPU's SDPA: its flash kernel, seen by the profiler
    clue = load_measurement(tmp_path / "clue_gpt2_large.json", kind="measure_plain_clue")["data"]
    assert len(clue["variants"]) == 6 and not any("error" in v for v in clue["variants"].values())
    assert (tmp_path / "log.txt").read_text().count("clue:") == 6


def test_plain_recording_script_runs_each_case_in_its_own_process(tmp_path, bench_script):
    """record_plain.py --fresh 2: one child process per case (``--case NAME --no-profile``), two at a time; the
    merged rows keep the corpus' order, say how they ran and carry no step times (timed beside each other)."""
    assert bench_script("record_plain").main(["--out", str(tmp_path), "--smoke", "--fresh", "2",
                                              "--only", "llama-gqa-b4-bf16,gpt2-b8-amp-bf16"]) == 0
    doc = load_measurement(tmp_path / "plain_cases.json", kind="measure_plain")
    assert doc["data"]["process"] == "fresh" and "own new process" in doc["provenance"]["fresh_note"]
    rows = doc["data"]["cases"]
    assert [row["name"] for row in rows] == ["gpt2-b8-amp-bf16@tiny", "llama-gqa-b4-bf16@tiny"]
    for row in rows:
        assert "error" not in row and row["process"] == "fresh" and row["concurrent_processes"] in (1, 2), row
        assert "median_step_s" not in row and "sdpa_backends" not in row     # no timing, no profiler
        child = load_measurement(tmp_path / "fresh" / row["name"] / "plain_cases.json", kind="measure_plain")
        assert f"--case {row['name']}" in child["provenance"]["command"]


def test_plain_recording_script_refuses_an_unknown_case(tmp_path, capsys, bench_script):
    with pytest.raises(SystemExit) as exit_:
        bench_script("record_plain").main(["--out", str(tmp_path / "x"), "--smoke", "--case", "no-such-case"])
    assert exit_.value.code == 2 and "--case 'no-such-case': no corpus case of that name" in capsys.readouterr().err


def test_vision_recording_script_smoke_runs_on_cpu(tmp_path, bench_script):
    """benchmarks/gpu/record_vision.py --smoke: a pure-bf16 torchvision case takes bf16 images (the first
    corpus run fed it float32 ones: ``Input type (float) and bias type (c10::BFloat16)``), and the
    convolution probes run forward and the three backward variants."""
    assert bench_script("record_vision").main(["--out", str(tmp_path), "--smoke"]) == 0
    (row,) = load_measurement(tmp_path / "plain_bf16.json", kind="measure_plain")["data"]["cases"]
    assert "error" not in row, row
    assert row["param_dtypes"] == ["torch.bfloat16"] and row["median_step_s"] > 0 and row["case"]["precision"] == "bf16"
    conv = load_measurement(tmp_path / "conv_workspace.json", kind="conv_workspace")
    assert "cudnn" in conv["provenance"] and conv["data"]["settings"]["cudnn_benchmark_default"] is False
    rows = conv["data"]["rows"]
    assert {r["dtype"] for r in rows} == {"fp32", "bf16"} and not any("error" in r for r in rows)
    for r in rows:
        assert r["output_shape"] == [2, 128, 28, 28]
        assert all(k in r for k in ("forward", "backward_data", "backward_filter", "backward"))


def test_lora_orders_give_the_adapters_their_dtype():
    """peft keeps adapters in float32 on a bf16 base (autocast_adapter_dtype=True, the default) when the base is
    cast first; autocast_adapter_dtype=False leaves them bf16; casting after get_peft_model casts them too."""
    from labkit.workloads.corpus import build_model

    want = {"tinyllama-b4-lora-bf16": torch.float32, "tinyllama-b4-lora-bf16adapters-bf16": torch.bfloat16,
            "tinyllama-b4-lora-cast-after-bf16": torch.bfloat16}
    for name, dtype in want.items():
        model = build_model(get_case(f"{name}@tiny"))
        trainable = {p.dtype for p in model.parameters() if p.requires_grad}
        frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
        assert trainable == {dtype} and frozen == {torch.bfloat16}, name


def test_hand_built_cases_run_as_a_user_writes_them():
    """The plain loop (what the H200 records) runs every new kind of case at CI size on the CPU."""
    from labkit.workloads.corpus import plain_step, prepare_plain

    for name in ("hand-encoder-b16-s512-amp-bf16", "hand-lstm-b64-s256-fp32", "hand-unet-b16-s256-fp32",
                 "tv-r3d_18-b16-fp32", "tv-fcn_resnet50-b16-s384-fp32"):
        case = get_case(f"{name}@tiny")
        model, opt, batch = prepare_plain(case, "cpu")
        plain_step(case, model, opt, batch, device_type="cpu")
        assert all(p.grad is None for p in model.parameters())        # zero_grad(set_to_none=True) ran


def test_plain_recording_script_records_several_named_cases(tmp_path, bench_script):
    """record_plain.py --case NAME, repeated: the new cases' families at CI size (in one process here; --fresh
    gives each its own, as the test above checks)."""
    names = ["hand-gru-b64-s256-amp-bf16", "tv-r3d_18-b16-fp32"]
    record_plain = bench_script("record_plain")
    assert record_plain.main(["--out", str(tmp_path), "--smoke", "--no-clue", "--no-profile"]
                             + [a for n in names for a in ("--case", f"{n}@tiny")]) == 0
    rows = load_measurement(tmp_path / "plain_cases.json", kind="measure_plain")["data"]["cases"]
    assert sorted(row["name"] for row in rows) == sorted(f"{n}@tiny" for n in names)
    assert not any("error" in row for row in rows), rows


def test_merge_adds_new_rows_with_their_provenance_and_keeps_the_old(tmp_path, bench_script):
    from labkit.core.provenance import header, write_measurement

    merge = bench_script("merge_plain").merge
    old = {"name": "gpt2-b8-fp32", "split": get_case("gpt2-b8-fp32").split, "peak_allocated": 1}
    into = write_measurement(tmp_path / "fresh.json", "measure_plain",
                             {"process": "fresh", "cases": [old]}, provenance=header("old run"))
    new_rows = [{"name": "hand-lstm-b64-s256-fp32", "peak_allocated": 5, "peak_reserved": 6},
                {"name": "gpt2-b8-amp-bf16", "peak_allocated": 2},
                {"name": "hand-gru-b64-s256-fp32", "error": "OutOfMemoryError: x"}]
    new = write_measurement(tmp_path / "new.json", "measure_plain", {"process": "fresh", "smoke": False,
                                                                    "cases": new_rows}, provenance=header("new run"))
    s = merge(new, into, note="issue 27's cases")
    assert s["added"] == ["hand-lstm-b64-s256-fp32", "gpt2-b8-amp-bf16"] and len(s["failed"]) == 1
    doc = load_measurement(into, kind="measure_plain")
    rows = doc["data"]["cases"]
    assert [r["name"] for r in rows] == ["gpt2-b8-fp32", "gpt2-b8-amp-bf16", "hand-lstm-b64-s256-fp32"]
    assert rows[0] == old and rows[2]["provenance"]["command"] == "new run"
    assert doc["provenance"]["command"] == "old run" and "issue 27" in doc["provenance"]["rows_with_own_provenance_note"]
    bad = write_measurement(tmp_path / "bad.json", "measure_plain", {"process": "in-process", "cases": []},
                            provenance=header("x"))
    with pytest.raises(LabkitError, match="not a --fresh recording"):
        merge(bad, into)


def test_handmade_kernel_recording_script_smoke_runs_on_cpu(tmp_path, bench_script):
    assert bench_script("record_handmade").main(["--out", str(tmp_path), "--smoke", "--part",
                                                "rnn,conv,conv2,conv3,conv1d,conv5"]) == 0
    rnn = load_measurement(tmp_path / "rnn_cudnn.json", kind="cudnn_rnn")["data"]["rows"]
    conv = load_measurement(tmp_path / "conv_workspace_3d_transposed.json", kind="conv_workspace")["data"]["rows"]
    more = load_measurement(tmp_path / "conv_workspace_more.json", kind="conv_workspace")["data"]["rows"]
    rules = load_measurement(tmp_path / "conv_workspace_rules.json", kind="conv_workspace")["data"]["rows"]
    assert len(rnn) == 2 and len(conv) == 2 and len(more) == 2 and len(rules) == 2, (rnn, conv, more, rules)
    assert not any("error" in r for r in rnn + conv + more + rules), (rnn, conv, more, rules)
    assert {r["transposed"] for r in conv} == {True, False}
    assert {len(r["input_shape"]) for r in more} == {4, 5} and {r["groups"] for r in more} == {1, 5}
    assert {r["groups"] for r in rules} == {1, 4}
    one_d = load_measurement(tmp_path / "conv_workspace_1d.json", kind="conv_workspace")["data"]
    assert len(one_d["rows"]) == 3 and not any("error" in r for r in one_d["rows"]), one_d["rows"]
    assert {len(r["input_shape"]) for r in one_d["rows"]} == {3}
    assert {r["transposed"] for r in one_d["rows"]} == {True, False}
    grid = [g[0] for g in bench_script("record_handmade").CONV_GEOMETRIES_1D]
    assert set(one_d["held_out"]) < set(grid) and len(one_d["held_out"]) >= len(grid) // 3       # a third held out
    five = load_measurement(tmp_path / "conv_workspace_5x5.json", kind="conv_workspace")["data"]
    assert len(five["rows"]) == 1 and "error" not in five["rows"][0] and five["rows"][0]["kernel"] == [5, 5]
    grid = [g[0] for g in bench_script("record_handmade").CONV_GEOMETRIES_5]
    assert set(five["held_out"]) < set(grid) and len(five["held_out"]) * 3 == len(grid)


def test_the_1d_convolution_grid_is_predicted_before_it_is_recorded(tmp_path, bench_script):
    # record_handmade.py --predict: the rule's bytes for every row --part conv1d records, from meta tensors
    mod = bench_script("record_handmade")
    assert mod.main(["--out", str(tmp_path), "--part", "conv1d", "--predict", str(tmp_path / "p.json")]) == 0
    doc = load_measurement(tmp_path / "p.json", kind="conv_workspace_predicted")["data"]
    assert len(doc["rows"]) == len(mod.CONV_GEOMETRIES_1D) * 2 * len(mod.CONV_BATCHES_1D)
    (row,) = [r for r in doc["rows"] if r["geometry"] == "1d-T-k8s4-64to64-8192" and r["batch"] == 64
              and r["dtype"] == "fp32"]
    assert row["output_shape"] == [64, 64, 32768] and row["forward"] == (64 * 64 * (32768 + 8192) + 64 * 64 * 8) * 4
    from labkit.memory.trace.recorded import measure_dir

    committed = load_measurement(measure_dir() / "predicted__conv_workspace_1d.json",
                                 kind="conv_workspace_predicted")["data"]
    assert committed["held_out"] == list(mod.CONV_1D_HELD_OUT) and len(committed["rows"]) == len(doc["rows"])
    five = load_measurement(measure_dir() / "predicted__conv_workspace_5x5.json", kind="conv_workspace_predicted")
    assert five["data"]["held_out"] == list(mod.CONV_5_HELD_OUT)
    assert len(five["data"]["rows"]) == len(mod.CONV_GEOMETRIES_5) * 2 * len(mod.CONV_BATCHES_5)
    with pytest.raises(SystemExit):
        mod.main(["--out", str(tmp_path), "--part", "conv1d,conv5", "--predict", str(tmp_path / "q.json")])


def test_rnn_grid_recording_script_smoke_runs_on_cpu(tmp_path, bench_script):
    """record_rnn.py: its smoke configurations through the modules on the CPU; --predict-to writes the rules'
    figures for every grid row with its split (a third held out)."""
    script = bench_script("record_rnn")
    assert script.main(["--out", str(tmp_path), "--smoke"]) == 0
    rows = load_measurement(tmp_path / "rnn_grid.json", kind="cudnn_rnn_grid")["data"]["rows"]
    assert len(rows) == 3 and not any("error" in r for r in rows), rows
    assert script.main(["--predict-to", str(tmp_path / "pred.json")]) == 0
    pred = load_measurement(tmp_path / "pred.json", kind="cudnn_rnn_grid_predicted")["data"]["rows"]
    assert len(pred) == len(script.GRID) and 0.25 < sum(r["split"] == "held-out" for r in pred) / len(pred) < 0.42


def test_a_padded_batch_masks_its_last_eighth():
    from labkit.workloads.corpus import make_batch

    b = make_batch(get_case("tinyllama-b4-lora-padded-bf16"))
    mask, labels = b["attention_mask"], b["labels"]
    assert mask.shape == labels.shape == (4, 1024)
    assert (mask[:, :896] == 1).all() and (mask[:, 896:] == 0).all()
    assert (labels[:, 896:] == -100).all() and (labels[:, :896] == b["input_ids"][:, :896]).all()


def test_the_fifth_batch_is_new_kinds_predicted_before_recording():
    """Issue 27's fifth batch: kinds of model the corpus had not seen, each in float32 and under autocast bf16, every
    one predicted in fake mode (predicted__issue27_batch5.json, committed before any recording); names' hash
    decides the split (about a third held out); the CI corpus runs each kind at least once."""
    from labkit.workloads.corpus import NEW_KINDS_FILE, _batch8, _new_kinds, _rnn_kinds, compat_cases

    new = _new_kinds()
    later = _rnn_kinds() + _batch8()    # cases added after the batch (a 3-layer tagger, Wav2Vec2 without LayerDrop)
    assert len(new) == 50 and {c.precision for c in new} == {"fp32", "amp-bf16"}
    kinds = {c.arch for c in new}
    assert len(kinds) == 25 and not kinds & {c.arch for c in CASES if c not in new + later} - {"llama"}
    assert 0.25 < sum(c.split == "held-out" for c in new) / len(new) < 0.42
    path = Path(__file__).resolve().parents[2] / "data/measurements/measure" / NEW_KINDS_FILE
    rows = {r["name"]: r for r in load_measurement(path, kind="fake_predictions")["data"]["cases"]}
    assert sorted(rows) == sorted(c.name for c in new)
    for c in new:
        assert rows[c.name]["split"] == c.split and "refused" not in rows[c.name], rows[c.name]
        assert 0 < rows[c.name]["peak_allocated"] <= rows[c.name]["peak_reserved"] < 60e9    # fits one H200
    ci = {c.name.removesuffix("@tiny") for c in compat_cases()}
    assert {c.arch for c in new if c.name in ci} >= kinds - {"mnasnet1_0", "maxvit_t", "swin_v2_t", "efficientnet_b3",
                                                             "regnet_y_800mf", "mobilenet_v3_small"}


def test_the_rnn_cases_were_predicted_before_recording_and_run_in_ci():
    """Issue 27's recurrent layers as users write them (3 layers with dropout, packed and padded back, proj_size,
    nn.RNN): predicted in fake mode (predicted__issue27_rnn.json, committed before any recording), every one in the
    CI corpus at CI size, where the projection and embedding widths stay below the hidden width."""
    from labkit.workloads.corpus import RNN_FILE, _rnn_kinds, build_model, compat_cases, make_batch, tiny

    cases = _rnn_kinds()
    path = Path(__file__).resolve().parents[2] / "data/measurements/measure" / RNN_FILE
    rows = {r["name"]: r for r in load_measurement(path, kind="fake_predictions")["data"]["cases"]}
    assert sorted(rows) == sorted(c.name for c in cases)
    for c in cases:
        assert rows[c.name]["split"] == c.split and 0 < rows[c.name]["peak_allocated"] <= rows[c.name]["peak_reserved"]
    assert {c.name + "@tiny" for c in cases} <= {c.name for c in compat_cases()}
    rnn = {type(m).__name__: m for c in cases for m in build_model(tiny(c)).modules() if isinstance(m, torch.nn.RNNBase)}
    assert set(rnn) == {"LSTM", "GRU", "RNN"} and rnn["RNN"].nonlinearity == "tanh"
    assert any(isinstance(m, torch.nn.LSTM) and m.proj_size == 32 and m.hidden_size == 64
               for c in cases for m in build_model(tiny(c)).modules())
    enc = tiny([c for c in cases if c.arch == "packed-gru-encoder"][0])
    b = make_batch(enc)
    assert ((b["labels"] == -100) == (torch.arange(enc.seq) >= b["lengths"][:, None])).all()
    assert float(build_model(enc)(**b)) > 0


def test_googlenet_and_inception_train_with_their_auxiliary_heads():
    """In training mode torchvision's GoogLeNet and Inception-v3 return their auxiliary logits too: the loss adds
    each auxiliary head's cross-entropy (0.3 each for GoogLeNet's two, 0.4 for Inception-v3's one)."""
    from collections import namedtuple

    from labkit.workloads.corpus import vision_loss

    ce = torch.nn.functional.cross_entropy
    y = torch.tensor([1, 0])
    a, b, c = torch.randn(2, 5), torch.randn(2, 5), torch.randn(2, 5)
    three = namedtuple("GoogLeNetOutputs", "logits aux_logits2 aux_logits1")(a, b, c)
    assert torch.allclose(vision_loss(three, {"labels": y}), ce(a, y) + 0.3 * (ce(b, y) + ce(c, y)))
    two = namedtuple("InceptionOutputs", "logits aux_logits")(a, b)
    assert torch.allclose(vision_loss(two, {"labels": y}), ce(a, y) + 0.4 * ce(b, y))
    assert torch.allclose(vision_loss(a, {"labels": y}), ce(a, y))


def test_predictions_are_written_before_recording_and_compared_after(tmp_path, bench_script, capsys):
    """benchmarks/predict_cases.py: a case predicted as record_plain.py --fresh runs it (a fake_predictions file),
    then ``--compare`` puts a recording beside it, per split, exit 1 on a miss of the targets."""
    from labkit.core.provenance import write_measurement

    script = bench_script("predict_cases")
    out = tmp_path / "pred.json"
    assert script.main(["--out", str(out), "--case", "hand-bilstm-b64-s256-fp32@tiny", "--note", "test"]) == 0
    doc = load_measurement(out, kind="fake_predictions")
    (row,) = doc["data"]["cases"]
    assert doc["provenance"]["note"] == "test" and 0 < row["peak_allocated"] <= row["peak_reserved"]

    def recording(peak_scale: float) -> Path:
        rec = tmp_path / f"rec{peak_scale}.json"
        write_measurement(rec, "measure_plain", {"process": "fresh", "cases": [
            {"name": row["name"], "peak_allocated": int(row["peak_allocated"] * peak_scale),
             "peak_reserved": row["peak_reserved"]}]})
        return rec

    assert script.main(["--compare", str(out), str(recording(1.01))]) == 0
    assert script.main(["--compare", str(out), str(recording(1.10))]) == 1
    assert "MISS" in capsys.readouterr().out


def test_the_sixth_batch_is_new_kinds_timm_among_them_predicted_before_recording():
    """Issue 27's sixth batch: about 30 kinds the corpus had never seen (timm classifiers, Hugging Face families,
    torchvision models, hand-built ones), each predicted in fake mode at its full size (predicted__issue27_batch6.json,
    committed before any recording) and in the CI corpus at CI size; a third held out by the names' hash."""
    from dataclasses import replace

    from labkit.workloads.corpus import BATCH6_FILE, BATCH6_NOT_IN_CI, _batch6, build_model, compat_cases, make_batch, tiny

    cases = _batch6()
    assert 30 <= len(cases) and {c.family for c in cases} == {"timm", "transformers", "torchvision", "handmade"}
    assert {c.precision for c in cases} == {"fp32", "amp-bf16", "bf16"}
    assert not {c.arch for c in cases} & {c.arch for c in CASES if c not in cases}
    assert 0.25 < sum(c.split == "held-out" for c in cases) / len(cases) < 0.42
    path = Path(__file__).resolve().parents[2] / "data/measurements/measure" / BATCH6_FILE
    rows = {r["name"]: r for r in load_measurement(path, kind="fake_predictions")["data"]["cases"]}
    assert sorted(rows) == sorted(c.name for c in cases)
    for c in cases:
        assert rows[c.name]["split"] == c.split and "refused" not in rows[c.name], rows[c.name]
        assert 4e9 < rows[c.name]["peak_allocated"] <= rows[c.name]["peak_reserved"] < 60e9    # realistic, fits one H200
    ci = compat_cases()             # by content: at CI size DistilBERT is COMPAT_EXTRA's, kept under that name
    assert {repr(replace(tiny(c), name="")) for c in cases if c.arch not in BATCH6_NOT_IN_CI} <= {
        repr(replace(c, name="")) for c in ci}
    shallower = {"resnet152": "resnet50", "efficientnet_b1": "efficientnet_b0", "convnext_base": "convnext_tiny",
                 "swin_s": "swin_t", "segmentation.deeplabv3_resnet101": "segmentation.deeplabv3_resnet50"}
    assert set(BATCH6_NOT_IN_CI) == set(shallower) and set(shallower.values()) <= {c.arch for c in ci}
    # a timm case is timm's model (pretrained=False: no download), and its CI size keeps its kind (EVA-02's head
    # asked for: its default has none)
    eva = tiny(next(c for c in cases if c.arch.startswith("eva02")))
    model = build_model(eva)
    assert type(model).__module__.startswith("timm.") and model.num_classes == 10 and len(model.blocks) == 2
    assert model(make_batch(eva)["pixel_values"]).shape == (2, 10)
